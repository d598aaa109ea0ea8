"""Linear layers on tensor cores: y = x @ W.T with bf16 inputs, float32 accumulation, float32 out.

    out[m, n] = sum_k bf16(x[m, k]) * bf16(w[n, k])        x [M, K], w_bits u16 [N, K], out f32 [M, N]

Activations enter as a bf16 buffer (uint16 [M, K]): the mma takes bf16 (the fast precision,
tinyvllm/runner/kernel_plan.py, feeds down_proj the SwiGLU gate's output as bf16 directly: this GEMM's SwiGLU epilogue
below, or activation.silu_mul_gate_up(bf16=True)).
`gemm_tc` also takes float32 x and rounds it to bf16 (nearest even) in one launch first (`to_bf16_rows`, 6 bytes
a value of extra traffic: ~1 % of a prefill-size GEMM's time); weights are read as stored.

A block owns a block_m x block_n tile of out (tokens along y, features along x: neighbouring blocks
share x's rows), `warps_m x warps_n` warps each a (block_m / warps_m) x (block_n / warps_n) part of it, made
of 16 x 8 mma tiles whose float32 accumulators stay in registers (compile-time loops, fully unrolled). The
block walks K a block_k slice at a time through `stages` shared-memory buffers: every thread issues
cp.async copies of 16 bytes (8 bf16) of the next slices of x and W while the warps compute on the current
one (copies past M, N or K fill zeros), then per 16-wide k step each warp loads its A fragments (one
ldmatrix.x4 per 16 rows) and B fragments (one ldmatrix.x4 per 16 features: W [n][k] is B in the mma's
"col" layout as stored) and issues one mma per 16 x 8 tile. Shared rows are padded by 8 bf16 (16 bytes):
ldmatrix's 8 row addresses then fall in distinct banks. Epilogue: each lane stores its accumulators (two
consecutive features of two tokens per mma tile), with `ResidualEpilogue` also out + residual.

`SwiGLUEpilogue(bf16=True)`: W is gate|up stacked, [Wg; Wu] ([2 I, K]), and the GEMM writes the gate's output
instead of gate|up: out [M, I] = bf16(silu(x Wg) * (x Wu)), uint16 bits, never the float32 [M, 2 I] (a round trip
of ~470 MB a layer at 4,096 tokens and I 8,192). The block walks 2 I columns interleaved, column c the gate of
feature c / 2 when c is even and its up when odd, so the two adjacent columns (2t, 2t + 1) a lane holds of each mma
tile are one feature's gate and up, in float32, summed as the plain GEMM sums them. Only the W copies change: tile
row r (n0 even) comes from W row (r & 1) I + (n0 + r) / 2, and as a thread's rows step by an even rows_per_round, its
parity, so its half of W, stays fixed while its W row steps by rows_per_round / 2. The epilogue's arithmetic is
activation.silu_mul_gate_up(bf16=True)'s on the same float32 gate and up: bit for bit the unfused pair. One pass only
(the gate needs the whole sum, not split-K's partials).

The stage buffers are carved out of one dynamic shared array, x's stages then W's (mma.shared_view), its size
(TileShape.shared_bytes()) given at launch: a tile may take up to the 227 KB a block may opt in to on sm_90
(common.launch_with_shared opts the kernel in past 48 KB), where a static declaration stops at 48 KB (block_k 64
at 128 x 128 over 3 stages is 108 KB).

Split-K (`splits` > 1, chosen by `split_for`) is for decode batches, where too few blocks each walk a long K:
the grid gets a z dimension, block z walks only its share of K's block_k slices and stores its float32 partial
tile in a workspace [splits * M, N] (device_empty: a CUDA graph's BufferArena), and `sum_splits_kernel` adds the
partials in split order into out (and the residual): deterministic, no atomics. splits = 1 is the one launch.

Error: each product of two bf16 is exact in float32; the sum of K of them is float32 (the tensor core adds
16 products at a time, then into the accumulator), so |out - ref| <= K * 2^-23 * sum_k |x_k w_k| with ref
the float64 sum of the bf16-rounded inputs (the classic bound gamma_K, with the unit roundoff doubled in
case the hardware truncates instead of rounding). tests/test_gemm_tc.py checks exactly that bound. Split-K adds
splits - 1 float32 additions to each output: a product then passes through at most K / 16 + splits - 1 <= K
roundings (splits <= K / block_k), so the same bound holds.

In the simulator the same kernel runs on mma.py's Python twins (the warps' lanes meet at each mma and
ldmatrix), one block at a time: test it with small tiles (TileShape(32, 32, 32, 1, 2)).
"""
from dataclasses import dataclass
import functools

import numpy as np

from .activation import silu
from .bf16 import f32_to_bf16
from .common import (SHARED_ALIGN, cuda, jit, cdiv, grid_stride_launch, launch_stream, launch_with_shared,
                     device_empty, flat_rows, rows_launch)
from .epilogues import FusedOutputs, ResidualEpilogue, SwiGLUEpilogue, fused_outputs
from .mma import cp_async_16, cp_async_commit, cp_async_wait_group, ldmatrix_x4, mma_bf16_m16n8k16, shared_view

WARP = 32
CHUNK = 8      # bf16 per 16-byte copy
ROW_PAD = 8    # bf16 of padding per shared row (16 bytes)
CONVERT_THREADS = 256
SUM_THREADS = 256
# The most shared memory a block may have on compute capability 9.0 (H100, H200), opting in past 48 KB: 227 KB.
# TileShape.check holds tiles to it; a launch also checks the GPU's own limit (launch_with_shared).
SHARED_LIMIT = 227 * 1024


@dataclass(frozen=True)
class TileShape:
    block_m: int = 128  # tokens per block
    block_n: int = 128  # output features per block
    block_k: int = 32   # K per shared-memory stage
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 2     # shared buffers in flight: copies of slice k + stages - 1 overlap the mmas on slice k

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * WARP

    def shared_bytes(self) -> int:
        """The block's dynamic shared memory: `stages` buffers of x's block_m and W's block_n padded rows."""
        return self.stages * (self.block_m + self.block_n) * (self.block_k + ROW_PAD) * 2

    def check(self) -> None:
        warp_m, warp_n = self.block_m // self.warps_m, self.block_n // self.warps_n
        assert warp_m * self.warps_m == self.block_m and warp_m % 16 == 0, f"{self}: warp rows not a multiple of 16"
        assert warp_n * self.warps_n == self.block_n and warp_n % 16 == 0, f"{self}: warp columns not a multiple of 16"
        assert self.block_k % 16 == 0 and self.stages >= 2, self
        assert self.shared_bytes() <= SHARED_LIMIT, (
            f"{self}: {self.shared_bytes()} B of shared memory a block, over the {SHARED_LIMIT} B "
            f"({SHARED_LIMIT // 1024} KB) a block may opt in to on an H100/H200 (SHARED_LIMIT)")


# Chosen by scripts/sweep_tc_gemm.py over Llama-3.2-1B's four projections at 128-4,096 rows (measured:
# docs/bench-h200.md). `tile_for` picks per GEMM: 128 x 128 x 64 over 3 stages (108 KB) is fastest wherever its
# blocks come near one wave (>= 128 blocks: gate|up from 128 rows, every projection from 1,024); 64 x 128 x 64
# (81 KB) below that where it has the blocks; 64 x 64 x 32 where even those do not fill the GPU once.
DEFAULT_TILE = TileShape(64, 128, 64, 2, 2, 3)
LARGE_TILE = TileShape(128, 128, 64, 2, 2, 3)   # best where its blocks come near one wave (LARGE_MIN_WAVE)
SMALL_TILE = TileShape(64, 64, 32, 2, 2, 4)     # best where even DEFAULT_TILE's blocks do not fill it once (128)
H200_SMS = 132  # SMs of the GPU the tiles were tuned on: tile_for's and split_for's default sm_count


LARGE_MIN_WAVE = 0.9  # LARGE_TILE from this fraction of a wave of blocks: 128 blocks won (gate|up at 128 rows), 48 lost


def tile_for(m: int, n: int, sm_count: int = H200_SMS) -> TileShape:
    """The largest tile that still keeps the SMs busy: the sweeps' winner (or within 2 % of it) in each of their
    16 cases at 128-4,096 rows (128 x 128 x 64 from 128 blocks; 64 x 128 at 48 blocks loses to 64 x 64 at 96)."""
    def blocks(tile: TileShape) -> int:
        return cdiv(m, tile.block_m) * cdiv(n, tile.block_n)
    if blocks(LARGE_TILE) >= LARGE_MIN_WAVE * sm_count:
        return LARGE_TILE
    if blocks(DEFAULT_TILE) >= sm_count:
        return DEFAULT_TILE
    return SMALL_TILE


SPLITS = (1, 2, 4, 8)
MIN_SPLIT_SLICES = 16  # K slices each split walks at least (its pipeline's fill and drain, the partials' traffic)
SPLIT_BLOCKS_PER_SM = 1  # blocks per SM split_for aims at: one wave (not yet tuned: scripts/sweep_tc_gemm.py --splits)


def split_for(m: int, n: int, k: int, tile: TileShape, sm_count: int = H200_SMS) -> int:
    """Split-K's splits for an [m, n] output over K = k: the fewest of SPLITS that give SPLIT_BLOCKS_PER_SM blocks
    per SM while each split keeps MIN_SPLIT_SLICES slices of block_k (else the most that do). Decode batches of the
    1B model's o_proj and down_proj (32 or 128 blocks of 64 x 64, each walking 64 or 256 slices) split; GEMMs whose
    blocks fill the GPU already (prefill) stay at 1."""
    if tile == LARGE_TILE:
        return 1  # tile_for picks it only where its blocks come near a wave; the sweep timed it in one pass
    blocks = cdiv(m, tile.block_m) * cdiv(n, tile.block_n)
    k_slices = cdiv(k, tile.block_k)
    chosen = 1
    for splits in SPLITS:
        if k_slices < splits * MIN_SPLIT_SLICES:
            break
        chosen = splits
        if blocks * splits >= sm_count * SPLIT_BLOCKS_PER_SM:
            break
    return chosen


def gemm_tc_kernel(tile: TileShape, residual: bool = False, split: bool = False, swiglu: bool = False):
    """The kernel of _gemm_tc_kernel, one per (tile, residual, split, swiglu) however the call spells them
    (functools.cache keys positional and keyword arguments apart: scripts/check_tc_sass.py reads the launched
    kernel's SASS)."""
    return _gemm_tc_kernel(tile, bool(residual), bool(split), bool(swiglu))


@functools.cache
def _gemm_tc_kernel(tile: TileShape, residual: bool, split: bool, swiglu: bool = False):
    """The kernel for one tile shape (every size a compile-time constant: fixed shared shapes, unrolled
    fragment and accumulator loops, so fragments and accumulators are registers). `residual`: also
    residual_out = out + residual_in. `split`: block z of a grid of gridDim.z splits walks K slices
    [z S / splits, (z + 1) S / splits) of the S = cdiv(K, block_k) and stores its partial sums at rows
    z M .. z M + M - 1 of out, the workspace [splits M, N] (sum_splits_kernel adds them up); without it z is 0 of 1.
    `swiglu`: W is [Wg; Wu] (2 I rows) walked in the interleaved column order (the module's docstring), and out is
    uint16 [M, I] = bf16(silu(gate) * up)."""
    tile.check()
    assert not (residual and split), "split-K applies the residual in sum_splits"
    assert not (swiglu and (residual or split)), "the SwiGLU epilogue needs the whole sum, and has no residual"
    bm, bn, bk, stages = tile.block_m, tile.block_n, tile.block_k, tile.stages
    warps_n, threads = tile.warps_n, tile.threads
    warp_m, warp_n = bm // tile.warps_m, bn // tile.warps_n
    m_tiles, n_tiles = warp_m // 16, warp_n // 8  # mma tiles per warp
    k_steps = bk // 16
    row_chunks = bk // CHUNK
    x_chunks, w_chunks = bm * row_chunks, bn * row_chunks  # 16-byte copies per stage
    x_rounds, w_rounds = cdiv(x_chunks, threads), cdiv(w_chunks, threads)  # per thread
    assert threads % row_chunks == 0, tile  # so a thread copies the same column of every row it copies
    rows_per_round = threads // row_chunks
    # SwiGLU: a thread's W rows alternate gate / up by the parity of its tile row, the same in every round
    # (rows_per_round is even), so each round steps half as many rows of its half of W
    assert not swiglu or rows_per_round % 2 == 0, tile
    w_rows_per_round = rows_per_round // 2 if swiglu else rows_per_round
    padded_k = bk + ROW_PAD
    wait_prior = cp_async_wait_group(stages - 2)  # the oldest stage in flight has landed
    # x's stages, then W's, in the one dynamic shared array (launched with tile.shared_bytes()): W starts stages * bm
    # rows of padded_k bf16 in, a multiple of 16 bytes, so every row stays 16-byte aligned for cp.async and ldmatrix
    x_view, w_view = shared_view((stages, bm, padded_k)), shared_view((stages, bn, padded_k))
    w_start = stages * bm * padded_k
    assert w_start * 2 % 16 == 0 and (w_start + stages * bn * padded_k) * 2 == tile.shared_bytes(), tile

    @jit(device=True)
    def copy_slice(x_flat, w_flat, x_tile, w_tile, stage, k0, row0, col, x_start, x_rows_left, w_start_row,
                   w_rows_left, round_stride, w_round_stride, in_features):
        """This thread's 16-byte copies of x[m0:m0+bm, k0:k0+bk] and W[n0:n0+bn, k0:k0+bk] into `stage`: rows
        row0 + i rows_per_round of the tile, at its column `col`, from the flat operands (x_start, w_start_row:
        the flat index of the thread's first row, at column 0; round_stride: rows_per_round rows of x,
        w_round_stride: w_rows_per_round rows of W). Zeros past the edges (rows_left: rows of the operand, or of
        its half of W, from the thread's first one; K's end), read from index 0 instead.
        Only the column moves from slice to slice, so the addresses are one add each (not two 64-bit index
        products: integer work that would outgrow the mmas in the loop)."""
        k_col = np.uint32(k0 + col)  # 32-bit index arithmetic (numba widens to 64 bits, these casts narrow it
        k_inside = k_col < in_features  # back): the launcher holds x and W under 2^31 elements
        for i in range(x_rounds):
            if x_rounds * threads > x_chunks and row0 + i * rows_per_round >= bm:  # (compiled out when even)
                continue
            valid = k_inside and np.int32(i * rows_per_round) < x_rows_left
            index = np.uint32(x_start + np.uint32(i * round_stride) + k_col)
            cp_async_16(x_tile, stage, row0 + i * rows_per_round, col, x_flat, 0, index if valid else np.uint32(0),
                        16 if valid else 0)
        for i in range(w_rounds):
            if w_rounds * threads > w_chunks and row0 + i * rows_per_round >= bn:
                continue
            valid = k_inside and np.int32(i * w_rows_per_round) < w_rows_left
            index = np.uint32(w_start_row + np.uint32(i * w_round_stride) + k_col)
            cp_async_16(w_tile, stage, row0 + i * rows_per_round, col, w_flat, 0, index if valid else np.uint32(0),
                        16 if valid else 0)

    @jit
    def kernel(x_bits, w_bits, x_flat, w_flat, out, residual_in, residual_out):
        smem = cuda.shared.array(0, np.uint16, alignment=SHARED_ALIGN)  # dynamic: tile.shared_bytes() at launch
        x_tile = x_view(smem, 0)        # [stages, bm, padded_k]
        w_tile = w_view(smem, w_start)  # [stages, bn, padded_k]
        acc = cuda.local.array((m_tiles, n_tiles, 4), np.float32)
        a_frag = cuda.local.array((m_tiles, 4), np.uint32)
        b_frag = cuda.local.array((n_tiles, 2), np.uint32)
        num_tokens, in_features = x_bits.shape
        out_features = w_bits.shape[0]
        tid = cuda.threadIdx.x
        lane = tid % WARP
        warp = tid // WARP
        warp_row = (warp // warps_n) * warp_m  # this warp's part of the block tile
        warp_col = (warp % warps_n) * warp_n
        m0 = cuda.blockIdx.y * bm
        n0 = cuda.blockIdx.x * bn
        for i in range(m_tiles):
            for j in range(n_tiles):
                for r in range(4):
                    acc[i, j, r] = np.float32(0.0)
        k_slices = (in_features + bk - 1) // bk
        if split:  # this block's share of K's slices (uneven splits differ by one), and of the workspace's rows
            k_first = cuda.blockIdx.z * k_slices // cuda.gridDim.z
            k_slices = (cuda.blockIdx.z + 1) * k_slices // cuda.gridDim.z - k_first
            out_row0 = cuda.blockIdx.z * num_tokens
        else:
            k_first = 0
            out_row0 = 0
        row0 = tid // row_chunks  # the thread's first row of each tile it copies, and its column there
        col = (tid % row_chunks) * CHUNK
        x_start = np.uint32((m0 + row0) * in_features)
        x_rows_left = np.int32(num_tokens - m0 - row0)
        round_stride = np.uint32(rows_per_round * in_features)
        if swiglu:  # tile row r: W row (r & 1) I + (n0 + r) // 2 (n0 is even)
            half = out_features // 2
            w_feature = (n0 + row0) // 2
            w_start_row = np.uint32(((row0 & 1) * half + w_feature) * in_features)
            w_rows_left = np.int32(half - w_feature)
            w_round_stride = np.uint32(w_rows_per_round * in_features)
        else:
            w_start_row = np.uint32((n0 + row0) * in_features)
            w_rows_left = np.int32(out_features - n0 - row0)
            w_round_stride = round_stride
        for s in range(stages - 1):  # the pipeline's first slices
            if s < k_slices:
                copy_slice(x_flat, w_flat, x_tile, w_tile, s, (k_first + s) * bk, row0, col, x_start, x_rows_left,
                           w_start_row, w_rows_left, round_stride, w_round_stride, in_features)
            cp_async_commit()
        # ldmatrix row addresses: A, lanes 0-15 rows 0-15 at k, lanes 16-31 the same rows at k + 8; B, lanes
        # 0-7 / 8-15 features 0-7 at k / k + 8, lanes 16-23 / 24-31 features 8-15 at k / k + 8.
        a_row = warp_row + lane % 16
        a_col = 8 * (lane // 16)
        b_row = warp_col + lane % 8 + 8 * (lane // 16)
        b_col = 8 * ((lane // 8) % 2)
        # Slice kt sits in stage kt % stages; slice kt + stages - 1 is copied into the stage before it. Both kept as
        # counters (a 64-bit signed modulo each slice cost more integer work than the copies' addresses).
        stage = 0
        ahead_stage = stages - 1
        k_ahead = np.int32((k_first + stages - 1) * bk)
        for kt in range(k_slices):
            wait_prior()
            cuda.syncthreads()  # slice kt is in shared memory for everyone; slice kt - 1's buffer is free
            if kt + stages - 1 < k_slices:
                copy_slice(x_flat, w_flat, x_tile, w_tile, ahead_stage, k_ahead, row0, col, x_start, x_rows_left,
                           w_start_row, w_rows_left, round_stride, w_round_stride, in_features)
            cp_async_commit()  # (an empty group at the end keeps the wait count uniform)
            k_ahead += bk
            ahead_stage = stage  # (stage + stages - 1) % stages, next slice
            for ks in range(k_steps):
                for i in range(m_tiles):
                    a_frag[i, 0], a_frag[i, 1], a_frag[i, 2], a_frag[i, 3] = ldmatrix_x4(
                        x_tile, stage, a_row + 16 * i, a_col + 16 * ks)
                for j in range(n_tiles // 2):
                    b_frag[2 * j, 0], b_frag[2 * j, 1], b_frag[2 * j + 1, 0], b_frag[2 * j + 1, 1] = ldmatrix_x4(
                        w_tile, stage, b_row + 16 * j, b_col + 16 * ks)
                for i in range(m_tiles):
                    for j in range(n_tiles):
                        acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3] = mma_bf16_m16n8k16(
                            a_frag[i, 0], a_frag[i, 1], a_frag[i, 2], a_frag[i, 3], b_frag[j, 0], b_frag[j, 1],
                            acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
            stage = stage + 1 if stage + 1 < stages else 0
        # Lane 4g + t holds, of each mma tile, out[g][2t..2t+1] (acc 0, 1) and out[g + 8][2t..2t+1] (acc 2, 3).
        g = lane // 4
        t = lane % 4
        row_end = out_row0 + num_tokens
        for i in range(m_tiles):
            for j in range(n_tiles):
                row = out_row0 + m0 + warp_row + 16 * i + g
                col = n0 + warp_col + 8 * j + 2 * t
                if swiglu:  # the pair is (gate, up) of feature col / 2
                    store_gated(out, row, col, acc[i, j, 0], acc[i, j, 1], row_end, out_features)
                    store_gated(out, row + 8, col, acc[i, j, 2], acc[i, j, 3], row_end, out_features)
                else:
                    store_pair(out, residual_in, residual_out, row, col, acc[i, j, 0], acc[i, j, 1], row_end,
                               out_features)
                    store_pair(out, residual_in, residual_out, row + 8, col, acc[i, j, 2], acc[i, j, 3], row_end,
                               out_features)

    @jit(device=True)
    def store_pair(out, residual_in, residual_out, row, col, v0, v1, row_end, out_features):
        """out[row, col] and out[row, col + 1], those before row_end and inside out (and residual_out = out +
        residual_in). Indexed unsigned (no negative-index fix-ups): with them the epilogue grew past what LLVM
        unrolls, and acc, indexed by a loop counter, went to the stack."""
        if row < row_end:
            r, c = np.uint64(row), np.uint64(col)
            if col < out_features:
                out[r, c] = v0
                if residual:
                    residual_out[r, c] = v0 + residual_in[r, c]
            if col + 1 < out_features:
                c += np.uint64(1)
                out[r, c] = v1
                if residual:
                    residual_out[r, c] = v1 + residual_in[r, c]

    @jit(device=True)
    def store_gated(out, row, col, gate, up, row_end, out_features):
        """out[row, col / 2] = bf16(silu(gate) * up), activation.silu_mul_bf16_kernel's arithmetic on the same float32
        gate and up, if row is before row_end and col inside the interleaved 2 I columns (col is even, 2 I too)."""
        if row < row_end and col < out_features:
            out[np.uint64(row), np.uint64(col >> 1)] = f32_to_bf16(silu(gate) * up)

    return kernel


@functools.cache
def sum_splits_kernel(residual: bool):
    """out[m, n] = partials[0 M + m, n] + partials[1 M + m, n] + ... in split order (float32, the same sum every
    run); `residual`: also residual_out = out + residual_in."""
    @jit
    def kernel(partials, splits, out, residual_in, residual_out):
        num_tokens, out_features = out.shape
        for i in range(cuda.grid(1), num_tokens * out_features, cuda.gridsize(1)):
            row = i // out_features
            col = i % out_features
            total = partials[row, col]
            for z in range(1, splits):
                total += partials[z * num_tokens + row, col]
            out[row, col] = total
            if residual:
                residual_out[row, col] = total + residual_in[row, col]
    return kernel


@jit
def to_bf16_rows_kernel(x, out):
    """Rows over the grid's y, columns over its x, in while loops: no division at all (a flat index split back into
    row and column costs a 64-bit division and modulo an element, enough to hold the copy to a third of the memory
    bandwidth; and a range() with a step unknown at compile time divides once for its trip count)."""
    num_rows, row_len = x.shape
    row = cuda.blockIdx.y
    while row < num_rows:
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while col < row_len:
            out[row, col] = f32_to_bf16(x[row, col])
            col += cuda.gridDim.x * cuda.blockDim.x
        row += cuda.gridDim.y


def to_bf16_rows(x, out=None):
    """x [M, K] float32 (any strides) -> uint16 bf16 bits [M, K], rounded to nearest even."""
    assert x.ndim == 2 and x.dtype == np.float32, (x.shape, x.dtype)
    out = device_empty(x.shape, np.uint16) if out is None else out
    assert out.shape == x.shape and out.dtype == np.uint16, (out.shape, out.dtype)
    if x.size:
        blocks, threads = rows_launch(*x.shape, CONVERT_THREADS)
        to_bf16_rows_kernel[blocks, threads, launch_stream()](x, out)
    return out


def gemm_tc_fused(x, w_bits, epilogue=None, out=None, tile: TileShape = DEFAULT_TILE, splits: int = 1
                  ) -> FusedOutputs:
    """out = bf16(x) @ W.T on tensor cores (x float32 [M, K], rounded to bf16 first, or uint16 bf16 bits);
    any M and N, K a multiple of 8 (16-byte copies). `epilogue`: None, epilogues.ResidualEpilogue
    (residual_out = out + residual) or SwiGLUEpilogue(bf16=True) (W = [Wg; Wu]: out uint16 [M, N / 2] =
    bf16(silu(gate) * up), splits 1). `splits` > 1: split-K (split_for), at most one split per K slice.
    Returns the FusedOutputs written."""
    assert x.ndim == 2 and x.dtype in (np.float32, np.uint16), (x.shape, x.dtype)
    assert w_bits.dtype == np.uint16, f"W is {w_bits.dtype}: gemm_tc reads bf16 weights (uint16 bits)"
    assert epilogue is None or isinstance(epilogue, ResidualEpilogue) or (
        isinstance(epilogue, SwiGLUEpilogue) and epilogue.bf16), (
        f"gemm_tc takes None, ResidualEpilogue or SwiGLUEpilogue(bf16=True), not {epilogue!r}")
    num_tokens, in_features = x.shape
    assert in_features % CHUNK == 0, f"gemm_tc copies 8 bf16 at a time: in_features {in_features} is not a multiple"
    assert isinstance(splits, int) and 1 <= splits <= max(1, cdiv(in_features, tile.block_k)), (
        f"gemm_tc splits {splits!r}: 1 to the {cdiv(in_features, tile.block_k)} slices of K {in_features}")
    result = fused_outputs(x, w_bits, None, epilogue, out)
    if num_tokens == 0 or w_bits.shape[0] == 0:
        return result
    x_bits = to_bf16_rows(x) if x.dtype == np.float32 else x
    # C-contiguous with K a multiple of 8 (above): rows start 16 bytes apart, as cp.async copies them
    assert x_bits.is_c_contiguous() and w_bits.is_c_contiguous(), (
        f"gemm_tc copies from x and W as flat arrays: they must be C-contiguous (x strides {x_bits.strides}, "
        f"W {w_bits.strides})")
    assert x_bits.size < 2**31 and w_bits.size < 2**31, (
        f"gemm_tc indexes x and W in 32 bits: {x_bits.shape} and {w_bits.shape} have 2^31 elements or more")
    residual = isinstance(epilogue, ResidualEpilogue)
    swiglu = isinstance(epilogue, SwiGLUEpilogue)
    assert not swiglu or splits == 1, f"gemm_tc's SwiGLU epilogue needs the whole sum: splits {splits}, not 1"
    out_features = w_bits.shape[0]  # (SwiGLU: the 2 I interleaved columns)
    grid = (cdiv(out_features, tile.block_n), cdiv(num_tokens, tile.block_m))
    residual_in = epilogue.residual if residual else result.out
    residual_out = result.residual_out if residual else result.out
    if splits == 1:
        launch_with_shared(gemm_tc_kernel(tile, residual, swiglu=swiglu), grid, tile.threads, tile.shared_bytes(),
                           x_bits, w_bits, *flat_rows(x_bits, w_bits), result.out, residual_in, residual_out)
        return result
    partials = device_empty((splits * num_tokens, out_features), np.float32)
    launch_with_shared(gemm_tc_kernel(tile, split=True), grid + (splits,), tile.threads, tile.shared_bytes(),
                       x_bits, w_bits, *flat_rows(x_bits, w_bits), partials, partials, partials)
    blocks, threads = grid_stride_launch(num_tokens * out_features, SUM_THREADS)
    sum_splits_kernel(residual)[blocks, threads, launch_stream()](partials, splits, result.out, residual_in,
                                                                  residual_out)
    return result


def gemm_tc(x, w_bits, out=None, tile: TileShape = DEFAULT_TILE, splits: int = 1):
    """out = bf16(x) @ W.T on tensor cores, float32 accumulation: see gemm_tc_fused. Returns out."""
    return gemm_tc_fused(x, w_bits, out=out, tile=tile, splits=splits).out


def gemm_tc_ref(x: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """numpy twin: x rounded to bf16 (nearest even) unless already bits, W decoded, float64 sum, float32 out."""
    import ml_dtypes
    x64 = (x.view(ml_dtypes.bfloat16) if x.dtype == np.uint16 else x.astype(ml_dtypes.bfloat16)).astype(np.float64)
    w64 = w_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return (x64 @ w64.T).astype(np.float32)
