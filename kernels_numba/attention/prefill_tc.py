"""Paged prefill attention on tensor cores: FlashAttention-2 with bf16 mma.sync (fp32 accumulation), a block
per (query tile, KV head) for all the group's query heads. The math and the pool layout: paged_kv; the query
tiles: prefill. Runs the prefill attention of the fast precision (tinyvllm/runner/kernel_plan.py).

    out[t, h] = sum_{j<=p} 2^(s_j - m) V[j, g] / sum_{j<=p} 2^(s_j - m),   s_j = bf16(q[t, h] scale log2 e) . K[j, g]
              = softmax_j(scale q[t, h] . K[j, g]) V[j, g]   (e^x = 2^(x log2 e); K, V and the weights enter as bf16)

- `paged_attention_prefill_tc`: paged_attention_prefill's contract. A block's rows are (query, head) pairs,
  row r = query r // group of the tile, head kv_head * group + r % group, 16 rows per warp (one mma row tile).
  Q (scaled, rounded to bf16) goes to shared memory once and each warp keeps its A fragments for all of
  head_dim in registers. Per key tile of keys_per_tile positions (never past the tile's last query): the
  block puts the tile's K and V rows (through the block table) in shared memory as bf16: a float32 pool's
  rounded one element at a time, a bf16 pool's copied 16 bytes (8 bf16) at a time by cp.async, no rounding;
  two stages of K and V, so the copies of tile t + 1 are in flight while the warps compute on tile t (below);
  each warp computes S = Q K^T for its 16 rows (ldmatrix of K as B: K [key][dim] is B "col"), masks keys
  past each row's position to -inf, and runs the online softmax on its registers: a lane holds two
  rows (g and g + 8) and two columns of each 8-key tile, so a row's max is the lane's own max then two
  shfl_xor over the quad (lanes 4g .. 4g + 3); m rises, l and the output accumulators are rescaled by
  2^(m_old - m_new), and P = 2^(S - m) (scores in base 2, below) becomes, packed to bf16, the A fragments of
  P @ V directly (an mma's C layout over two 8-key tiles is the next mma's A layout over 16 keys). V's B
  fragments come from ldmatrix.trans of V [key][dim]. At the end each row's l is summed over its quad and
  out = acc / l.

The pipeline (TcOptions.pipelined): tile 0's copies are issued before Q is staged; then per tile t each thread
waits for its copies of tile t (cp.async.wait_group 0: the only group in flight), one syncthreads publishes them
to the block and also proves every warp has finished with the other stage (tile t - 1's, or Q's rows, which lie
over stage 1: Q is read into registers once, before the first tile), the copies of tile t + 1 go to that stage and
are committed as a group, and the warps compute tile t. One barrier a tile, as gemm_tc's loop. Shared memory: K
and V of two stages (4 x 64 rows x 72 bf16 = 36 KB at head_dim 64). A float32 pool's loader rounds with plain
stores, so it cannot overlap: it runs in the same loop, its waits empty.

The loop's integer work is kept to what a tile needs (the instruction counts offline: docs/bench-h200.md). Thread
tid copies the same places of every tile: column 8 (tid % chunks) of key rows tid // chunks + i (threads //
chunks), fixed before the loop, so a copy computes only its key's block and offset, in 32-bit unsigned arithmetic
(a shift and a mask for a power-of-two block size), from the sequence's row of the block table; keys past key_len
copy 0 bytes from the last key's row instead of branching around the lookup. The pools are read flat (the launcher
passes them as [1, size]: C-contiguous), a source index one 32 x 32 -> 64-bit multiply-add from the slot and the
thread's column (no 2^31-element limit). The loop steps key_start in int32 and flips the stage (not a signed
64-bit division, modulo and product a tile); the diagonal tiles' mask compares, in int32, each row's reach (its
position - key_start - 2 quad) with the constants 8 n and 8 n + 1; ldmatrix's constant offsets fold into its
immediate (mma._shared_address).

The exponentials (TcOptions.exp2): e^s = 2^(s log2 e), so the launcher hands the kernel scale * log2(e) (q_scale)
and every score comes out of the first mma in base 2; each weight and each rescale factor is then one subtraction
and one ex2.approx.ftz (mma.exp2_approx), not libdevice's expf (several instructions around the same ex2 to reach
1 ulp): 32 + 2 a lane per 64-key tile.

The softmax's other per-score work: P's weights go to bf16 two at a time by one cvt.rn.bf16x2.f32
(TcOptions.cvt_pack, mma.pack_f32_bf16x2: the same bits as f32_to_bf16's integer ops on each, then a pack), and
the causal mask's compares run only in a key tile that reaches past one of the lane's two rows
(TcOptions.mask_diagonal_only): in a long prompt every other tile is wholly at or before both rows' positions,
so none of its keys is masked (nor zero-filled: those lie past key_len, past every row).

The block order (TcOptions.heaviest_first): block 0 takes the last tile. A prompt's tiles are in position order and
a tile's work grows with its queries' positions (causal), so in launch order the longest blocks would start last
and leave SMs idle at the end; started first, the short ones fill in behind them. Each TcOptions field
can be turned off; lessons/prefill_tc_original.py is the kernel with all of them off.

Error against float64 attention softmax(ln 2 * q_r . k) on the same bf16-rounded q_r = q * scale * log2(e), K and
V: P enters the second mma rounded to bf16 (relative 2^-9) while l sums the float32 P, so |out - ref| <= 2^-8
sum_j p_j |v_j| / sum_j p_j plus float32 sums; tests/test_prefill_tc.py checks 2^-7 of it. ex2.approx adds about
2 ulp (2^-22) of relative error to each p_j, the same p_j in P's numerator and in l, so the output moves by at
most ~2^-21 of that weighted sum: 2^13 times below P's bf16 rounding (and weights below 2^-126 of the row's max,
flushed to 0, are as far below). Rounding q * scale * log2(e) instead of q * scale to bf16 is a different rounding
of the same relative size: against exp2=False (q * scale rounded, softmax(q_r . k)) the output differs by about as
much as either differs from float32 attention (~1e-2 at unit-variance inputs).
"""
from dataclasses import dataclass
import functools
import math

import numpy as np

from ..bf16 import f32_to_bf16
from ..common import SHARED_ALIGN, cuda, flat_rows, jit, launch_stream
from ..mma import (cp_async_16, cp_async_commit, cp_async_wait_all, exp2_approx, ldmatrix_x4, ldmatrix_x4_trans,
                   mma_bf16_m16n8k16, pack_bf16x2, pack_f32_bf16x2, shfl_xor)
from .paged_kv import _check_pool, _output
from .prefill import PrefillTiles, build_prefill_tiles

TC_WARPS = 8        # warps per block: 128 (query, head) rows (faster than 4 at 4096 tokens: docs/bench-h200.md)
TC_KEY_TILE = 64    # keys per shared K/V tile
ROW_PAD = 8         # bf16 per shared row of padding (16 bytes: ldmatrix rows in distinct banks)
Q_SLAB = 2          # Q's first slab: stage 1's K, then V and past them if Q needs more


TC_SHARED_BYTES = 48 * 1024  # static shared memory per block


@dataclass(frozen=True)
class TcOptions:
    """Which refinements of the kernel to compile (each its own paragraph in the module docstring); TC_OPTIONS, read
    at launch, is what runs; lessons/prefill_tc_original.py turns them all off, for side-by-side timing."""
    pipelined: bool = True  # a bf16 pool's tile t + 1 copied by cp.async while tile t is computed (two stages)
    exp2: bool = True       # log2(e) folded into q's scale, the softmax's exponentials one ex2.approx each
    cvt_pack: bool = True   # P's weights rounded to bf16 and packed two at a time by one cvt.rn.bf16x2.f32
    mask_diagonal_only: bool = True  # the causal mask's compares only in key tiles that reach past a lane's row
    heaviest_first: bool = True  # blocks take the tiles from the last (the most keys) to the first
    max_registers: int = 0  # a cap on registers a thread (0: the compiler's choice, over 128 at head_dim 64, so
                            # one 8-warp block an SM; 128 would let two in and ptxas fits the loop in 128 without
                            # spilling, but it does not run faster: docs/bench-h200.md)


TC_OPTIONS = TcOptions()
LN2 = math.log(2.0)


@jit(device=True)
def exp_f32(x):
    """e^x in float32 (libdevice's expf: the softmax's exponential under exp2=False)."""
    return np.float32(math.exp(x))


@jit(device=True)
def pack_rounded(lo, hi):
    """Two weights rounded to bf16 by f32_to_bf16's integer ops, then packed (P's packing under cvt_pack=False)."""
    return pack_bf16x2(f32_to_bf16(lo), f32_to_bf16(hi))


@jit(device=True)
def quad_max(x):
    """The max of x over this lane's quad (lanes 4 g .. 4 g + 3: the four holders of an mma fragment's row g)."""
    x = max(x, shfl_xor(x, 1))
    return max(x, shfl_xor(x, 2))


@jit(device=True)
def quad_sum(x):
    """The sum of x over this lane's quad."""
    x += shfl_xor(x, 1)
    return x + shfl_xor(x, 2)


def q_scale(scale: float, options: TcOptions) -> np.float32:
    """What the kernel multiplies q by before rounding it to bf16: scale, times log2(e) where the scores are to be
    exponentiated base 2 (2^(s log2 e) = e^s)."""
    return np.float32(scale / LN2 if options.exp2 else scale)


def tc_slabs(warps: int, keys_per_tile: int) -> int:
    """Shared slabs of keys_per_tile rows: K and V of two stages, Q over stage 1's (and more if it needs them)."""
    return Q_SLAB + max(2, -(-16 * warps // keys_per_tile))


def tc_shared_bytes(head_dim: int, warps: int, keys_per_tile: int) -> int:
    """bf16 K and V tiles of two stages, Q (16 rows a warp) over the second, rows padded."""
    return 2 * tc_slabs(warps, keys_per_tile) * keys_per_tile * (head_dim + ROW_PAD)


def tc_key_tile(head_dim: int, warps: int, keys_per_tile: int) -> int:
    """keys_per_tile, halved (down to 16) until the tiles fit TC_SHARED_BYTES (head_dim 128: 16 keys)."""
    while tc_shared_bytes(head_dim, warps, keys_per_tile) > TC_SHARED_BYTES:
        assert keys_per_tile > 16, f"head_dim {head_dim} with {warps} warps does not fit prefill_tc's shared memory"
        keys_per_tile //= 2
    return keys_per_tile


def tc_queries_per_tile(group: int, warps: int | None = None) -> int:
    """Queries per tile: as many whole groups of heads as warps x 16 rows hold; the rows left over (a group of 3
    heads, SmolLM2's, leaves 2 of 128) are padding rows that see no key and write nothing."""
    warps = TC_WARPS if warps is None else warps
    assert group <= 16 * warps, f"a group of {group} heads does not fit {warps} warps x 16 rows"
    return 16 * warps // group


@functools.cache
def paged_attention_prefill_tc_kernel(head_dim: int, group: int, block_size: int, warps: int, keys_per_tile: int,
                                      bf16_pool: bool = False, options: TcOptions = TC_OPTIONS):
    """The kernel for one shape (compile-time sizes: fixed shared shapes, unrolled fragment loops, fragments and
    accumulators in registers), pool dtype (bf16_pool: the key tile loader that copies bf16 rows as they are) and
    TcOptions."""
    assert head_dim % 16 == 0 and keys_per_tile % 16 == 0, (head_dim, keys_per_tile)
    rows = 16 * warps
    used_rows = (rows // group) * group  # rows past it: padding (the group does not divide the rows)
    threads = 32 * warps
    d_steps = head_dim // 16       # k steps of S = Q K^T; also pairs of 8-dim output tiles
    key_steps = keys_per_tile // 16  # k steps of P @ V; also pairs of 8-key score tiles
    key_tiles = 2 * key_steps      # 8-key score tiles (shapes of local arrays must be constants, not expressions)
    dim_tiles = 2 * d_steps        # 8-dim output tiles
    padded_dim = head_dim + ROW_PAD
    slabs = tc_slabs(warps, keys_per_tile)
    minus_inf = np.float32(-math.inf)
    chunks = head_dim // 8  # 16-byte pieces of a bf16 row
    pipelined = options.pipelined
    softmax_exp = exp2_approx if options.exp2 else exp_f32  # the scores' base: 2 (q scaled by log2 e) or e
    pack_p = pack_f32_bf16x2 if options.cvt_pack else pack_rounded
    mask_all_tiles = not options.mask_diagonal_only
    heaviest_first = options.heaviest_first

    # A bf16 pool's copies: round i of thread tid copies the 16 bytes at column copy_col = 8 (tid % chunks) of key row
    # copy_row + i copy_rows of the tile, copy_row = tid // chunks: fixed across tiles, so computed once (threads
    # from copy_rows x chunks on, where chunks does not divide the block's threads, copy nothing: copy_row =
    # keys_per_tile).
    copy_rows = threads // chunks
    copy_rounds = -(-keys_per_tile // copy_rows)
    some_rows_past = copy_rounds * copy_rows > keys_per_tile or copy_rows * chunks < threads
    block_size_u = np.uint32(block_size)

    @jit(device=True)
    def round_f32_tile(k_flat, v_flat, table, row_len, key_start, key_len, column, tid, kv, slab,
                       copy_row, copy_col, source_col):
        """A float32 pool's key tile as bf16 into slabs `slab` (K) and slab + 1 (V), one element per thread and step
        (zeros past key_len); plain stores, there when it returns."""
        for i in range(tid, keys_per_tile * head_dim, threads):
            j = i // head_dim
            d = i % head_dim
            key = key_start + j
            k_value = np.float32(0.0)
            v_value = np.float32(0.0)
            if key < key_len:
                slot = table[key // block_size] * block_size + key % block_size
                source = np.uint64(slot) * row_len + np.uint64(column + d)  # (numba types int64 x uint64 as
                                                                            # float64: unsigned on both sides)
                k_value = k_flat[0, source]
                v_value = v_flat[0, source]
            kv[slab, j, d] = f32_to_bf16(k_value)
            kv[slab + 1, j, d] = f32_to_bf16(v_value)

    @jit(device=True)
    def copy_bf16_tile(k_flat, v_flat, table, row_len, key_start, key_len, column, tid, kv, slab,
                       copy_row, copy_col, source_col):
        """A bf16 pool's key tile into slabs `slab` (K) and slab + 1 (V) as it is: this thread's 16-byte cp.async
        copies (rows copy_row + i copy_rows at column copy_col; source_col: the pool row's column there), zero-filled
        past key_len (0 bytes read from the last key's row: the lookup stays inside the table, no branch), in flight
        until the caller commits and waits for them. The key's block and offset in 32-bit unsigned arithmetic (a
        shift and a mask for a power-of-two block size), the pool index unsigned (no negative-index fix-ups): integer
        work kept to what a copy needs (the module docstring)."""
        for i in range(copy_rounds):
            row = copy_row + i * copy_rows
            if some_rows_past and row >= keys_per_tile:  # (compiled out when the rows divide evenly)
                continue
            key = np.int32(key_start + row)
            size = 16 if key < key_len else 0  # past key_len: zeros, from the last key's row (0 bytes read)
            key_u = np.uint32(min(key, key_len - 1))
            slot = np.uint32(np.uint32(table[key_u // block_size_u]) * block_size_u + key_u % block_size_u)
            source = np.uint64(slot) * row_len + source_col  # 32 x 32 -> 64 bits: one wide multiply-add
            cp_async_16(kv, slab, row, copy_col, k_flat, 0, source, size)
            cp_async_16(kv, slab + 1, row, copy_col, v_flat, 0, source, size)

    load_kv_tile = copy_bf16_tile if bf16_pool else round_f32_tile
    wait_landed = cp_async_wait_all  # all but 0 groups: the tile just waited for is the only one in flight

    @(jit(max_registers=options.max_registers) if options.max_registers else jit)
    def kernel(q, k_flat, v_flat, block_tables, tile_seq, tile_tokens, tile_positions, tile_key_len, scale, out):
        # slab 2 s: stage s's K tile, 2 s + 1 its V tile; Q's rows first, from slab Q_SLAB on (one array: the
        # simulator aliases shared arrays declared on one line, so keep one a line)
        kv = cuda.shared.array((slabs, keys_per_tile, padded_dim), np.uint16, alignment=SHARED_ALIGN)
        q_frag = cuda.local.array((d_steps, 4), np.uint32)
        scores = cuda.local.array((key_tiles, 4), np.float32)  # this lane's part of S, then of P
        acc = cuda.local.array((dim_tiles, 4), np.float32)       # this lane's part of the output rows
        tile = cuda.gridDim.x - 1 - cuda.blockIdx.x if heaviest_first else cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        quad = lane % 4
        seq = tile_seq[tile]
        key_len = tile_key_len[tile]
        if key_len == 0:  # a CUDA graph's padding tile: no query, nothing to write
            return
        column = kv_head * head_dim  # this KV head's first column of a pool row
        table = block_tables[seq]  # the sequence's row of block ids
        # a pool row holds every KV head's K (or V): n_kv_heads x head_dim, n_kv_heads the grid's rows of blocks
        row_len = np.uint64(np.uint32(cuda.gridDim.y * head_dim))
        copy_row = tid // chunks if tid < copy_rows * chunks else keys_per_tile
        copy_col = 8 * (tid % chunks)
        source_col = np.uint64(np.uint32(column + copy_col))
        if pipelined and key_len > 0:  # key tile 0 into stage 0, landing while Q goes to shared memory and registers
            load_kv_tile(k_flat, v_flat, table, row_len, 0, key_len, column, tid, kv, 0, copy_row, copy_col,
                         source_col)
            cp_async_commit()
        for i in range(tid, rows * head_dim, threads):
            r = i // head_dim
            d = i % head_dim
            t = tile_tokens[tile, r // group] if r < used_rows else -1
            value = np.float32(0.0)
            if t >= 0:
                value = q[t, kv_head * group + r % group, d] * scale
            kv[Q_SLAB + r // keys_per_tile, r % keys_per_tile, d] = f32_to_bf16(value)
        cuda.syncthreads()
        q_row = 16 * warp + lane % 16
        for s in range(d_steps):
            q_frag[s, 0], q_frag[s, 1], q_frag[s, 2], q_frag[s, 3] = ldmatrix_x4(
                kv, Q_SLAB + q_row // keys_per_tile, q_row % keys_per_tile, 16 * s + 8 * (lane // 16))
        row_a = 16 * warp + g  # this lane's two rows
        row_b = row_a + 8
        pos_a = tile_positions[tile, row_a // group] if row_a < used_rows else np.int32(-1)  # -1: a padding row,
        pos_b = tile_positions[tile, row_b // group] if row_b < used_rows else np.int32(-1)  # no key
        max_a = minus_inf
        max_b = minus_inf
        sum_a = np.float32(0.0)  # this lane's columns only; the quad's four add up at the end
        sum_b = np.float32(0.0)
        for j in range(dim_tiles):
            for e in range(4):
                acc[j, e] = np.float32(0.0)

        # Tile t (keys from key_start) sits in slabs k_slab (K) and k_slab + 1 (V), k_slab = 2 (t % 2) pipelined:
        # both counters, in int32, stepped each tile (a tile index's signed 64-bit modulo and product cost more).
        key_start = np.int32(0)
        next_tile_below = np.int32(key_len - keys_per_tile)  # key_start below it: a tile follows (int32 compares)
        k_slab = 0
        while key_start < key_len:
            # 1. the tile's K and V rows as bf16 in shared memory (zeros past key_len)
            if pipelined:
                wait_landed()       # this thread's copies of the tile (the only group in flight) have landed
                cuda.syncthreads()  # everyone's have; and every warp is done with the other stage (tile - 1, or Q)
                if key_start < next_tile_below:  # the next tile into the other stage, landing during this one
                    load_kv_tile(k_flat, v_flat, table, row_len, key_start + keys_per_tile, key_len, column, tid,
                                 kv, 2 - k_slab, copy_row, copy_col, source_col)
                cp_async_commit()  # (an empty group after the last: the wait's count stays the same)
            else:
                load_kv_tile(k_flat, v_flat, table, row_len, key_start, key_len, column, tid, kv, 0,
                             copy_row, copy_col, source_col)
                cp_async_commit()
                wait_landed()
                cuda.syncthreads()
            v_slab = k_slab + 1
            # 2. S = Q K^T for this warp's 16 rows: 8-key tiles n, k steps over head_dim
            for n in range(key_tiles):
                for e in range(4):
                    scores[n, e] = np.float32(0.0)
            for s in range(d_steps):
                for p in range(key_steps):
                    b0, b1, b2, b3 = ldmatrix_x4(kv, k_slab, 16 * p + lane % 8 + 8 * (lane // 16),
                                                 16 * s + 8 * ((lane // 8) % 2))
                    scores[2 * p, 0], scores[2 * p, 1], scores[2 * p, 2], scores[2 * p, 3] = mma_bf16_m16n8k16(
                        q_frag[s, 0], q_frag[s, 1], q_frag[s, 2], q_frag[s, 3], b0, b1,
                        scores[2 * p, 0], scores[2 * p, 1], scores[2 * p, 2], scores[2 * p, 3])
                    scores[2 * p + 1, 0], scores[2 * p + 1, 1], scores[2 * p + 1, 2], scores[2 * p + 1, 3] = (
                        mma_bf16_m16n8k16(q_frag[s, 0], q_frag[s, 1], q_frag[s, 2], q_frag[s, 3], b2, b3,
                                          scores[2 * p + 1, 0], scores[2 * p + 1, 1], scores[2 * p + 1, 2],
                                          scores[2 * p + 1, 3]))
            # 3. causal mask, the rows' new max (the lane's columns, then its quad), P = exp(S - m)
            tile_max_a = minus_inf
            tile_max_b = minus_inf
            if mask_all_tiles or key_start + (keys_per_tile - 1) > min(pos_a, pos_b):  # (padding rows: pos -1)
                # key key_start + 8 n + 2 quad (+ 1) is past a row's position where 8 n (+ 1) is past its reach
                reach_a = np.int32(pos_a - key_start - 2 * quad)
                reach_b = np.int32(pos_b - key_start - 2 * quad)
                for n in range(key_tiles):
                    if 8 * n > reach_a:
                        scores[n, 0] = minus_inf
                    if 8 * n + 1 > reach_a:
                        scores[n, 1] = minus_inf
                    if 8 * n > reach_b:
                        scores[n, 2] = minus_inf
                    if 8 * n + 1 > reach_b:
                        scores[n, 3] = minus_inf
            # (else every key of the tile is at or before both rows' positions, so before key_len: none masked)
            for n in range(key_tiles):
                tile_max_a = max(tile_max_a, max(scores[n, 0], scores[n, 1]))
                tile_max_b = max(tile_max_b, max(scores[n, 2], scores[n, 3]))
            new_a = max(max_a, quad_max(tile_max_a))
            new_b = max(max_b, quad_max(tile_max_b))
            # no visible key yet (padding rows, or before key 0): nothing to rescale, weights 0
            rescale_a = np.float32(1.0) if new_a == minus_inf else softmax_exp(max_a - new_a)
            rescale_b = np.float32(1.0) if new_b == minus_inf else softmax_exp(max_b - new_b)
            shift_a = np.float32(0.0) if new_a == minus_inf else new_a
            shift_b = np.float32(0.0) if new_b == minus_inf else new_b
            max_a = new_a
            max_b = new_b
            sum_a *= rescale_a
            sum_b *= rescale_b
            for n in range(key_tiles):
                scores[n, 0] = softmax_exp(scores[n, 0] - shift_a)  # masked: exp(-inf) = 0
                scores[n, 1] = softmax_exp(scores[n, 1] - shift_a)
                scores[n, 2] = softmax_exp(scores[n, 2] - shift_b)
                scores[n, 3] = softmax_exp(scores[n, 3] - shift_b)
                sum_a += scores[n, 0] + scores[n, 1]
                sum_b += scores[n, 2] + scores[n, 3]
            for j in range(dim_tiles):
                acc[j, 0] *= rescale_a
                acc[j, 1] *= rescale_a
                acc[j, 2] *= rescale_b
                acc[j, 3] *= rescale_b
            # 4. acc += P @ V: P's A fragments from two 8-key score tiles, V's B fragments by ldmatrix.trans
            for p in range(key_steps):
                a0 = pack_p(scores[2 * p, 0], scores[2 * p, 1])
                a1 = pack_p(scores[2 * p, 2], scores[2 * p, 3])
                a2 = pack_p(scores[2 * p + 1, 0], scores[2 * p + 1, 1])
                a3 = pack_p(scores[2 * p + 1, 2], scores[2 * p + 1, 3])
                for s in range(d_steps):
                    b0, b1, b2, b3 = ldmatrix_x4_trans(kv, v_slab, 16 * p + lane % 16, 16 * s + 8 * (lane // 16))
                    acc[2 * s, 0], acc[2 * s, 1], acc[2 * s, 2], acc[2 * s, 3] = mma_bf16_m16n8k16(
                        a0, a1, a2, a3, b0, b1, acc[2 * s, 0], acc[2 * s, 1], acc[2 * s, 2], acc[2 * s, 3])
                    acc[2 * s + 1, 0], acc[2 * s + 1, 1], acc[2 * s + 1, 2], acc[2 * s + 1, 3] = mma_bf16_m16n8k16(
                        a0, a1, a2, a3, b2, b3, acc[2 * s + 1, 0], acc[2 * s + 1, 1], acc[2 * s + 1, 2],
                        acc[2 * s + 1, 3])
            if pipelined:
                k_slab = 2 - k_slab
            else:
                cuda.syncthreads()  # nobody reloads K and V while another warp still reads them
            key_start = np.int32(key_start + keys_per_tile)

        sum_a = quad_sum(sum_a)
        sum_b = quad_sum(sum_b)
        t_a = tile_tokens[tile, row_a // group] if row_a < used_rows else -1
        t_b = tile_tokens[tile, row_b // group] if row_b < used_rows else -1
        for j in range(dim_tiles):
            d = 8 * j + 2 * quad
            if t_a >= 0:  # > 0: key 0 is visible to every real row
                out[t_a, kv_head * group + row_a % group, d] = acc[j, 0] / sum_a
                out[t_a, kv_head * group + row_a % group, d + 1] = acc[j, 1] / sum_a
            if t_b >= 0:
                out[t_b, kv_head * group + row_b % group, d] = acc[j, 2] / sum_b
                out[t_b, kv_head * group + row_b % group, d + 1] = acc[j, 3] / sum_b

    return kernel


def build_prefill_tc_tiles(query_seq, query_pos, group: int, warps: int | None = None) -> PrefillTiles:
    """The query tiles paged_attention_prefill_tc wants (group = n_heads // n_kv_heads)."""
    return build_prefill_tiles(query_seq, query_pos, tc_queries_per_tile(group, warps))


def paged_attention_prefill_tc(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None,
                               tiles: PrefillTiles | None = None, warps: int | None = None,
                               keys_per_tile: int | None = None, options: TcOptions | None = None):
    """paged_attention_prefill's contract on tensor cores (bf16 q * scale, K, V and P into the mmas, float32
    accumulation and softmax); the pools float32 (rounded to bf16 on the way in) or bf16 bits (copied). head_dim a
    multiple of 16; the group at most warps x 16 rows; the pools C-contiguous (read flat). Pass `tiles`
    from build_prefill_tc_tiles (built once per step) to skip rebuilding them; `options` (default TC_OPTIONS,
    read now) picks the kernel's refinements. Returns out."""
    num_tokens, n_heads, head_dim = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    assert query_seq.shape == (num_tokens,) and query_pos.shape == (num_tokens,), (query_seq.shape, query_pos.shape)
    assert head_dim % 16 == 0, f"prefill_tc needs head_dim a multiple of 16, got {head_dim}"
    _, block_size, n_kv_heads, _ = k_pool.shape
    group = n_heads // n_kv_heads
    warps = TC_WARPS if warps is None else warps
    keys_per_tile = tc_key_tile(head_dim, warps, TC_KEY_TILE if keys_per_tile is None else keys_per_tile)
    queries = tc_queries_per_tile(group, warps)
    tiles = build_prefill_tiles(query_seq, query_pos, queries) if tiles is None else tiles
    assert tiles.tokens.shape[1] == queries, (
        f"tiles of {tiles.tokens.shape[1]} queries, prefill_tc wants {queries}: use build_prefill_tc_tiles")
    out = _output(q, out)
    assert k_pool.is_c_contiguous() and v_pool.is_c_contiguous(), (
        f"prefill_tc reads the pools as flat arrays: they must be C-contiguous (strides {k_pool.strides}, "
        f"{v_pool.strides})")
    if tiles.num_tiles > 0:
        options = TC_OPTIONS if options is None else options
        kernel = paged_attention_prefill_tc_kernel(head_dim, group, block_size, warps, keys_per_tile,
                                                   k_pool.dtype == np.uint16, options)
        kernel[(tiles.num_tiles, n_kv_heads), 32 * warps, launch_stream()](
            q, *flat_rows(k_pool, v_pool), block_tables, tiles.seq, tiles.tokens, tiles.positions, tiles.key_len,
            q_scale(scale, options), out)
    return out
