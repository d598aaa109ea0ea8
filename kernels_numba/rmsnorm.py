"""RMSNorm as in HF LlamaRMSNorm, all float32, and the residual add fused in front of it:

    rmsnorm:      y = w * (x * rsqrt(mean(x^2) + eps))        (w: weight_to_f32; this product order, as HF)
    add_rmsnorm:  h = x + residual,  y = rmsnorm(h)            (returns both: h is the next residual stream)

Launch layout: one block per row on the GPU (blocks stride over rows, so the simulator can run a grid
of SIMULATOR_BLOCKS); its threads stride over the row summing x^2, a shared-memory tree reduction
(power-of-two block) gives the row's sum, thread 0 turns it into the scale, then every thread writes its
strided share of the row. add_rmsnorm_kernel is the same body with the add in front: a thread's first pass
also writes its strided share of h = x + residual, and its second pass normalises that share of h.
Fused because the decode step runs residual_add then rmsnorm twice a layer: one launch instead of two.

`out_bits` (both launchers): the normed rows also rounded to bf16 (nearest even, uint16 bits) as they are written,
for a tensor-core projection that reads them next (the fast precision's q|k|v and gate|up): the same bits
gemm_tc's to_bf16_rows would make of `out`, without its launch and its re-read of out (6 bytes a value; this
copy costs 2). float32 `out` stays the stage output the debugger and the golden check read.
"""
import math

import numpy as np

from .bf16 import f32_to_bf16
from .common import SIMULATOR, cuda, jit, launch_stream, device_empty
from .weight_dtype import weight_to_f32, weights_ref

MAX_THREADS = 1024
# A simulated syncthreads waits for every thread of the block to be scheduled (~2.5 ms per thread per
# barrier) and each simulated block costs ~5 ms to set up, so the simulator gets tiny blocks (4 threads
# still run the tree reduction) and few of them.
# On a GPU 256 threads a row: a block walks its row in 2 trips of 4 loads a thread (hidden 2048) and beats 128 and
# 512 at 64-256 rows (scripts/sweep_row_kernels.py; measured: docs/bench-h200.md). The same block at every batch
# size, so a row's bits do not depend on its batch (batch invariance).
DEFAULT_THREADS = 1 if SIMULATOR else 256
SIMULATOR_BLOCKS = 2


@jit(device=True)
def row_scale(sum_of_squares, hidden, eps):
    """rsqrt(mean(x^2) + eps) from the row's float32 sum of squares."""
    mean_square = sum_of_squares / np.float32(hidden)
    # no libdevice rsqrt in the simulator; 1/sqrt in float32 differs from it by at most ~1 ulp
    return np.float32(np.float32(1.0) / np.float32(math.sqrt(mean_square + eps)))


def _row_norm_kernel(add_residual: bool, bf16_copy: bool = False):
    """The kernel both launchers use. `add_residual` and `bf16_copy` are closure constants, which numba compiles
    in as constants (the other branch is dropped): specialised kernels from one body, so the fused kernel
    does exactly rmsnorm's float32 operations in rmsnorm's reduction order. Without add_residual `residual` is
    unused and the launcher passes x as both `residual` and `h` (h is the array the second pass normalises);
    without bf16_copy `out_bits` is unused (the launcher passes out)."""

    @jit
    def kernel(x, residual, weight, eps, h, out, out_bits):
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        n_rows, hidden = x.shape
        partial = cuda.shared.array(MAX_THREADS, np.float32)
        scale = cuda.shared.array(1, np.float32)
        for row in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
            acc = np.float32(0.0)
            # Four columns at a time, all loads before any store (h may be x: the compiler cannot move a
            # load above a store to it), so a thread waits for memory once per four columns; the sum keeps
            # the one-column loop's order. The remainder column by column.
            col = tid
            while col + 3 * n_threads < hidden:
                c1, c2, c3 = col + n_threads, col + 2 * n_threads, col + 3 * n_threads
                v0, v1, v2, v3 = x[row, col], x[row, c1], x[row, c2], x[row, c3]
                if add_residual:
                    v0, v1 = v0 + residual[row, col], v1 + residual[row, c1]
                    v2, v3 = v2 + residual[row, c2], v3 + residual[row, c3]
                    h[row, col], h[row, c1], h[row, c2], h[row, c3] = v0, v1, v2, v3  # read back by this thread
                acc += v0 * v0
                acc += v1 * v1
                acc += v2 * v2
                acc += v3 * v3
                col += 4 * n_threads
            while col < hidden:
                if add_residual:
                    v = x[row, col] + residual[row, col]
                    h[row, col] = v  # read back below by this same thread: no barrier needed
                else:
                    v = x[row, col]
                acc += v * v
                col += n_threads
            partial[tid] = acc
            cuda.syncthreads()

            stride = n_threads // 2
            while stride > 0:
                if tid < stride:
                    partial[tid] += partial[tid + stride]
                cuda.syncthreads()
                stride //= 2

            if tid == 0:
                scale[0] = row_scale(partial[0], hidden, eps)
            cuda.syncthreads()

            s = scale[0]
            col = tid
            while col + 3 * n_threads < hidden:  # as above: loads first (out may be x or h)
                c1, c2, c3 = col + n_threads, col + 2 * n_threads, col + 3 * n_threads
                h0, h1, h2, h3 = h[row, col], h[row, c1], h[row, c2], h[row, c3]
                w0, w1 = weight_to_f32(weight[col]), weight_to_f32(weight[c1])
                w2, w3 = weight_to_f32(weight[c2]), weight_to_f32(weight[c3])
                y0, y1, y2, y3 = w0 * (h0 * s), w1 * (h1 * s), w2 * (h2 * s), w3 * (h3 * s)
                out[row, col], out[row, c1], out[row, c2], out[row, c3] = y0, y1, y2, y3
                if bf16_copy:
                    out_bits[row, col], out_bits[row, c1] = f32_to_bf16(y0), f32_to_bf16(y1)
                    out_bits[row, c2], out_bits[row, c3] = f32_to_bf16(y2), f32_to_bf16(y3)
                col += 4 * n_threads
            while col < hidden:
                y = weight_to_f32(weight[col]) * (h[row, col] * s)
                out[row, col] = y
                if bf16_copy:
                    out_bits[row, col] = f32_to_bf16(y)
                col += n_threads
            cuda.syncthreads()  # every thread has read scale[0] before the next row's thread 0 rewrites it

    return kernel


rmsnorm_kernel = _row_norm_kernel(add_residual=False)     # (x, x, weight, eps, x, out, out)
add_rmsnorm_kernel = _row_norm_kernel(add_residual=True)  # (x, residual, weight, eps, h, out, out)
rmsnorm_bf16_kernel = _row_norm_kernel(add_residual=False, bf16_copy=True)     # (..., out, out_bits)
add_rmsnorm_bf16_kernel = _row_norm_kernel(add_residual=True, bf16_copy=True)


def _check_out_bits(out_bits, shape):
    assert out_bits is None or (out_bits.shape == shape and out_bits.dtype == np.uint16), (
        f"out_bits must be uint16 {shape} (bf16 bits), got {out_bits.dtype} {out_bits.shape}")


def _check_threads(threads):
    threads = DEFAULT_THREADS if threads is None else threads
    assert 0 < threads <= MAX_THREADS and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    return threads


def _row_blocks(n_rows):
    return min(n_rows, SIMULATOR_BLOCKS) if SIMULATOR else n_rows


def rmsnorm(x, weight_bits, eps, out=None, threads=None, out_bits=None):
    """x float32 [T, H], weight_bits [H] (uint16 bf16 bits, or float32) -> float32 [T, H] (device arrays); out
    may be x. `out_bits` (uint16 [T, H]): also the output rounded to bf16 (the module's docstring)."""
    threads = _check_threads(threads)
    n_rows, hidden = x.shape
    assert weight_bits.shape == (hidden,), (weight_bits.shape, hidden)
    out = device_empty(x.shape, np.float32) if out is None else out
    assert out.shape == x.shape, (out.shape, x.shape)
    _check_out_bits(out_bits, x.shape)
    if n_rows:
        kernel = rmsnorm_kernel if out_bits is None else rmsnorm_bf16_kernel
        kernel[_row_blocks(n_rows), threads, launch_stream()](
            x, x, weight_bits, np.float32(eps), x, out, out if out_bits is None else out_bits)
    return out


def add_rmsnorm(x, residual, weight_bits, eps, out=None, h_out=None, threads=None, out_bits=None):
    """x, residual float32 [T, H], weight_bits [H] (uint16 bf16 bits, or float32) -> (h, y) float32 [T, H],
    h = x + residual, y = rmsnorm(h): bit-identical to residual_add then rmsnorm with the same threads.
    `out_bits` (uint16 [T, H]): also y rounded to bf16 (the module's docstring).

    x and residual are left as they are unless h_out or out is one of them (each element is read before
    it is written, so either may be).
    """
    threads = _check_threads(threads)
    n_rows, hidden = x.shape
    assert residual.shape == x.shape, (residual.shape, x.shape)
    assert weight_bits.shape == (hidden,), (weight_bits.shape, hidden)
    h = device_empty(x.shape, np.float32) if h_out is None else h_out
    out = device_empty(x.shape, np.float32) if out is None else out
    assert h.shape == x.shape and out.shape == x.shape, (h.shape, out.shape, x.shape)
    _check_out_bits(out_bits, x.shape)
    if n_rows:
        kernel = add_rmsnorm_kernel if out_bits is None else add_rmsnorm_bf16_kernel
        kernel[_row_blocks(n_rows), threads, launch_stream()](
            x, residual, weight_bits, np.float32(eps), h, out, out if out_bits is None else out_bits)
    return h, out


def rmsnorm_ref(x: np.ndarray, weight_bits: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    mean_square = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    scale = np.float32(1.0) / np.sqrt(mean_square + np.float32(eps))
    return weights_ref(weight_bits) * (x * scale)


def add_rmsnorm_ref(x: np.ndarray, residual: np.ndarray, weight_bits: np.ndarray, eps: float):
    h = x.astype(np.float32) + residual.astype(np.float32)
    return h, rmsnorm_ref(h, weight_bits, eps)
