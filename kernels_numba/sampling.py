"""Greedy sampling: the index of each row's largest logit, matching torch.argmax.

    out[b] = min { i : logits[b, i] = max_j logits[b, j] }     (a NaN counts as the maximum: first NaN wins)

Launch layout: one block per row; each thread scans a strided share of the row keeping its best
(value, index), then a shared-memory tree reduction (power-of-two block) merges the pairs.
"""
import math

import numpy as np

from .common import SIMULATOR, cuda, jit

MAX_THREADS = 1024
NO_INDEX = np.int32(2**31 - 1)  # loses every tie, so a thread that saw no element never wins
# A simulated syncthreads waits for every thread of the block to be scheduled (~2.5 ms per thread per
# barrier), so the simulator gets tiny blocks: 4 threads still run the tree reduction, 15x faster than 32.
DEFAULT_THREADS = 4 if SIMULATOR else 256


@jit(device=True)
def beats(value, index, best_value, best_index):
    """Does (value, index) win over (best_value, best_index)? NaN > everything; ties -> lower index."""
    if math.isnan(best_value):
        return math.isnan(value) and index < best_index
    if math.isnan(value):
        return True
    return value > best_value or (value == best_value and index < best_index)


@jit
def argmax_kernel(logits, out):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    best_values = cuda.shared.array(MAX_THREADS, np.float32)
    best_indices = cuda.shared.array(MAX_THREADS, np.int32)

    best_value = np.float32(-math.inf)
    best_index = NO_INDEX
    for col in range(tid, logits.shape[1], n_threads):
        v = logits[row, col]
        if beats(v, col, best_value, best_index):
            best_value = v
            best_index = col
    best_values[tid] = best_value
    best_indices[tid] = best_index
    cuda.syncthreads()

    stride = n_threads // 2
    while stride > 0:
        if tid < stride:
            other = tid + stride
            if beats(best_values[other], best_indices[other], best_values[tid], best_indices[tid]):
                best_values[tid] = best_values[other]
                best_indices[tid] = best_indices[other]
        cuda.syncthreads()
        stride //= 2

    if tid == 0:
        out[row] = best_indices[0]


def argmax(logits, out=None, threads=None):
    """logits float32 [B, V] -> int32 [B] (device arrays)."""
    threads = DEFAULT_THREADS if threads is None else threads
    assert 0 < threads <= MAX_THREADS and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    n_rows, vocab = logits.shape
    assert vocab > 0, "argmax of an empty row"
    out = cuda.device_array((n_rows,), np.int32) if out is None else out
    assert out.shape == (n_rows,), (out.shape, n_rows)
    if n_rows:
        argmax_kernel[n_rows, threads](logits, out)
    return out


def argmax_ref(logits: np.ndarray) -> np.ndarray:
    # np.argmax, like torch.argmax, returns the first maximum and treats NaN as the maximum.
    return np.argmax(logits, axis=-1).astype(np.int32)
