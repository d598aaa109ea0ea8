"""Linear layers: y = x @ W.T, with W stored as bf16 bits (or float32) and everything accumulated in float32.

    out[t, n] = sum_k x[t, k] * weight_to_f32(w_bits[n, k])     x f32 [T, K], w_bits u16 or f32 [N, K], out f32 [T, N]

Four kernels, one job each:
- `gemv` (decode, T <= MAX_GEMV_TOKENS): one thread per GEMV_ROWS output features walks those rows of W
  once and keeps rows x T accumulators in registers, so every weight is read once for the whole batch and
  each x value read feeds GEMV_ROWS multiply-adds. No shared memory, no syncthreads. Grid:
  grid_stride_launch over row groups: one thread per group on the GPU, grid-stride so the simulator can run
  a small grid. The readable version; slow on a GPU because neighbouring threads read addresses
  GEMV_ROWS*K*2 bytes apart, so every load instruction of a warp touches 32 different memory segments.
- `gemv_coalesced` (decode, same math): the threads of a block share the rows instead of owning one each.
  A block owns COALESCED_ROWS rows; its threads split K, thread i reading the uint64 words (4 bf16)
  i, i + threads, ... of each row, so a warp's 32 loads are 256 contiguous bytes: every byte a memory
  transaction fetches is used. Each thread keeps its partial sums in registers, then the block adds them:
  on a GPU each warp by register shuffles and the epilogue over the warps' sums (one syncthreads), in the
  simulator (no shuffles) by a shared-memory tree (WARP_REDUCE). Faster because it is coalesced and keeps
  many loads in flight (rows x unroll wide loads per thread), which is what a bandwidth-bound kernel needs.
  Grid: one block per row group on the GPU; blocks grid-stride over row groups so the simulator runs two.
  `gemv_fused` fuses the decode layer's neighbours into it, given as objects (epilogues.py): an
  RMSNormPrologue in front, and behind a SwiGLUEpilogue (gate|up), a RopeKVEpilogue (q|k|v: RoPE and the K/V
  pool write) or a ResidualEpilogue (the residual add).
- `gemm` (prefill, many tokens): classic shared-memory tiling. A TILE x TILE block owns the output tile
  out[by*TILE : +TILE, bx*TILE : +TILE]; it walks K a tile at a time, each thread loading one x value and one
  decoded weight into shared memory, so each global value is read once per tile instead of TILE times.
  The readable version: each thread computes one output, two shared-memory reads per FMA.
- `gemm_blocked` (prefill, same math): register blocking. A block of 16 x 8 threads owns a 64-token x
  64-feature output tile and walks K 16 at a time through k-major shared tiles of x and decoded W; a thread
  owns an 8 x 4 micro-tile, kept in 32 register accumulators. Faster because each shared value a thread
  reads feeds 4 or 8 FMAs, read as 128-bit words (3 shared loads per 32 FMAs instead of 2 loads per FMA),
  each global value is read once per 64 outputs instead of 16, and the shared reads are broadcasts or
  consecutive words. Grid: (cdiv(N, 64), cdiv(T, 64), splits) blocks, features along x; when the output
  tiles alone are too few to fill the GPU, K is cut into `splits` slices whose partial products
  `sum_splits_kernel` adds in a fixed order (split-K; the result does not depend on timing).
`linear` picks between them (`linear_kernel` says which).
"""
import functools
import os
from typing import Callable

import numpy as np

from .bf16 import bf16_to_f32
from .activation import silu
from .rmsnorm import row_scale
from .rope import store_qkv_pair
from .common import (cuda, jit, cdiv, grid_stride_launch, SIMULATOR, SIMULATOR_GRID, SHARED_ALIGN, SHARED_ROW_PAD,
                     launch_stream, device_empty)
from .epilogues import (FusedOutputs, RMSNormPrologue, ResidualEpilogue, RopeKVEpilogue, SwiGLUEpilogue, fused_outputs,
                        pairs_rows)
from .weight_dtype import f32_from_bits, weight_bits, weight_to_f32, weights_ref

# gemv keeps T x GEMV_ROWS accumulators per thread: registers on a GPU, so a small compile-time constant;
# the simulator has no registers to spare, and every extra pass over W re-decodes each weight in Python.
MAX_GEMV_TOKENS = 32 if SIMULATOR else 8
GEMV_ROWS = 4        # rows one gemv thread owns: each x value it reads feeds GEMV_ROWS multiply-adds
# gemv_coalesced walks more tokens a few at a time, its rows coming back from L2 (~3 TFLOP/s past 16 tokens);
# gemm_blocked (128-bit shared reads, split-K on down_proj) passes it from ~32 tokens (scripts/crossover_linear.py;
# measured: docs/bench-h200.md). TINYVLLM_MAX_COALESCED_TOKENS overrides it.
MAX_COALESCED_TOKENS = int(os.environ.get("TINYVLLM_MAX_COALESCED_TOKENS", 32))
THREADS = 128
TILE = 16
TILE_PADDED = TILE + 1  # shared-array shapes must be compile-time constants: no arithmetic inside

# gemv_coalesced: each thread issues rows x unroll weight loads of 4 bf16 (8 bytes) before using any.
# A bandwidth-bound kernel needs ~latency x bandwidth bytes in flight (~0.7 us x 4.3 TB/s ~ 3 MB on a
# 132-SM GPU, ~23 KB per SM). The shapes below were chosen by scripts/sweep_gemv.py, timing launches inside a
# CUDA graph with the weights read from HBM (measured: docs/bench-h200.md); ptxas (sm_90): 72 registers at 1
# token, 106 at 2.
# - 1-2 tokens: COALESCED_ROWS rows x COALESCED_UNROLL loads in flight per row (2 beat 4 on every decode shape;
#   the LM head reads near cuBLAS's bandwidth with either). Narrow outputs want wider blocks (fewer blocks, more
#   threads splitting each row): coalesced_threads picks the block size from the row-group count, the widest of
#   64, 128, 256 threads that keeps the grid within COALESCED_GRID_THREADS threads.
# - Past 2 tokens the kernel is bound by instructions, not bytes: each x value loaded feeds one FMA per row of the
#   block and each weight word 4 per token. Passes of COALESCED_PASS_TOKENS = 4 tokens over
#   COALESCED_ROWS_MANY_TOKENS = 8 rows (1 load in flight) give 8 FMAs per x load and 16 per weight word in 96
#   registers.
# - The norm-fused launches (more work per weight word: the sum of squares and the gains) want more rows a block:
#   NORM_THREADS x NORM_ROWS, 1 load in flight per row with SwiGLU behind, 2 with RoPE; the residual-fused ones
#   keep the plain kernel's shape.
COALESCED_ROWS = 4
COALESCED_UNROLL = 2
NORM_THREADS = 4 if SIMULATOR else 128
NORM_ROWS = 8
NORM_UNROLL = 2
NORM_UNROLL_SWIGLU = 1
COALESCED_GRID_THREADS = 128 * 1024
COALESCED_PASS_TOKENS = 4          # tokens per pass once there are more than 2
COALESCED_ROWS_MANY_TOKENS = 8
COALESCED_UNROLL_MANY_TOKENS = 1
COALESCED_WORD_ELEMENTS = 4       # bf16 per load (uint64 words); 2 (uint32) when in_features is not a multiple
#                                   (float32 weights: 2 per uint64 word, or 1 per uint32 word)
# 2 warps per block past 2 tokens: a 6-level tree reduction. A simulated syncthreads costs ~2.5 ms per thread
# of the block, so the simulator gets 4-thread blocks: the same index math and tree reduction, only narrower.
COALESCED_THREADS = 4 if SIMULATOR else 64
# gemv_coalesced's reduction of its threads' partial sums. On a GPU each warp adds its 32 lanes' partials with
# register shuffles (5 steps, no barrier), lane 0 stores the warp's sums, and after one syncthreads the epilogue
# adds the threads / 32 warp sums: one barrier instead of the shared-memory tree's log2(threads) + 1 (7 at
# 64 threads, 9 at 256), each of which waits for the block's slowest warp. The simulator has no warp shuffles,
# so it runs the tree (WARP_REDUCE is a compile-time constant: the other branch is compiled out); the GPU
# tests (TINYVLLM_TEST_GPU=1) cover the shuffles. The launchers' warp_reduce= picks either on a GPU, for
# scripts/sweep_gemv.py to time both; TINYVLLM_WARP_REDUCE=0 makes the tree the default (a whole decode step,
# scripts/profile_decode.py, either way). Passes of more than 2 tokens keep the tree: shuffling their 8 rows x 4
# tokens of sums one by one would take ptxas (sm_90) from 96 registers to 144 (7 blocks an SM instead of 10).
WARP_REDUCE = not SIMULATOR and os.environ.get("TINYVLLM_WARP_REDUCE", "1") != "0"
WARP_REDUCE_MAX_CHUNK = 2
WARP_SIZE = 32
FULL_WARP = 0xFFFFFFFF

# gemm_blocked: a block owns a BLOCK_TOKENS x BLOCK_FEATURES (64 x 64) output tile, a thread a THREAD_TOKENS x
# THREAD_FEATURES (8 x 4) micro-tile of it: 16 x 8 = 128 threads, 32 float32 accumulators each. Per step
# of k a thread reads 8 + 4 contiguous values from shared memory as three 128-bit loads for 32 FMAs (the
# simple gemm: 2 reads per FMA). gemm_blocked_kernel(8, 8) (64 x 128 tiles, 64 FMAs per 4 loads) is there
# for scripts/crossover_linear.py to compare: ptxas gives it 168 registers against 8 x 4's 125, and it is
# slower. 64 x 64 tiles keep a short prompt's grid wide (T = 512, N = 2048: 256 blocks for 132 SMs).
# BLOCK_K = 16: a warp loads 16 consecutive k of 2 rows (64 B of x, 32 B of W per row: whole 32-byte
# sectors); BLOCK_K = 32 would take ptxas (sm_90) to 168 registers. 125 registers (no spills): 4 blocks,
# 16 warps per SM.
# Shared memory: 2 x 16 x 68 x 4 B = 8.7 KB per block.
BLOCK_TOKENS = 64
BLOCK_FEATURES = 64
BLOCK_K = 16
THREAD_TOKENS = 8
THREAD_FEATURES = 4
BLOCKED_THREADS_X = BLOCK_FEATURES // THREAD_FEATURES  # 16: threadIdx.x walks features
BLOCKED_THREADS_Y = BLOCK_TOKENS // THREAD_TOKENS      # 8: threadIdx.y walks tokens
LOAD_ROW_STEP = BLOCKED_THREADS_X * BLOCKED_THREADS_Y // BLOCK_K  # 8: tile rows the block loads at once
# A warp stores 16 k x 2 rows into a k-major tile: a row stride of 64 + SHARED_ROW_PAD = 68 words puts (k, row)
# in bank (4 k + row) % 32, 2-way conflicts at worst, and keeps every row 16-byte aligned for the vector reads.
# Split-K: below SPLIT_TARGET_BLOCKS output tiles (3 blocks per SM of a 132-SM GPU) gemm_blocked cuts K into
# slices of at least MIN_SPLIT_K, so narrow outputs fill the GPU: a batch-256 decode graph's q|k|v, o_proj and
# down_proj run faster split (measured: docs/bench-h200.md). (scripts/crossover_linear.py times eager launches, so
# there the extra sum launch's host cost makes the K = 2048 splits look slower than they are in a graph.)
SPLIT_TARGET_BLOCKS = 3 * 132
MIN_SPLIT_K = 256
assert BLOCK_TOKENS % LOAD_ROW_STEP == 0 and BLOCK_FEATURES % LOAD_ROW_STEP == 0


@jit
def gemv_kernel(x, w_bits, out):
    num_tokens, in_features = x.shape
    out_features = w_bits.shape[0]
    acc = cuda.local.array((GEMV_ROWS, MAX_GEMV_TOKENS), np.float32)
    x_k = cuda.local.array(MAX_GEMV_TOKENS, np.float32)
    for n0 in range(cuda.grid(1) * GEMV_ROWS, out_features, cuda.gridsize(1) * GEMV_ROWS):
        rows = min(GEMV_ROWS, out_features - n0)
        for r in range(rows):
            for t in range(num_tokens):
                acc[r, t] = np.float32(0.0)
        for k in range(in_features):
            for t in range(num_tokens):  # x[:, k] once, for all of this thread's rows
                x_k[t] = x[t, k]
            for r in range(rows):
                w = weight_to_f32(w_bits[n0 + r, k])
                for t in range(num_tokens):
                    acc[r, t] += x_k[t] * w
        for r in range(rows):
            for t in range(num_tokens):
                out[t, n0 + r] = acc[r, t]


@jit(device=True)
def _block_total(partial, r, t, count):
    """partial[r, t, 0] + ... + partial[r, t, count - 1], in that order: a block's reduced sum for row r,
    token t (count 1 after the tree, the number of warps after the warp shuffles)."""
    total = partial[r, t, 0]
    for w in range(1, count):
        total += partial[r, t, w]
    return total


@functools.cache
def gemv_coalesced_kernel(chunk: int, threads: int, rows: int, unroll: int, word_elements: int,
                          norm: bool = False, residual: bool = False, swiglu: bool = False,
                          rope_head_dim: int = 0, warp_reduce: bool = WARP_REDUCE, element_bits: int = 16):
    """The kernel for one (tokens per pass, block size, rows per block, loads per row in flight, bf16 per
    load): all compile-time constants inside it, so the accumulators and loaded words are registers (fully
    unrolled loops) and the shared array has a fixed shape. A word holds word_elements weights of element_bits
    bits each (16: bf16 bits, 32: float32), uint32 or uint64 words: bf16 pairs or quads, one or two float32. More tokens than `chunk` are walked `chunk` at a time by the same block, so its
    rows come back from L2, not HBM, for every pass after the first.

    Reduction (`warp_reduce`, see WARP_REDUCE): each warp adds its lanes' partial sums with shuffles, lane 0
    stores them, one syncthreads, and the epilogue adds the threads / 32 warp sums in warp order; or (the
    simulator, which has no shuffles: the GPU tests, TINYVLLM_TEST_GPU=1, cover the shuffles) a shared-memory
    tree, one syncthreads per level. Both orders are fixed, so results do not depend on timing.

    `norm` (RMSNorm in front): x is the residual stream h, and the kernel computes rmsnorm(h) @ W.T as
    rsqrt(mean(h^2) + eps) * (h * g) @ W.T: the threads already read every h of a token between them, so they
    also sum h^2, the block reduces it beside the dot products, and the scale multiplies the reduced dots.
    The blocks also write normed = g * (h * scale) between them (the stage output). `residual` (residual add
    behind): besides out, residual_out = out + residual. `swiglu` (the MLP's gate behind): W is [Wg; Wu]
    stacked ([2 I, K]) and out [T, I] = silu(x Wg) * (x Wu); a block's first rows / 2 rows are gate rows
    and the rest the matching up rows, so each output's pair of dot products meets in one block.
    `rope_head_dim` (RoPE and the K/V write behind q|k|v, see rope.rope_qkv): W is [Wq; Wk; Wv] and its
    outputs are rope_qkv's pairs (head h, dim d < head_dim / 2) with rows h head_dim + d and + head_dim / 2;
    a block's first rows / 2 rows are first halves and the rest the matching second halves, so both values of
    a pair meet in one block, which rotates q and k pairs (v pairs stay as they are) and stores them into
    q, k, v and k, v at each token's pool slot (rope_operands; `out` is not written)."""
    word_bits = word_elements * element_bits
    assert element_bits in (16, 32) and word_bits in (32, 64), (word_elements, element_bits)
    word_type = np.uint32 if word_bits == 32 else np.uint64
    decode = bf16_to_f32 if element_bits == 16 else f32_from_bits  # a weight from its bits
    element_mask = (1 << element_bits) - 1
    rope = rope_head_dim > 0
    paired = swiglu or rope  # an output is a pair of dot products: block rows r and r + rows / 2
    assert (rows % 2 == 0 or not paired) and not (rope and (swiglu or residual))
    assert not (warp_reduce and SIMULATOR), "the simulator has no warp shuffles: it runs the tree"
    assert threads & (threads - 1) == 0 and rope_head_dim % 2 == 0, (threads, rope_head_dim)
    sums = rows + 1 if norm else rows  # the block reduces rows dot products (and h^2 with norm) per token
    half = rows // 2
    outputs = half if paired else rows  # outputs per block
    rope_half = rope_head_dim // 2
    lanes = min(threads, WARP_SIZE)   # a block narrower than a warp shuffles among its own lanes
    warps = threads // lanes
    lane_mask = FULL_WARP if lanes == WARP_SIZE else (1 << lanes) - 1
    shuffle_steps = lanes.bit_length() - 1  # log2(lanes)
    slots = warps if warp_reduce else threads  # partial sums per (row, token) in shared memory
    totals = warps if warp_reduce else 1       # of which the epilogue adds the first `totals`

    @jit
    def kernel(x, w_words, out, norm_words, eps, normed, residual_in, residual_out, rope_operands):
        partial = cuda.shared.array((sums, chunk, slots), np.float32)
        acc = cuda.local.array((sums, chunk), np.float32)
        words = cuda.local.array((unroll, rows), word_type)
        weight_row = cuda.local.array(rows, np.int64)
        tid = cuda.threadIdx.x
        num_tokens, in_features = x.shape
        weight_rows, words_per_row = w_words.shape
        out_features = weight_rows // 2 if paired else weight_rows
        step = threads * unroll
        for row0 in range(cuda.blockIdx.x * outputs, out_features, cuda.gridDim.x * outputs):
            # This block's weight rows. Past the last output they are clamped to valid addresses (no branch
            # around the loads); their sums are never stored.
            for r in range(rows):
                output = min(row0 + r % outputs, out_features - 1)
                if swiglu:  # gate row, or the up row I further down
                    weight_row[r] = (r // half) * out_features + output
                elif rope:  # first half of pair `output`, or its second half
                    weight_row[r] = (output // rope_half) * rope_head_dim + output % rope_half + (r // half) * rope_half
                else:
                    weight_row[r] = output
            for t0 in range(0, num_tokens, chunk):
                for r in range(sums):
                    for t in range(chunk):
                        acc[r, t] = np.float32(0.0)
                for first_word in range(tid, words_per_row, step):
                    # Issue every load of this step before using any. Out-of-range words and tokens are clamped
                    # like the rows.
                    for u in range(unroll):
                        word = min(first_word + u * threads, words_per_row - 1)
                        for r in range(rows):
                            words[u, r] = w_words[weight_row[r], word]
                    for u in range(unroll):
                        word = first_word + u * threads
                        if word < words_per_row:
                            if norm:
                                gains = norm_words[word]
                            for t in range(chunk):
                                token = min(t0 + t, num_tokens - 1)
                                for e in range(word_elements):  # little-endian: the low bits come first
                                    x_e = x[token, word_elements * word + e]
                                    if norm:
                                        acc[rows, t] += x_e * x_e
                                        gain_bits = (gains >> word_type(element_bits * e)) & word_type(element_mask)
                                        x_e = x_e * decode(np.uint32(gain_bits))
                                    for r in range(rows):
                                        bits = (words[u, r] >> word_type(element_bits * e)) & word_type(element_mask)
                                        acc[r, t] += x_e * decode(np.uint32(bits))
                if warp_reduce:  # lane 0 ends with its warp's sums: lanes 0 + 16, then 0 + 8, ..., then 0 + 1
                    for r in range(sums):
                        for t in range(chunk):
                            for s in range(shuffle_steps):
                                acc[r, t] += cuda.shfl_down_sync(lane_mask, acc[r, t], lanes >> (s + 1))
                    if tid % lanes == 0:
                        for r in range(sums):
                            for t in range(chunk):
                                partial[r, t, tid // lanes] = acc[r, t]
                    cuda.syncthreads()
                else:
                    for r in range(sums):
                        for t in range(chunk):
                            partial[r, t, tid] = acc[r, t]
                    cuda.syncthreads()
                    stride = threads // 2
                    while stride > 0:
                        if tid < stride:
                            for r in range(sums):
                                for t in range(chunk):
                                    partial[r, t, tid] += partial[r, t, tid + stride]
                        cuda.syncthreads()
                        stride //= 2
                for i in range(tid, outputs * chunk, threads):
                    r = i // chunk
                    t = i - r * chunk
                    if row0 + r < out_features and t0 + t < num_tokens:
                        value = _block_total(partial, r, t, totals)
                        # the up row (swiglu) or the pair's second half (rope)
                        second = _block_total(partial, r + half, t, totals) if paired else value
                        if norm:
                            scale = row_scale(_block_total(partial, rows, t, totals), in_features, eps)
                            value *= scale
                            second *= scale
                        if swiglu:
                            value = silu(value) * second
                        if rope:
                            _store_rope_pair(value, second, row0 + r, t0 + t, rope_half, rope_operands)
                        else:
                            out[t0 + t, row0 + r] = value
                        if residual:
                            residual_out[t0 + t, row0 + r] = value + residual_in[t0 + t, row0 + r]
                if norm:  # this block's share of normed, for the tokens of this pass
                    first_k = cuda.blockIdx.x * threads + tid
                    if first_k < in_features:  # blocks past the first in_features / threads have none
                        for t in range(min(chunk, num_tokens - t0)):
                            scale = row_scale(_block_total(partial, rows, t, totals), in_features, eps)
                            for k in range(first_k, in_features, cuda.gridDim.x * threads):
                                gain = decode(np.uint32((norm_words[k // word_elements] >> word_type(
                                    element_bits * (k % word_elements))) & word_type(element_mask)))
                                normed[t0 + t, k] = gain * (x[t0 + t, k] * scale)
                # The next pass overwrites `partial` only after these reads; a block's last pass (every pass
                # of a decode step on the GPU: one row group per block, one pass) skips the barrier.
                if t0 + chunk < num_tokens or row0 + cuda.gridDim.x * outputs < out_features:
                    cuda.syncthreads()

    return kernel


@jit(device=True)
def _store_rope_pair(x1, x2, pair, token, rope_half, rope_operands):
    """rope_qkv's work for one (token, pair) of the q|k|v projection: pair = head * head_dim / 2 + d over the
    q heads, then the k heads, then the v heads (rope.store_qkv_pair: the same stores, the same bits)."""
    positions, inv_freq, q, k, v, k_pool, v_pool, slot_mapping = rope_operands
    head = pair // rope_half
    store_qkv_pair(x1, x2, token, head, pair - head * rope_half, slot_mapping[token], positions, inv_freq,
                   q, k, v, k_pool, v_pool)


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
            w_tile[ty, tx] = weight_to_f32(w_bits[w_row, k])
        else:
            w_tile[ty, tx] = np.float32(0.0)
        cuda.syncthreads()
        for i in range(TILE):
            acc += x_tile[ty, i] * w_tile[tx, i]
        cuda.syncthreads()  # nobody overwrites the tiles while others still read them
    if t < num_tokens and n < out_features:
        out[t, n] = acc


@functools.cache
def gemm_blocked_kernel(thread_tokens: int = THREAD_TOKENS, thread_features: int = THREAD_FEATURES):
    """The gemm_blocked kernel for one micro-tile shape (compile-time constants: the micro-tile loops unroll
    and its accumulators live in registers). 16 x 8 threads, so the block tile is 8 * thread_tokens tokens x
    16 * thread_features features."""
    block_tokens = BLOCKED_THREADS_Y * thread_tokens
    block_features = BLOCKED_THREADS_X * thread_features
    tokens_padded = block_tokens + SHARED_ROW_PAD
    features_padded = block_features + SHARED_ROW_PAD
    load_rows_x = block_tokens // LOAD_ROW_STEP
    load_rows_w = block_features // LOAD_ROW_STEP

    @jit
    def kernel(x, w_bits, partials, k_per_split):
        # Both tiles are stored k-major (transposed from global memory), so step kk of the inner loop reads
        # one shared row; a thread's micro-tile is contiguous in it (tokens ty * thread_tokens + i, features
        # tx * thread_features + j) and 16-byte aligned, so it comes in as 128-bit loads (ld.shared.v4): a
        # warp's reads are 2 broadcast addresses of x and 16 consecutive 16-byte words of W.
        x_tile = cuda.shared.array((BLOCK_K, tokens_padded), np.float32, alignment=SHARED_ALIGN)
        w_tile = cuda.shared.array((BLOCK_K, features_padded), np.float32, alignment=SHARED_ALIGN)
        # Constant shapes, constant-trip loops: fully unrolled, so these three live in registers.
        acc = cuda.local.array((thread_tokens, thread_features), np.float32)
        x_col = cuda.local.array(thread_tokens, np.float32)
        w_col = cuda.local.array(thread_features, np.float32)
        num_tokens, in_features = x.shape
        out_features = w_bits.shape[0]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t0 = cuda.blockIdx.y * block_tokens
        n0 = cuda.blockIdx.x * block_features
        split = cuda.blockIdx.z  # this block's share of K: [k_begin, k_end); k_per_split is a multiple of BLOCK_K
        k_begin = split * k_per_split
        k_end = min(k_begin + k_per_split, in_features)
        # Loading: thread tid copies column tid % BLOCK_K of tile rows tid // BLOCK_K + LOAD_ROW_STEP * r, so
        # a warp reads BLOCK_K consecutive k of each of 2 rows (coalesced along k).
        tid = ty * BLOCKED_THREADS_X + tx
        load_k = tid % BLOCK_K
        load_row = tid // BLOCK_K
        # Unsigned indices for the inner loop's shared reads: numba wraps negative signed indices around
        # (x[-1] is the last element), a compare and add that LLVM could not remove here and that kept a
        # separate address per read live across the loop (ptxas: 128 registers signed, 96 unsigned). Never
        # mix them with signed ints: numba types uint64 + int64 as float64.
        x_first = np.uint64(ty * thread_tokens)
        w_first = np.uint64(tx * thread_features)
        for i in range(thread_tokens):
            for j in range(thread_features):
                acc[i, j] = np.float32(0.0)
        for k0 in range(k_begin, k_end, BLOCK_K):
            # Past the edges: k >= K is zero-filled (it would add to every output); rows past T or N are
            # clamped to the last row, since they only reach accumulators that are never stored. Clamped
            # addresses, no branch: the compiler can issue all the loads before the first store.
            k = k0 + load_k
            k_in_range = k < k_end
            k_clamped = min(k, in_features - 1)
            for r in range(load_rows_x):
                m = load_row + r * LOAD_ROW_STEP
                value = x[min(t0 + m, num_tokens - 1), k_clamped]
                x_tile[load_k, m] = value if k_in_range else np.float32(0.0)
            for r in range(load_rows_w):
                j = load_row + r * LOAD_ROW_STEP
                value = weight_to_f32(w_bits[min(n0 + j, out_features - 1), k_clamped])  # decoded once per block
                w_tile[load_k, j] = value if k_in_range else np.float32(0.0)
            cuda.syncthreads()
            for kk in range(np.uint64(BLOCK_K)):
                for i in range(thread_tokens):
                    x_col[i] = x_tile[kk, x_first + np.uint64(i)]
                for j in range(thread_features):
                    w_col[j] = w_tile[kk, w_first + np.uint64(j)]
                for i in range(thread_tokens):
                    for j in range(thread_features):
                        acc[i, j] += x_col[i] * w_col[j]
            cuda.syncthreads()  # nobody overwrites the tiles while others still read them
        for i in range(thread_tokens):
            t = t0 + ty * thread_tokens + i
            if t < num_tokens:
                for j in range(thread_features):
                    n = n0 + tx * thread_features + j
                    if n < out_features:
                        partials[split, t, n] = acc[i, j]

    return kernel


@jit
def sum_splits_kernel(partials, out):
    """out[t, n] = sum_s partials[s, t, n], s in order (deterministic, unlike atomic adds)."""
    splits, num_tokens, out_features = partials.shape
    for i in range(cuda.grid(1), num_tokens * out_features, cuda.gridsize(1)):
        t = i // out_features
        n = i % out_features
        total = partials[0, t, n]
        for s in range(1, splits):
            total += partials[s, t, n]
        out[t, n] = total


def _check_shapes(x, w_bits, out):
    """Check x [T, K] f32 against W [N, K] u16 and return out [T, N] f32 (allocated if None)."""
    assert x.dtype == np.float32, f"x is {x.dtype}: these kernels read float32 activations"
    return fused_outputs(x, w_bits, None, None, out).out


def gemv(x, w_bits, out=None):
    """y = x @ W.T for T <= MAX_GEMV_TOKENS tokens: one thread per GEMV_ROWS output features, each weight
    read once."""
    out = _check_shapes(x, w_bits, out)
    assert x.shape[0] <= MAX_GEMV_TOKENS, f"gemv takes at most {MAX_GEMV_TOKENS} tokens, got {x.shape[0]}"
    if x.shape[0] > 0:
        blocks, threads = grid_stride_launch(cdiv(w_bits.shape[0], GEMV_ROWS), THREADS)
        gemv_kernel[blocks, threads, launch_stream()](x, w_bits, out)
    return out


def gemv_coalesced(x, w_bits, out=None, threads=None, rows=None, unroll=None, word_elements=None,
                   warp_reduce=None):
    """gemv with coalesced weight reads: a block of `threads` (power of two) splits each of its `rows`
    rows along K, a warp reading 32 consecutive words of `word_elements` bf16 (128 or 256 bytes) per load
    instruction; more than 2 tokens in passes of COALESCED_PASS_TOKENS. in_features must be a multiple of
    word_elements and w_bits C-contiguous (a word view). `warp_reduce` (default WARP_REDUCE): the block's
    sums by warp shuffles (GPU only) or by the shared-memory tree."""
    return gemv_fused(x, w_bits, out=out, threads=threads, rows=rows, unroll=unroll, word_elements=word_elements,
                      warp_reduce=warp_reduce).out


def gemv_fused(x, w_bits, prologue: RMSNormPrologue | None = None, epilogue=None, out=None, threads=None,
               rows=None, unroll=None, word_elements=None, warp_reduce=None) -> FusedOutputs:
    """gemv_coalesced with its neighbours fused (epilogues.py): RMSNormPrologue in front (x is the residual
    stream h; also writes normed = rmsnorm(h)), and behind SwiGLUEpilogue (W = [Wg; Wu], out = silu(x Wg) *
    (x Wu)), ResidualEpilogue (residual_out = out + residual) or RopeKVEpilogue (W = [Wq; Wk; Wv]: RoPE, q, k,
    v stored and k, v written into the pools; out not stored). One launch; returns the FusedOutputs written.
    With RopeKVEpilogue the dot products and rotations are rope.rope_qkv's: in the simulator every bit the
    same as the plain launch then rope_qkv."""
    assert x.dtype == np.float32, f"x is {x.dtype}: gemv_fused reads float32 activations"
    assert not (isinstance(epilogue, SwiGLUEpilogue) and epilogue.bf16), "gemv_fused writes SwiGLU's out as float32"
    result = fused_outputs(x, w_bits, prologue, epilogue, out)
    _launch_gemv_coalesced(x, w_bits, result, threads, rows, unroll, word_elements, prologue, epilogue, warp_reduce)
    return result


def coalesced_threads(row_groups: int) -> int:
    """gemv_coalesced's block size at 1-2 tokens: 64, 128 or 256, the widest whose grid of row_groups blocks
    stays within COALESCED_GRID_THREADS threads (Llama-3.2-1B: down_proj and o_proj 256, q|k|v 128, gate|up
    and the LM head 64). The simulator's blocks stay at COALESCED_THREADS."""
    if SIMULATOR:
        return COALESCED_THREADS
    threads = 64
    while threads < 256 and row_groups * threads * 2 <= COALESCED_GRID_THREADS:
        threads *= 2
    return threads


def _launch_gemv_coalesced(x, w_bits, result: FusedOutputs, threads=None, rows=None, unroll=None, word_elements=None,
                           prologue: RMSNormPrologue | None = None, epilogue=None, warp_reduce=None):
    num_tokens, in_features = x.shape
    paired = pairs_rows(epilogue)  # each output is two weight rows: gate and up, or a RoPE pair
    swiglu = isinstance(epilogue, SwiGLUEpilogue)
    residual = isinstance(epilogue, ResidualEpilogue)
    rope_head_dim = epilogue.head_dim if isinstance(epilogue, RopeKVEpilogue) else 0
    out_features = w_bits.shape[0] // 2 if paired else w_bits.shape[0]
    element_bits = weight_bits(w_bits.dtype)
    if word_elements is None:  # 8-byte words where in_features allows, else 4-byte ones
        word_elements = COALESCED_WORD_ELEMENTS * 16 // element_bits
        word_elements = word_elements if in_features % word_elements == 0 else word_elements // 2
    assert in_features % word_elements == 0, (
        f"gemv_coalesced reads {word_elements} weights per word: in_features {in_features} is not a multiple")
    chunk = num_tokens if num_tokens <= 2 else COALESCED_PASS_TOKENS
    norm, few = prologue is not None, chunk <= 2  # launch shapes: see COALESCED_ROWS and NORM_THREADS
    if rows is None:
        rows = (NORM_ROWS if norm else COALESCED_ROWS) if few else COALESCED_ROWS_MANY_TOKENS
    outputs_per_block = rows // 2 if paired else rows
    if threads is None:
        if not few:
            threads = COALESCED_THREADS
        else:
            threads = NORM_THREADS if norm else coalesced_threads(cdiv(out_features, outputs_per_block))
    if unroll is None:
        if not few:
            unroll = COALESCED_UNROLL_MANY_TOKENS
        else:
            unroll = (NORM_UNROLL_SWIGLU if swiglu else NORM_UNROLL) if norm else COALESCED_UNROLL
    if warp_reduce is None:
        warp_reduce = WARP_REDUCE and chunk <= WARP_REDUCE_MAX_CHUNK
    assert 0 < threads <= 1024 and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    if num_tokens == 0 or out_features == 0:
        return
    row_groups = cdiv(out_features, outputs_per_block)
    blocks = min(row_groups, SIMULATOR_GRID[0]) if SIMULATOR else row_groups
    word_type = np.uint32 if word_elements * element_bits == 32 else np.uint64
    w_words = w_bits.view(word_type)
    kernel = gemv_coalesced_kernel(chunk, threads, rows, unroll, word_elements, norm, residual, swiglu,
                                   rope_head_dim, warp_reduce, element_bits)
    # unused operands get stand-ins of the right type (a compiled-out branch never touches them)
    out = x if result.out is None else result.out  # RoPE stores q, k, v instead
    norm_words = prologue.weight.view(word_type) if norm else w_words[0]
    rope_operands = epilogue.operands(result.q, result.k, result.v) if rope_head_dim else ()
    kernel[blocks, threads, launch_stream()](
        x, w_words, out, norm_words, np.float32(prologue.eps if norm else 0.0), result.normed if norm else out,
        epilogue.residual if residual else out, result.residual_out if residual else out, rope_operands)


def gemm(x, w_bits, out=None):
    """y = x @ W.T for any number of tokens: TILE x TILE output tiles built from shared-memory tiles."""
    out = _check_shapes(x, w_bits, out)
    if x.shape[0] > 0:
        grid = (cdiv(w_bits.shape[0], TILE), cdiv(x.shape[0], TILE))
        gemm_kernel[grid, (TILE, TILE), launch_stream()](x, w_bits, out)
    return out


def gemm_splits(num_tokens: int, in_features: int, out_features: int,
                thread_tokens: int = THREAD_TOKENS, thread_features: int = THREAD_FEATURES) -> int:
    """How many slices of K gemm_blocked cuts this shape into: one, unless the output tiles alone would
    leave the GPU short of SPLIT_TARGET_BLOCKS blocks (a decode batch of 256 through o_proj: 128 tiles for
    132 SMs, one 4-warp block each); then doublings while each slice keeps MIN_SPLIT_K of K."""
    tiles = cdiv(out_features, BLOCKED_THREADS_X * thread_features) * cdiv(num_tokens, BLOCKED_THREADS_Y * thread_tokens)
    splits = 1
    while tiles * splits < SPLIT_TARGET_BLOCKS and in_features >= 2 * splits * MIN_SPLIT_K:
        splits *= 2
    return splits


def gemm_blocked(x, w_bits, out=None, splits=None, thread_tokens=THREAD_TOKENS, thread_features=THREAD_FEATURES):
    """y = x @ W.T for many tokens: an output tile per block, a register-blocked thread_tokens x
    thread_features micro-tile per thread. Any T, N and K (weights are read as bf16 halves). With
    `splits` > 1 (default: gemm_splits) each block sums one slice of K into a partial product and
    sum_splits_kernel adds the slices in order."""
    out = _check_shapes(x, w_bits, out)
    num_tokens, in_features = x.shape
    out_features = w_bits.shape[0]
    if num_tokens == 0 or out_features == 0:
        return out
    if splits is None:
        splits = gemm_splits(num_tokens, in_features, out_features, thread_tokens, thread_features)
    k_per_split = cdiv(cdiv(in_features, splits), BLOCK_K) * BLOCK_K
    splits = cdiv(in_features, k_per_split)  # a split never starts past K
    partials = out.reshape((1, num_tokens, out_features)) if splits == 1 else device_empty(
        (splits, num_tokens, out_features), np.float32)
    grid = (cdiv(out_features, BLOCKED_THREADS_X * thread_features),
            cdiv(num_tokens, BLOCKED_THREADS_Y * thread_tokens), splits)
    kernel = gemm_blocked_kernel(thread_tokens, thread_features)
    kernel[grid, (BLOCKED_THREADS_X, BLOCKED_THREADS_Y), launch_stream()](x, w_bits, partials, k_per_split)
    if splits > 1:
        blocks, threads = grid_stride_launch(num_tokens * out_features, THREADS)
        sum_splits_kernel[blocks, threads, launch_stream()](partials, out)
    return out


def linear_kernel(num_tokens: int, in_features: int, simulator: bool | None = None) -> tuple[str, Callable]:
    """Which kernel y = x @ W.T takes for this shape: its name and its launcher (x, w_bits, out=None) -> out.

    On a GPU: gemv_coalesced up to MAX_COALESCED_TOKENS tokens (gemv if in_features is odd), gemm_blocked
    beyond (`gemm` stays callable: the readable version of the same tiling).
    In the simulator (`simulator`, default SIMULATOR) every syncthreads costs milliseconds per block, so there the
    syncthreads-free gemv does everything: decode batches directly, prefill in chunks of MAX_GEMV_TOKENS tokens
    (same result up to float32 summation order).
    """
    if SIMULATOR if simulator is None else simulator:
        return "gemv", _gemv_in_chunks
    if num_tokens <= MAX_GEMV_TOKENS and in_features % 2:
        return "gemv", gemv
    if num_tokens <= MAX_COALESCED_TOKENS and in_features % 2 == 0:
        return "gemv_coalesced", gemv_coalesced
    return "gemm_blocked", gemm_blocked


def _gemv_in_chunks(x, w_bits, out=None):
    """gemv over any number of tokens, MAX_GEMV_TOKENS at a time (the simulator's prefill)."""
    out = _check_shapes(x, w_bits, out)
    num_tokens = x.shape[0]
    if num_tokens <= MAX_GEMV_TOKENS:
        return gemv(x, w_bits, out)
    for start in range(0, num_tokens, MAX_GEMV_TOKENS):
        stop = min(start + MAX_GEMV_TOKENS, num_tokens)
        gemv(x[start:stop], w_bits, out[start:stop])
    return out


def linear(x, w_bits, out=None):
    """y = x @ W.T with the kernel `linear_kernel` picks for the shape."""
    out = _check_shapes(x, w_bits, out)
    _name, launch = linear_kernel(x.shape[0], x.shape[1])
    return launch(x, w_bits, out)


def linear_ref(x: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """numpy twin: W's values (weights_ref), accumulated in float64, rounded once to float32."""
    w = weights_ref(w_bits).astype(np.float64)
    return (x.astype(np.float64) @ w.T).astype(np.float32)
