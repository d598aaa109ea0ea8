"""A GEMM on Hopper's wgmma: out = x @ W.T, bf16 in, float32 accumulation, float32 out.

    out[m, n] = sum_k x[m, k] w[n, k]        x_bits u16 [M, K], w_bits u16 [N, K] (bf16 bits), out f32 [M, N]

A block owns a (64 consumers) x block_n tile of out: `consumers` warpgroups (128 threads each), warpgroup g the
64-row band g, its accumulators in registers (block_n / 2 floats a thread, wgmma.py's fragment layout). The block
walks K 64 at a time (one 128-byte swizzled row of bf16) through `stages` shared buffers, every thread issuing
cp.async copies of 16 bytes (8 bf16 of one row) of x and W (zeros past M, N and K) into the 128-byte swizzle
(wgmma.matrix_descriptor_sw128: chunk c of row r at chunk c ^ (r % 8); conflict-free both ways). Per slice each
warpgroup issues four wgmma.mma_async m64n{block_n}k16, its A the band's 64 rows of x, its B all block_n rows of W
(K-major: B's columns), and keeps that group in flight while the next slice's copies and wgmmas are issued.

The pipeline, slice kt (S stages, copies run S - 2 slices ahead):
    wait for my copies of slice kt; fence.proxy.async; barrier     (slice kt is in; everyone has waited for
                                                                     the wgmmas of slice kt - 2)
    copy slice kt + S - 2 into stage (kt - 2) % S                   (free: its wgmmas are done everywhere)
    wgmmas on stage kt % S; commit; wait until one group is left    (slice kt - 1's are done)
fence.proxy.async orders the copies (generic proxy writes) before the wgmma's reads (async proxy).

Blocks are numbered along M in groups of `group_m` block rows (the GEMM's W tiles then stay in L2 while a group's
x tiles pass), as Triton's grouped ordering. The dynamic shared memory starts on a 1,024-byte boundary (the
swizzle's atom) found at run time: the launch asks for 1 KB of slack.

Epilogue: once every wgmma is done the stages' memory holds the block's float32 output tile: each thread stashes its
accumulators there through the fragment layout (wgmma.accumulators_stash: constant indices, so the accumulators
stay registers), then the block writes whole rows of it to out (a warp 64 consecutive floats).

Error: as gemm_tc (its docstring): each bf16 product is exact in float32 and the sum of K of them is float32, so
|out - ref| <= K 2^-23 sum_k |x_k w_k| with ref the float64 sum (the unit roundoff doubled in case the tensor core
truncates). In the simulator the kernel runs on wgmma.py's twins (128 simulated threads a warpgroup): small shapes.
The twins land copies and products as late as the hardware may, both, so the simulator cannot show a stage
overwritten while a wgmma still reads it (a wait_group one too loose passes there); the GPU tests can.
"""
from dataclasses import dataclass
import functools

import numpy as np

from .activation import silu
from .bf16 import f32_to_bf16
from .common import SHARED_ALIGN, cdiv, cuda, flat_rows, jit, launch_with_shared, SIMULATOR
from .epilogues import FusedOutputs, SwiGLUEpilogue, fused_outputs
from .gemm_tc import H200_SMS
from .mma import cp_async_16, cp_async_commit, cp_async_wait_group, shared_view
from .wgmma import (SWIZZLE_ATOM_BYTES, SWIZZLE_ROW_BYTES, WARPGROUP, WGMMA_K, accumulators_stash, accumulators_zero,
                    check_n, compile_through_ptx_rewrite, fence_proxy_async, matrix_descriptor_sw128, shared_address,
                    wgmma_bf16, wgmma_commit, wgmma_fence, wgmma_route, wgmma_wait_group)

BAND = 64                                # rows a warpgroup's m64 wgmma covers
CHUNK = 8                                # bf16 per 16-byte copy: one swizzle chunk
BLOCK_K = SWIZZLE_ROW_BYTES // 2         # 64: K per shared stage, one swizzled row
CHUNKS_PER_ROW = BLOCK_K // CHUNK        # 8
K_STEPS = BLOCK_K // WGMMA_K             # 4 wgmmas a slice
K_STEP_BYTES = WGMMA_K * 2               # 32: the next k16 step's start within a swizzled row
STASH_PAD = 4                            # float32 a staged output row is padded by (fewer bank conflicts)


@dataclass(frozen=True)
class WgmmaTile:
    block_n: int = 256   # output features per block: the wgmma's N (block_n / 2 accumulators a thread)
    consumers: int = 2   # warpgroups per block, each a 64-row band: block_m = 64 consumers
    stages: int = 4      # shared buffers: copies run stages - 2 slices ahead of the wgmmas
    group_m: int = 8     # block rows per group of the block order

    @property
    def block_m(self) -> int:
        return BAND * self.consumers

    @property
    def threads(self) -> int:
        return WARPGROUP * self.consumers

    def shared_bytes(self) -> int:
        return self.stages * (self.block_m + self.block_n) * BLOCK_K * 2 + SWIZZLE_ATOM_BYTES  # + alignment slack

    def stash_bytes(self) -> int:
        """The float32 output tile staged for the epilogue, in the stages' memory once the K loop is done."""
        return self.block_m * (self.block_n + STASH_PAD) * 4

    def check(self) -> None:
        check_n(self.block_n)
        assert self.block_n % CHUNK == 0 and 1 <= self.consumers <= 4 and self.stages >= 3, self
        assert self.group_m >= 1, self
        assert self.shared_bytes() <= 227 * 1024, f"{self}: {self.shared_bytes()} B of shared memory, over 227 KB"
        assert self.stash_bytes() <= self.shared_bytes() - SWIZZLE_ATOM_BYTES, f"{self}: the output tile does not fit"


DEFAULT_TILE = WgmmaTile()
SIMULATOR_TILE = WgmmaTile(block_n=16, consumers=1, stages=3, group_m=2)
# Largest first; the smaller ones keep more K slices in flight a block (deeper stages), which is what a GEMM of a
# few hundred rows needs: it streams W, each block's work too short to hide a copy's latency any other way.
TILES = (DEFAULT_TILE, WgmmaTile(128, 2, 5), WgmmaTile(64, 2, 6), WgmmaTile(64, 1, 8))
FULL_WAVE = 0.7  # a tile with blocks for this share of the SMs keeps them busy enough (fitted to the sweep)


def tile_for(m: int, n: int, sm_count: int = H200_SMS) -> WgmmaTile:
    """The largest of TILES whose blocks fill FULL_WAVE of the SMs, else the one with the most blocks: the sweep's
    best or near it at the 1B model's projections from 128 to 4,096 rows (scripts/sweep_tc_gemm.py --wgmma-tiles)."""
    for tile in TILES:
        if cdiv(m, tile.block_m) * cdiv(n, tile.block_n) >= FULL_WAVE * sm_count:
            return tile
    return TILES[-1]


@jit(device=True)
def grouped_block(pid, m_blocks, n_blocks, group_m):
    """(block row, block column) of block `pid`: along M within groups of group_m block rows, then along N."""
    width = group_m * n_blocks
    first_m = (pid // width) * group_m
    rows = min(m_blocks - first_m, group_m)
    return first_m + (pid % width) % rows, (pid % width) // rows


@functools.cache
def gemm_wgmma_kernel(tile: WgmmaTile, route: str = "numba", swiglu: bool = False):
    """The kernel for one tile (every size a compile-time constant). One per route: route "ptx" compiles its
    overloads from rewritten PTX (wgmma.compile_through_ptx_rewrite), so they must not be numba's plain ones.
    `swiglu`: W is [Wg; Wu] (2 I rows) walked in gemm_tc's interleaved column order (column c the gate of feature
    c / 2 when even, its up when odd: tile row r from W row (r % 2) I + (n0 + r) / 2), and out is uint16 [M, I] =
    bf16(silu(gate) * up), gemm_tc's SwiGLU epilogue arithmetic on the same float32 gate and up."""
    tile.check()
    bm, bn, stages, threads, group_m = tile.block_m, tile.block_n, tile.stages, tile.threads, tile.group_m
    a_chunks, b_chunks = bm * CHUNKS_PER_ROW, bn * CHUNKS_PER_ROW
    accumulators = bn // 2
    # A stage is [rows, 64] bf16 in the swizzle, kept as [stages, rows * 8 chunks, 8] (3-D for cp_async_16)
    a_view = shared_view((stages, a_chunks, CHUNK))
    b_view = shared_view((stages, b_chunks, CHUNK))
    probe_view = shared_view((1, 1, CHUNK))
    b_start = stages * a_chunks * CHUNK  # bf16 into the aligned buffer: a multiple of 1,024 bytes
    stash_view = shared_view((bm, bn + STASH_PAD))
    mma = wgmma_bf16(bn)
    zero = accumulators_zero(accumulators)
    stash = accumulators_stash(bn)
    wait_previous_mma = wgmma_wait_group(1, accumulators)
    wait_all_mma = wgmma_wait_group(0, accumulators)
    wait_copies = cp_async_wait_group(stages - 3)
    wait_all_copies = cp_async_wait_group(0)
    pairs_per_row = bn // 2

    rows_per_round = threads // CHUNKS_PER_ROW  # 16 per warpgroup: a multiple of 8, so a thread's row % 8 stays
    a_rounds, b_rounds = bm // rows_per_round, cdiv(bn, rows_per_round)
    w_rows_per_round = rows_per_round // 2 if swiglu else rows_per_round  # SwiGLU: a thread's half of W stays too

    @jit(device=True)
    def copy_slice(x_flat, w_flat, a_tile, b_tile, stage, k0, chunk, kc, x_start, x_rows_left, w_start, w_rows_left,
                   x_round, w_round, in_features):
        """This thread's 16-byte copies of slice k0 of x's and W's tile rows into `stage`. Thread t copies K chunk
        kc = t % 8 of rows t // 8 + i rows_per_round, so its shared chunk (row 8 + (kc ^ row % 8)) and its global
        indices (x_start / w_start: the flat index of its first row at column 0) step by constants: one add each
        (64-bit index products per copy would cost more issue slots than the wgmmas leave). Zeros past M, N, K."""
        k = np.uint32(k0 + kc * CHUNK)
        k_inside = k < in_features
        for i in range(a_rounds):
            valid = k_inside and np.int32(i * rows_per_round) < x_rows_left
            index = np.uint32(x_start + np.uint32(i * x_round) + k)
            cp_async_16(a_tile, stage, chunk + i * threads, 0, x_flat, 0, index if valid else np.uint32(0),
                        16 if valid else 0)
        for i in range(b_rounds):
            if b_rounds * rows_per_round > bn and chunk + i * threads >= b_chunks:  # (compiled out when even)
                continue
            valid = k_inside and np.int32(i * w_rows_per_round) < w_rows_left
            index = np.uint32(w_start + np.uint32(i * w_round) + k)
            cp_async_16(b_tile, stage, chunk + i * threads, 0, w_flat, 0, index if valid else np.uint32(0),
                        16 if valid else 0)

    # Route "ptx" is not cached on disk: its kernels would have route "numba"'s cache key (the route is not in the
    # closure); the default route's are.
    @jit(**({} if route == "numba" else {"cache": False}))
    def kernel(x, w, x_flat, w_flat, out):
        smem = cuda.shared.array(0, np.uint16, alignment=SHARED_ALIGN)  # dynamic: tile.shared_bytes() at launch
        smem_f32 = cuda.shared.array(0, np.float32, alignment=SHARED_ALIGN)  # the same memory, for the epilogue
        base = shared_address(probe_view(smem, 0), 0, 0, 0)
        aligned = ((SWIZZLE_ATOM_BYTES - base % SWIZZLE_ATOM_BYTES) % SWIZZLE_ATOM_BYTES) // 2
        a_tile = a_view(smem, aligned)
        b_tile = b_view(smem, aligned + b_start)
        acc = cuda.local.array(accumulators, np.float32)
        zero(acc)
        num_tokens, in_features = x.shape
        out_features = w.shape[0]
        tid = cuda.threadIdx.x
        band = tid // WARPGROUP
        m_block, n_block = grouped_block(cuda.blockIdx.x, (num_tokens + bm - 1) // bm,
                                         (out_features + bn - 1) // bn, group_m)
        m0, n0 = m_block * bm, n_block * bn
        k_slices = (in_features + BLOCK_K - 1) // BLOCK_K
        row0, kc = tid // CHUNKS_PER_ROW, tid % CHUNKS_PER_ROW  # the thread's first tile row, its K chunk
        chunk = row0 * CHUNKS_PER_ROW + (kc ^ (row0 % 8))      # where that lands in the swizzled tile
        x_start = np.uint32((m0 + row0) * in_features)
        x_rows_left = np.int32(num_tokens - m0 - row0)
        x_round = np.uint32(rows_per_round * in_features)
        if swiglu:  # tile row r: W row (r % 2) I + (n0 + r) / 2 (n0 even)
            half = out_features // 2
            w_feature = (n0 + row0) // 2
            w_start = np.uint32(((row0 % 2) * half + w_feature) * in_features)
            w_rows_left = np.int32(half - w_feature)
        else:
            w_start = np.uint32((n0 + row0) * in_features)
            w_rows_left = np.int32(out_features - n0 - row0)
        w_round = np.uint32(w_rows_per_round * in_features)
        for s in range(stages - 2):
            if s < k_slices:
                copy_slice(x_flat, w_flat, a_tile, b_tile, s, s * BLOCK_K, chunk, kc, x_start, x_rows_left, w_start,
                           w_rows_left, x_round, w_round, in_features)
            cp_async_commit()
        # slice kt sits in stage kt % stages, slice kt + stages - 2 is copied into the stage two before it: both
        # kept as counters (a 64-bit modulo each slice is integer work the loop does not need)
        stage, ahead_stage = 0, stages - 2
        for kt in range(k_slices):
            wait_copies()
            fence_proxy_async()  # this thread's copies, visible to the async proxy the wgmma reads through
            cuda.syncthreads()   # everyone's slice kt is in; every warpgroup has waited for slice kt - 2's wgmmas
            if kt + stages - 2 < k_slices:
                copy_slice(x_flat, w_flat, a_tile, b_tile, ahead_stage, (kt + stages - 2) * BLOCK_K, chunk, kc,
                           x_start, x_rows_left, w_start, w_rows_left, x_round, w_round, in_features)
            cp_async_commit()  # (an empty group at the end keeps the wait count uniform)
            ahead_stage = ahead_stage + 1 if ahead_stage + 1 < stages else 0
            a_address = shared_address(a_tile, stage, band * BAND * CHUNKS_PER_ROW, 0)
            b_address = shared_address(b_tile, stage, 0, 0)
            wgmma_fence()
            for ks in range(K_STEPS):
                mma(acc, matrix_descriptor_sw128(a_address + ks * K_STEP_BYTES),
                    matrix_descriptor_sw128(b_address + ks * K_STEP_BYTES))
            wgmma_commit()
            wait_previous_mma(acc)
            stage = stage + 1 if stage + 1 < stages else 0
        wait_all_mma(acc)
        wait_all_copies()
        cuda.syncthreads()  # every warpgroup's wgmmas are done: the stages' memory takes the output tile
        # accumulator j of thread (warp, lane) of the band: row 16 warp + lane // 4 + 8 ((j // 2) % 2),
        # column 8 (j // 4) + 2 (lane % 4) + j % 2 (wgmma.fragment_position)
        staged = stash_view(smem_f32, aligned // 2)
        lane = tid % WARPGROUP
        stash(staged, acc, band * BAND + 16 * (lane // 32) + (lane % 32) // 4, 2 * (lane % 4))
        cuda.syncthreads()
        for pair in range(tid, bm * pairs_per_row, threads):  # a warp writes 64 consecutive floats of a row
            r, c = pair // pairs_per_row, 2 * (pair % pairs_per_row)
            row, col = m0 + r, n0 + c
            if swiglu:  # (gate, up) of feature col / 2 (col and 2 I even)
                if row < num_tokens and col < out_features:
                    out[row, col // 2] = f32_to_bf16(silu(staged[r, c]) * staged[r, c + 1])
            elif row < num_tokens:
                if col < out_features:
                    out[row, col] = staged[r, c]
                if col + 1 < out_features:
                    out[row, col + 1] = staged[r, c + 1]

    return kernel


def gemm_wgmma_fused(x, w_bits, epilogue=None, out=None, tile: WgmmaTile | None = None, route: str | None = None
                     ) -> FusedOutputs:
    """out = bf16(x) @ W.T on wgmma (x float32 [M, K], rounded to bf16 first as gemm_tc does, or uint16 bf16 bits;
    W uint16 [N, K] bf16 bits; both C-contiguous, K a multiple of 8: 16-byte copies). `epilogue`: None (out float32
    [M, N]) or SwiGLUEpilogue(bf16=True) (W = [Wg; Wu]: out uint16 [M, N / 2] = bf16(silu(gate) * up)). `route`:
    how the kernel gets its sm_90a code (wgmma.py; TINYVLLM_WGMMA_ROUTE unless given; the simulator ignores it).
    Returns the FusedOutputs written."""
    from .gemm_tc import to_bf16_rows
    tile = tile or (SIMULATOR_TILE if SIMULATOR else DEFAULT_TILE)
    route = route or wgmma_route()
    assert x.ndim == 2 and x.dtype in (np.float32, np.uint16), (x.shape, x.dtype)
    assert w_bits.ndim == 2 and w_bits.dtype == np.uint16, (
        f"gemm_wgmma reads bf16 weights (uint16 bits [N, K]), got {w_bits.dtype} {w_bits.shape}")
    swiglu = epilogue is not None
    assert not swiglu or (isinstance(epilogue, SwiGLUEpilogue) and epilogue.bf16), (
        f"gemm_wgmma takes None or SwiGLUEpilogue(bf16=True), not {epilogue!r}")
    num_tokens, in_features = x.shape
    out_features = w_bits.shape[0]
    assert w_bits.shape[1] == in_features, f"x is [M, {in_features}] but W is {w_bits.shape}: K differs"
    assert in_features % CHUNK == 0, f"gemm_wgmma copies 8 bf16 at a time: K {in_features} is not a multiple of 8"
    result = fused_outputs(x, w_bits, None, epilogue, out)
    if num_tokens == 0 or out_features == 0:
        return result
    x_bits = to_bf16_rows(x) if x.dtype == np.float32 else x
    assert x_bits.is_c_contiguous() and w_bits.is_c_contiguous(), "gemm_wgmma reads C-contiguous x and W"
    kernel = gemm_wgmma_kernel(tile, "numba" if SIMULATOR else route, swiglu)
    assert x_bits.size < 2**31 and w_bits.size < 2**31, (
        f"gemm_wgmma indexes x and W in 32 bits: {x_bits.shape} and {w_bits.shape} have 2^31 elements or more")
    args = (x_bits, w_bits, *flat_rows(x_bits, w_bits), result.out)
    if route == "ptx" and not SIMULATOR:
        compile_through_ptx_rewrite(kernel, args)
    blocks = cdiv(out_features, tile.block_n) * cdiv(num_tokens, tile.block_m)
    launch_with_shared(kernel, blocks, tile.threads, tile.shared_bytes(), *args)
    return result


def gemm_wgmma(x_bits, w_bits, out=None, tile: WgmmaTile | None = None, route: str | None = None):
    """out = x @ W.T on wgmma, float32 out (gemm_wgmma_fused without an epilogue). Returns out."""
    return gemm_wgmma_fused(x_bits, w_bits, out=out, tile=tile, route=route).out


def gemm_wgmma_ref(x_bits: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """numpy twin: the bf16 inputs decoded, float64 sums, float32 out."""
    import ml_dtypes
    x64 = x_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    w64 = w_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return (x64 @ w64.T).astype(np.float32)
