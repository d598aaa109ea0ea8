"""Log-probabilities from logits: each row's log-sum-exp, then any (row, token)'s log-probability.

    lse[r] = m_r + log(sum_j exp(logits[r, j] - m_r)),  m_r = max_j logits[r, j];   logprob(r, t) = logits[r, t] - lse[r]

Launch layout. `logsumexp`: one block per row; each thread scans a strided share of the row for its max,
a shared-memory tree reduction gives the row max m, then each thread sums exp(x - m) over its share (in
float64: 128k terms of float32 would lose ~5 digits of the small ones) and a second tree reduction adds the
partial sums. Subtracting m first keeps every exp in (0, 1], so nothing overflows. `gather_logprobs`: one
thread per (row, token) pair, grid-stride. A row holding NaN or +inf gives NaN, an all -inf row -inf.
"""
import math

import numpy as np

from .common import SIMULATOR, cuda, device_empty, grid_stride_launch, jit, launch_stream

MAX_THREADS = 1024
# A simulated barrier costs milliseconds: one thread per row there (the tests cover wider blocks too).
DEFAULT_THREADS = 1 if SIMULATOR else 256


@jit
def logsumexp_kernel(logits, out):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    partial_max = cuda.shared.array(MAX_THREADS, np.float32)
    partial_sum = cuda.shared.array(MAX_THREADS, np.float64)

    m = np.float32(-math.inf)
    for col in range(tid, logits.shape[1], n_threads):
        v = logits[row, col]
        if v > m or math.isnan(v):
            m = v
    partial_max[tid] = m
    cuda.syncthreads()
    stride = n_threads // 2
    while stride > 0:
        if tid < stride:
            other = partial_max[tid + stride]
            if other > partial_max[tid] or math.isnan(other):
                partial_max[tid] = other
        cuda.syncthreads()
        stride //= 2
    m = partial_max[0]

    total = 0.0
    if m > -math.inf:  # an all -inf row would make every term exp(-inf - -inf) = NaN
        for col in range(tid, logits.shape[1], n_threads):
            total += math.exp(np.float64(logits[row, col]) - np.float64(m))
    partial_sum[tid] = total
    cuda.syncthreads()
    stride = n_threads // 2
    while stride > 0:
        if tid < stride:
            partial_sum[tid] += partial_sum[tid + stride]
        cuda.syncthreads()
        stride //= 2

    if tid == 0:
        if m > -math.inf:
            out[row] = np.float32(np.float64(m) + math.log(partial_sum[0]))
        else:
            out[row] = m  # -inf, or NaN


@jit
def gather_logprobs_kernel(logits, lse, rows, token_ids, out):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        row = rows[i]
        token = token_ids[i]
        if 0 <= row < logits.shape[0] and 0 <= token < logits.shape[1]:
            out[i] = logits[row, token] - lse[row]
        else:
            out[i] = np.float32(math.nan)  # a bad index shows, instead of reading a neighbour


def logsumexp(logits, out=None, threads=None):
    """logits float32 [R, V] -> float32 [R] (device arrays)."""
    n_rows, vocab = logits.shape
    threads = DEFAULT_THREADS if threads is None else threads
    assert 0 < threads <= MAX_THREADS and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    assert vocab > 0, "log-sum-exp of an empty row"
    out = device_empty((n_rows,), np.float32) if out is None else out
    assert out.shape == (n_rows,), (out.shape, n_rows)
    if n_rows:
        logsumexp_kernel[n_rows, threads, launch_stream()](logits, out)
    return out


def gather_logprobs(logits, lse, rows, token_ids, out=None):
    """logits float32 [R, V], lse float32 [R], rows and token_ids int32 [N] -> float32 [N]:
    logits[rows[i], token_ids[i]] - lse[rows[i]] (device arrays)."""
    n = rows.shape[0]
    assert token_ids.shape == (n,), (token_ids.shape, n)
    out = device_empty((n,), np.float32) if out is None else out
    assert out.shape == (n,), (out.shape, n)
    if n:
        blocks, threads = grid_stride_launch(n)
        gather_logprobs_kernel[blocks, threads, launch_stream()](logits, lse, rows, token_ids, out)
    return out


def logsumexp_ref(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1)  # NaN if the row holds one
    with np.errstate(invalid="ignore", over="ignore"):
        lse = m + np.log(np.exp(x - m[..., None]).sum(axis=-1))
    return np.where(np.isneginf(m), -np.inf, lse).astype(np.float32)


def gather_logprobs_ref(logits: np.ndarray, lse: np.ndarray, rows: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    return (logits[rows, token_ids] - lse[rows]).astype(np.float32)
