"""RMSNorm as in HF LlamaRMSNorm, all float32:

    y = w * (x * rsqrt(mean(x^2) + eps))        (w decoded from bf16; this product order, as HF)

Launch layout: one block per row on the GPU (blocks stride over rows, so the simulator can run a grid
of SIMULATOR_BLOCKS); its threads stride over the row summing x^2, a shared-memory tree reduction
(power-of-two block) gives the row's sum, thread 0 turns it into the scale, then every thread writes its
strided share of the row.
"""
import math

import numpy as np

from .bf16 import bf16_to_f32, bf16_to_f32_ref
from .common import SIMULATOR, cuda, jit, launch_stream, device_empty

MAX_THREADS = 1024
# A simulated syncthreads waits for every thread of the block to be scheduled (~2.5 ms per thread per
# barrier) and each simulated block costs ~5 ms to set up, so the simulator gets tiny blocks (4 threads
# still run the tree reduction) and few of them.
DEFAULT_THREADS = 4 if SIMULATOR else 128
SIMULATOR_BLOCKS = 2


@jit
def rmsnorm_kernel(x, weight, eps, out):
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    n_rows, hidden = x.shape
    partial = cuda.shared.array(MAX_THREADS, np.float32)
    scale = cuda.shared.array(1, np.float32)
    for row in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
        acc = np.float32(0.0)
        for col in range(tid, hidden, n_threads):
            v = x[row, col]
            acc += v * v
        partial[tid] = acc
        cuda.syncthreads()

        stride = n_threads // 2
        while stride > 0:
            if tid < stride:
                partial[tid] += partial[tid + stride]
            cuda.syncthreads()
            stride //= 2

        if tid == 0:
            mean_square = partial[0] / np.float32(hidden)
            # no libdevice rsqrt in the simulator; 1/sqrt in float32 differs from it by at most ~1 ulp
            scale[0] = np.float32(np.float32(1.0) / np.float32(math.sqrt(mean_square + eps)))
        cuda.syncthreads()

        s = scale[0]
        for col in range(tid, hidden, n_threads):
            out[row, col] = bf16_to_f32(weight[col]) * (x[row, col] * s)
        cuda.syncthreads()  # every thread has read scale[0] before the next row's thread 0 rewrites it


def rmsnorm(x, weight_bits, eps, out=None, threads=None):
    """x float32 [T, H], weight_bits uint16 bf16 [H] -> float32 [T, H] (device arrays); out may be x."""
    threads = DEFAULT_THREADS if threads is None else threads
    assert 0 < threads <= MAX_THREADS and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    n_rows, hidden = x.shape
    assert weight_bits.shape == (hidden,), (weight_bits.shape, hidden)
    out = device_empty(x.shape, np.float32) if out is None else out
    assert out.shape == x.shape, (out.shape, x.shape)
    if n_rows:
        blocks = min(n_rows, SIMULATOR_BLOCKS) if SIMULATOR else n_rows
        rmsnorm_kernel[blocks, threads, launch_stream()](x, weight_bits, np.float32(eps), out)
    return out


def rmsnorm_ref(x: np.ndarray, weight_bits: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    mean_square = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    scale = np.float32(1.0) / np.sqrt(mean_square + np.float32(eps))
    return bf16_to_f32_ref(weight_bits) * (x * scale)
