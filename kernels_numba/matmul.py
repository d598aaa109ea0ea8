"""Linear layers: y = x @ W.T, with W stored as bf16 bits and everything accumulated in float32.

    out[t, n] = sum_k x[t, k] * bf16_to_f32(w_bits[n, k])       x f32 [T, K], w_bits u16 [N, K], out f32 [T, N]

Two kernels, one job each:
- `gemv` (decode, T <= MAX_GEMV_TOKENS): one thread per output feature n walks row n of W once and keeps T
  accumulators in registers, so every weight is read once for the whole batch. No shared memory, no
  syncthreads. Grid: grid_stride_launch(N, THREADS): one thread per n on the GPU, grid-stride over n so the
  simulator can run a small grid.
- `gemm` (prefill, many tokens): classic shared-memory tiling. A TILE x TILE block owns the output tile
  out[by*TILE : +TILE, bx*TILE : +TILE]; it walks K a tile at a time, each thread loading one x value and one
  decoded weight into shared memory, so each global value is read once per tile instead of TILE times.
`linear` picks between them.
"""
import numpy as np
import ml_dtypes

from .bf16 import bf16_to_f32
from .common import cuda, jit, cdiv, grid_stride_launch, SIMULATOR

MAX_GEMV_TOKENS = 8  # the per-thread accumulator count: registers, so a small compile-time constant
THREADS = 128
TILE = 16
TILE_PADDED = TILE + 1  # shared-array shapes must be compile-time constants: no arithmetic inside


@jit
def gemv_kernel(x, w_bits, out):
    num_tokens, in_features = x.shape
    acc = cuda.local.array(MAX_GEMV_TOKENS, np.float32)
    for n in range(cuda.grid(1), w_bits.shape[0], cuda.gridsize(1)):
        for t in range(num_tokens):
            acc[t] = np.float32(0.0)
        for k in range(in_features):
            w = bf16_to_f32(w_bits[n, k])
            for t in range(num_tokens):
                acc[t] += x[t, k] * w
        for t in range(num_tokens):
            out[t, n] = acc[t]


@jit
def gemm_kernel(x, w_bits, out):
    # One cuda.shared.array per line: the simulator aliases two allocations made on the same line.
    x_tile = cuda.shared.array((TILE, TILE), np.float32)
    w_tile = cuda.shared.array((TILE, TILE_PADDED), np.float32)  # +1 pad: w_tile[tx, i] reads hit distinct banks
    num_tokens, in_features = x.shape
    out_features = w_bits.shape[0]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    t = cuda.blockIdx.y * TILE + ty        # the output element this thread computes: out[t, n]
    n = cuda.blockIdx.x * TILE + tx
    w_row = cuda.blockIdx.x * TILE + ty    # the weight row this thread loads (loads are coalesced along k)
    acc = np.float32(0.0)
    for k0 in range(0, in_features, TILE):
        k = k0 + tx
        if t < num_tokens and k < in_features:
            x_tile[ty, tx] = x[t, k]
        else:
            x_tile[ty, tx] = np.float32(0.0)
        if w_row < out_features and k < in_features:
            w_tile[ty, tx] = bf16_to_f32(w_bits[w_row, k])
        else:
            w_tile[ty, tx] = np.float32(0.0)
        cuda.syncthreads()
        for i in range(TILE):
            acc += x_tile[ty, i] * w_tile[tx, i]
        cuda.syncthreads()  # nobody overwrites the tiles while others still read them
    if t < num_tokens and n < out_features:
        out[t, n] = acc


def _check_shapes(x, w_bits, out):
    assert x.ndim == 2 and w_bits.ndim == 2, (x.shape, w_bits.shape)
    assert x.shape[1] == w_bits.shape[1], f"in_features differ: x {x.shape}, w {w_bits.shape}"
    assert w_bits.dtype == np.uint16 and x.dtype == np.float32, (x.dtype, w_bits.dtype)
    out = cuda.device_array((x.shape[0], w_bits.shape[0]), np.float32) if out is None else out
    assert out.shape == (x.shape[0], w_bits.shape[0]) and out.dtype == np.float32, (out.shape, out.dtype)
    return out


def gemv(x, w_bits, out=None):
    """y = x @ W.T for T <= MAX_GEMV_TOKENS tokens: one thread per output feature, each weight read once."""
    out = _check_shapes(x, w_bits, out)
    assert x.shape[0] <= MAX_GEMV_TOKENS, f"gemv takes at most {MAX_GEMV_TOKENS} tokens, got {x.shape[0]}"
    if x.shape[0] > 0:
        blocks, threads = grid_stride_launch(w_bits.shape[0], THREADS)
        gemv_kernel[blocks, threads](x, w_bits, out)
    return out


def gemm(x, w_bits, out=None):
    """y = x @ W.T for any number of tokens: TILE x TILE output tiles built from shared-memory tiles."""
    out = _check_shapes(x, w_bits, out)
    if x.shape[0] > 0:
        grid = (cdiv(w_bits.shape[0], TILE), cdiv(x.shape[0], TILE))
        gemm_kernel[grid, (TILE, TILE)](x, w_bits, out)
    return out


def linear(x, w_bits, out=None):
    """y = x @ W.T: gemv for decode-sized batches; gemm for prefill on a GPU.

    In the simulator every syncthreads costs milliseconds per block, so there gemv runs over chunks of
    MAX_GEMV_TOKENS tokens instead (same result up to float32 summation order).
    """
    out = _check_shapes(x, w_bits, out)
    num_tokens = x.shape[0]
    if num_tokens <= MAX_GEMV_TOKENS:
        return gemv(x, w_bits, out)
    if not SIMULATOR:
        return gemm(x, w_bits, out)
    for start in range(0, num_tokens, MAX_GEMV_TOKENS):
        stop = min(start + MAX_GEMV_TOKENS, num_tokens)
        gemv(x[start:stop], w_bits, out[start:stop])
    return out


def linear_ref(x: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """numpy twin: decode W with ml_dtypes, accumulate in float64, round once to float32."""
    w = w_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return (x.astype(np.float64) @ w.T).astype(np.float32)
