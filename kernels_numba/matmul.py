"""Linear layers: y = x @ W.T, with W stored as bf16 bits and everything accumulated in float32.

    out[t, n] = sum_k x[t, k] * bf16_to_f32(w_bits[n, k])       x f32 [T, K], w_bits u16 [N, K], out f32 [T, N]

Three kernels, one job each:
- `gemv` (decode, T <= MAX_GEMV_TOKENS): one thread per output feature n walks row n of W once and keeps T
  accumulators in registers, so every weight is read once for the whole batch. No shared memory, no
  syncthreads. Grid: grid_stride_launch(N, THREADS): one thread per n on the GPU, grid-stride over n so the
  simulator can run a small grid. The readable version; slow on a GPU because neighbouring threads read
  addresses K*2 bytes apart, so every load instruction of a warp touches 32 different memory segments.
- `gemv_coalesced` (decode, same math): the threads of a block share the rows instead of owning one each.
  A block owns COALESCED_ROWS rows; its threads split K, thread i reading the uint32 words (bf16 pairs)
  i, i + threads, ... of each row, so a warp's 32 loads are 128 contiguous bytes: every byte a memory
  transaction fetches is used. Each thread keeps its partial sums in registers, then a shared-memory tree
  reduction adds the block's partials. Faster because it is coalesced and keeps many loads in flight (rows
  x COALESCED_UNROLL per thread, a whole block per row pair), which is what a bandwidth-bound kernel needs.
  Grid: one block per row pair on the GPU; blocks grid-stride over row pairs so the simulator runs two.
- `gemm` (prefill, many tokens): classic shared-memory tiling. A TILE x TILE block owns the output tile
  out[by*TILE : +TILE, bx*TILE : +TILE]; it walks K a tile at a time, each thread loading one x value and one
  decoded weight into shared memory, so each global value is read once per tile instead of TILE times.
`linear` picks between them.
"""
import functools

import numpy as np
import ml_dtypes

from .bf16 import bf16_to_f32
from .common import (cuda, jit, cdiv, grid_stride_launch, SIMULATOR, SIMULATOR_GRID, launch_stream,
                     device_empty)

MAX_GEMV_TOKENS = 8  # the per-thread accumulator count: registers, so a small compile-time constant
THREADS = 128
TILE = 16
TILE_PADDED = TILE + 1  # shared-array shapes must be compile-time constants: no arithmetic inside

# gemv_coalesced: each thread issues COALESCED_ROWS * COALESCED_UNROLL weight loads before using any.
# A bandwidth-bound kernel needs ~latency x bandwidth bytes in flight (H200: ~0.7 us x 4.3 TB/s ~ 3 MB,
# ~23 KB per SM). ptxas (sm_90) gives this kernel 64 registers at T=1, 72 at T=8, so an SM holds 32 (28)
# warps: 32 warps x 8 loads x 128 B = 32 KB. Two rows per block keep N = 2048 (q, o, down in Llama-1B) at
# 1024 blocks, one wave over 132 SMs; four rows would need 96+ registers at T=8 and halve the blocks.
COALESCED_ROWS = 2
COALESCED_UNROLL = 4
# 4 warps per block: a 7-level tree reduction. A simulated syncthreads costs ~2.5 ms per thread of the
# block, so the simulator gets 4-thread blocks: the same index math and tree reduction, only narrower.
COALESCED_THREADS = 4 if SIMULATOR else 128


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


@functools.cache
def gemv_coalesced_kernel(num_tokens: int, threads: int):
    """The kernel for one (token count, block size): both are compile-time constants inside it, so the
    accumulators and loaded words are registers (fully unrolled loops) and the shared array has a fixed shape."""

    @jit
    def kernel(x, w_words, out):
        partial = cuda.shared.array((COALESCED_ROWS, num_tokens, threads), np.float32)
        acc = cuda.local.array((COALESCED_ROWS, num_tokens), np.float32)
        words = cuda.local.array((COALESCED_UNROLL, COALESCED_ROWS), np.uint32)
        tid = cuda.threadIdx.x
        out_features, words_per_row = w_words.shape
        step = threads * COALESCED_UNROLL
        for row0 in range(cuda.blockIdx.x * COALESCED_ROWS, out_features, cuda.gridDim.x * COALESCED_ROWS):
            for r in range(COALESCED_ROWS):
                for t in range(num_tokens):
                    acc[r, t] = np.float32(0.0)
            for first_word in range(tid, words_per_row, step):
                # Issue every load of this step before using any. Out-of-range rows and words are clamped
                # to valid addresses (no branch around the loads) and their values are never used.
                for u in range(COALESCED_UNROLL):
                    word = min(first_word + u * threads, words_per_row - 1)
                    for r in range(COALESCED_ROWS):
                        words[u, r] = w_words[min(row0 + r, out_features - 1), word]
                for u in range(COALESCED_UNROLL):
                    word = first_word + u * threads
                    if word < words_per_row:
                        for t in range(num_tokens):
                            x_even = x[t, 2 * word]
                            x_odd = x[t, 2 * word + 1]
                            for r in range(COALESCED_ROWS):
                                pair = words[u, r]  # little-endian: the low half is the even element
                                acc[r, t] += (x_even * bf16_to_f32(pair & np.uint32(0xFFFF))
                                              + x_odd * bf16_to_f32(pair >> np.uint32(16)))
            for r in range(COALESCED_ROWS):
                for t in range(num_tokens):
                    partial[r, t, tid] = acc[r, t]
            cuda.syncthreads()
            stride = threads // 2
            while stride > 0:
                if tid < stride:
                    for r in range(COALESCED_ROWS):
                        for t in range(num_tokens):
                            partial[r, t, tid] += partial[r, t, tid + stride]
                cuda.syncthreads()
                stride //= 2
            for i in range(tid, COALESCED_ROWS * num_tokens, threads):
                r = i // num_tokens
                t = i - r * num_tokens
                if row0 + r < out_features:
                    out[t, row0 + r] = partial[r, t, 0]
            cuda.syncthreads()  # the next row pair overwrites `partial` only after these reads

    return kernel


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
    out = device_empty((x.shape[0], w_bits.shape[0]), np.float32) if out is None else out
    assert out.shape == (x.shape[0], w_bits.shape[0]) and out.dtype == np.float32, (out.shape, out.dtype)
    return out


def gemv(x, w_bits, out=None):
    """y = x @ W.T for T <= MAX_GEMV_TOKENS tokens: one thread per output feature, each weight read once."""
    out = _check_shapes(x, w_bits, out)
    assert x.shape[0] <= MAX_GEMV_TOKENS, f"gemv takes at most {MAX_GEMV_TOKENS} tokens, got {x.shape[0]}"
    if x.shape[0] > 0:
        blocks, threads = grid_stride_launch(w_bits.shape[0], THREADS)
        gemv_kernel[blocks, threads, launch_stream()](x, w_bits, out)
    return out


def gemv_coalesced(x, w_bits, out=None, threads=None):
    """gemv with coalesced weight reads: a block of `threads` (power of two) splits each of its
    COALESCED_ROWS rows along K, a warp reading 32 consecutive bf16 pairs (128 bytes) per load instruction.
    in_features must be even (rows are read as uint32 words) and w_bits C-contiguous (a uint32 view)."""
    out = _check_shapes(x, w_bits, out)
    num_tokens, in_features = x.shape
    out_features = w_bits.shape[0]
    assert num_tokens <= MAX_GEMV_TOKENS, f"gemv takes at most {MAX_GEMV_TOKENS} tokens, got {num_tokens}"
    assert in_features % 2 == 0, f"gemv_coalesced reads bf16 pairs: in_features must be even, got {in_features}"
    threads = COALESCED_THREADS if threads is None else threads
    assert 0 < threads <= 1024 and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    if num_tokens > 0 and out_features > 0:
        row_pairs = cdiv(out_features, COALESCED_ROWS)
        blocks = min(row_pairs, SIMULATOR_GRID[0]) if SIMULATOR else row_pairs
        w_words = w_bits.view(np.uint32)
        gemv_coalesced_kernel(num_tokens, threads)[blocks, threads, launch_stream()](x, w_words, out)
    return out


def gemm(x, w_bits, out=None):
    """y = x @ W.T for any number of tokens: TILE x TILE output tiles built from shared-memory tiles."""
    out = _check_shapes(x, w_bits, out)
    if x.shape[0] > 0:
        grid = (cdiv(w_bits.shape[0], TILE), cdiv(x.shape[0], TILE))
        gemm_kernel[grid, (TILE, TILE), launch_stream()](x, w_bits, out)
    return out


def linear_kernel_name(num_tokens: int, in_features: int) -> str:
    """Which kernel `linear` runs for this shape (the debugger and the stepping API show it).

    On a GPU: gemv_coalesced for decode-sized batches (gemv if in_features is odd), gemm for prefill.
    In the simulator every syncthreads costs milliseconds per block, so there the syncthreads-free gemv
    does everything: decode batches directly, prefill in chunks of MAX_GEMV_TOKENS tokens (same result up
    to float32 summation order).
    """
    if SIMULATOR:
        return "gemv"
    if num_tokens <= MAX_GEMV_TOKENS:
        return "gemv_coalesced" if in_features % 2 == 0 else "gemv"
    return "gemm"


def linear(x, w_bits, out=None):
    """y = x @ W.T with the kernel `linear_kernel_name` picks for the shape."""
    out = _check_shapes(x, w_bits, out)
    num_tokens = x.shape[0]
    kernel = linear_kernel_name(num_tokens, x.shape[1])
    if kernel == "gemv_coalesced":
        return gemv_coalesced(x, w_bits, out)
    if kernel == "gemm":
        return gemm(x, w_bits, out)
    if num_tokens <= MAX_GEMV_TOKENS:
        return gemv(x, w_bits, out)
    for start in range(0, num_tokens, MAX_GEMV_TOKENS):  # the simulator's prefill
        stop = min(start + MAX_GEMV_TOKENS, num_tokens)
        gemv(x[start:stop], w_bits, out[start:stop])
    return out


def linear_ref(x: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """numpy twin: decode W with ml_dtypes, accumulate in float64, round once to float32."""
    w = w_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return (x.astype(np.float64) @ w.T).astype(np.float32)
