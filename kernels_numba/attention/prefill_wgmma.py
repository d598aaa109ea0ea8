"""Paged prefill attention on Hopper's wgmma: prefill_tc's FlashAttention-2, its two products warpgroup-wide.

    out[t, h] = sum_{j<=p} 2^(s_j - m) V[j, g] / sum_{j<=p} 2^(s_j - m),   s_j = bf16(q[t, h] scale log2 e) . K[j, g]

prefill_tc's contract, tiles, arithmetic and bits (its docstring has the math, the error bound and each
refinement); what differs is who multiplies. A block of `warpgroups` warpgroups owns a query tile of 64 warpgroups
(query, head) rows (row r: query r // group of the tile, head kv_head * group + r % group), warpgroup w the 64-row
band w. Q (scaled, rounded to bf16), and each key tile's K and V rows (bf16 pool rows copied by cp.async, two
`stages` stages, the next stages - 1 tiles in flight while this one is computed), sit in shared memory in the
128-byte swizzle
(wgmma.py). Per key tile of keys_per_tile keys, each warpgroup:
1. S = Q K^T: wgmma m64n{keys}k16 over head_dim, A the band's Q rows, B the K tile (K-major: a key row holds
   head_dim contiguous), both from shared memory; S lands in registers in the accumulator fragment, which is
   mma.sync's 16 x 8 fragment per warp: accumulator 4 n + e of a thread is prefill_tc's scores[n, e];
2. the causal mask, the online softmax and the rescale of the output accumulators: prefill_tc's code, the same
   operations in the same order on the same values;
3. acc += P V: wgmma m64n{head_dim}k16 per 16 keys, A = P from registers (S's accumulators 8 p .. 8 p + 7 packed
   to bf16 pairs are the A fragment of key step p), B = the V tile N-major (a key row holds head_dim contiguous:
   V is read as it was copied, imm-trans-b 1, wgmma.matrix_descriptor_sw128_mn).
Every wgmma adds its k16 step in K order, as mma.sync does: a row gets prefill_tc's bits (tests/test_wgmma.py
checks it on the GPU), so the plan may run either and stay batch invariant.

Blocks run the tiles heaviest first (blockIdx.x 0 takes the last tile, whose queries see the most keys): a long
prompt's causal work grows with the query's position, and the longest blocks started last would leave SMs idle
at the end.

Shared memory (dynamic, from a 1,024-byte boundary found at run time): rows of 64 bf16 (128 bytes, chunk c of row
r stored at chunk c ^ (r % 8)), head_dim / 64 column slices of each: Q's 64 warpgroups rows, then K and V of each
stage, keys_per_tile rows each: at head_dim 64, 2 warpgroups, 2 stages of 64 keys, 48 KB. The copies run
stages - 1 tiles ahead (one barrier a tile: after it, the stage the previous tile read takes the next copies).
"""
import functools

import numpy as np

from ..bf16 import f32_to_bf16
from ..common import SHARED_ALIGN, SIMULATOR, cuda, flat_rows, jit, launch_with_shared
from ..mma import cp_async_16, cp_async_commit, cp_async_wait_group, exp2_approx, pack_f32_bf16x2, shared_view
from ..wgmma import (SWIZZLE_ATOM_BYTES, SWIZZLE_ROW_BYTES, WARPGROUP, WGMMA_K, accumulators_zero,
                     compile_through_ptx_rewrite, fence_proxy_async, matrix_descriptor_sw128,
                     matrix_descriptor_sw128_mn, shared_address, wgmma_bf16, wgmma_bf16_rs, wgmma_commit, wgmma_fence,
                     wgmma_route, wgmma_wait_group)
from .paged_kv import _check_pool, _output
from .prefill import PrefillTiles, build_prefill_tiles
from .prefill_tc import TC_KEY_TILE, TC_WARPS, TcOptions, q_scale, quad_max, quad_sum, tc_queries_per_tile

BAND = 64                         # rows a warpgroup's m64 wgmma covers
SLICE = SWIZZLE_ROW_BYTES // 2    # 64 bf16: the columns of one swizzled row
CHUNK = 8                         # bf16 a 16-byte copy, one swizzle chunk
CHUNKS = SLICE // CHUNK           # 8 a swizzled row
K_STEP_BYTES = WGMMA_K * 2        # the next k16 step of S's K (head_dim) within a swizzled row
WARPGROUPS = TC_WARPS // 4        # prefill_tc's 128 rows a block: the same query tiles
KEY_TILE = TC_KEY_TILE            # prefill_tc's key tile: the same softmax steps, the same bits
STAGES = 2                        # K/V tiles in shared memory (more measured no faster: docs/wgmma.md)
OPTIONS = TcOptions()             # every refinement on: the bits of prefill_tc's default


def wgmma_attention_supported(head_dim: int, group: int, warpgroups: int = WARPGROUPS) -> bool:
    """Whether prefill_wgmma takes this shape: head_dim whole 128-byte rows (64 or 128), the group within a tile."""
    return head_dim % SLICE == 0 and head_dim <= 256 and group <= BAND * warpgroups


def shared_bytes(head_dim: int, warpgroups: int, keys_per_tile: int, stages: int) -> int:
    """Q's rows, then K and V of each stage, all head_dim / 64 slices of 128-byte rows; + the alignment slack."""
    slices = head_dim // SLICE
    return (BAND * warpgroups + 2 * stages * keys_per_tile) * slices * SWIZZLE_ROW_BYTES + SWIZZLE_ATOM_BYTES


@functools.cache
def paged_attention_prefill_wgmma_kernel(head_dim: int, group: int, block_size: int, warpgroups: int,
                                         keys_per_tile: int, stages: int, route: str = "numba"):
    """The kernel for one shape (every size a compile-time constant) and route (wgmma.py: route "ptx" compiles
    from rewritten PTX and is not cached on disk)."""
    assert wgmma_attention_supported(head_dim, group, warpgroups), (head_dim, group, warpgroups)
    assert keys_per_tile % 16 == 0 and keys_per_tile <= 256 and stages >= 2, (keys_per_tile, stages)
    assert shared_bytes(head_dim, warpgroups, keys_per_tile, stages) <= 227 * 1024, (
        f"prefill_wgmma: {warpgroups} warpgroups, {stages} stages of {keys_per_tile} keys at head_dim {head_dim} "
        f"do not fit 227 KB of shared memory")
    rows = BAND * warpgroups
    used_rows = (rows // group) * group  # rows past it: padding (the group does not divide the rows)
    threads = WARPGROUP * warpgroups
    slices = head_dim // SLICE
    key_steps = keys_per_tile // 16   # k steps of P @ V; also pairs of 8-key score tiles
    key_tiles = 2 * key_steps         # 8-key score tiles: accumulators 4 n .. 4 n + 3 of S
    dim_tiles = head_dim // 8         # 8-dim output tiles: accumulators 4 j .. 4 j + 3 of the output
    score_count = keys_per_tile // 2
    out_count = head_dim // 2
    word_count = keys_per_tile // 4  # P's bf16 pairs a thread
    minus_inf = np.float32(-np.inf)
    # rows of the shared buffer (128 bytes each): Q's slices, then K's and V's of stage 0, of stage 1, ...
    q_rows = rows * slices
    stage_rows = 2 * keys_per_tile * slices
    total_rows = q_rows + stages * stage_rows
    last_stage_row = q_rows + (stages - 1) * stage_rows
    wait_tile = cp_async_wait_group(stages - 2)  # the tile's copies landed; the stages - 2 after it may fly
    view = shared_view((total_rows, CHUNKS, CHUNK))
    probe_view = shared_view((1, 1, CHUNK))
    slice_bytes = keys_per_tile * SWIZZLE_ROW_BYTES  # a K or V slice: the next 64 dims of V (its LBO)

    mma_scores = wgmma_bf16(keys_per_tile)
    mma_output = wgmma_bf16_rs(head_dim)
    zero_scores = accumulators_zero(score_count)
    zero_output = accumulators_zero(out_count)
    wait_scores = wgmma_wait_group(0, score_count)
    wait_output = wgmma_wait_group(0, out_count)

    # A copy round: thread tid copies 16 bytes, chunk copy_chunk = tid % chunks of a key row (slice copy_chunk // 8),
    # rows copy_row + i copy_rows: copy_rows a multiple of 8, so the row's swizzle (row % 8) never changes
    chunks = head_dim // CHUNK
    copy_rows = threads // chunks
    copy_rounds = -(-keys_per_tile // copy_rows)
    assert copy_rows % 8 == 0 and copy_rows * chunks == threads, (copy_rows, chunks)
    some_rows_past = copy_rounds * copy_rows > keys_per_tile
    block_size_u = np.uint32(block_size)

    @jit(device=True)
    def copy_tile(k_flat, v_flat, table, row_len, key_start, key_len, smem, k_row0, copy_row, copy_dest, dest_chunk,
                  source_col):
        """This thread's 16-byte cp.async copies of a key tile's K and V rows (the K slices from shared row k_row0,
        V's after them), zero-filled past key_len (0 bytes read from the last key's row), in flight until the
        caller commits and waits for them; prefill_tc's copy_bf16_tile into the swizzle."""
        for i in range(copy_rounds):
            row = copy_row + i * copy_rows
            if some_rows_past and row >= keys_per_tile:  # (compiled out when the rows divide evenly)
                continue
            key = np.int32(key_start + row)
            size = 16 if key < key_len else 0
            key_u = np.uint32(min(key, key_len - 1))
            slot = np.uint32(np.uint32(table[key_u // block_size_u]) * block_size_u + key_u % block_size_u)
            source = np.uint64(slot) * row_len + source_col
            cp_async_16(smem, k_row0 + copy_dest + i * copy_rows, dest_chunk, 0, k_flat, 0, source, size)
            cp_async_16(smem, k_row0 + keys_per_tile * slices + copy_dest + i * copy_rows, dest_chunk, 0, v_flat, 0,
                        source, size)

    @jit(**({} if route == "numba" else {"cache": False}))
    def kernel(q, k_flat, v_flat, block_tables, tile_seq, tile_tokens, tile_positions, tile_key_len, scale, out):
        flat = cuda.shared.array(0, np.uint16, alignment=SHARED_ALIGN)  # dynamic: shared_bytes() at launch
        base = shared_address(probe_view(flat, 0), 0, 0, 0)
        smem = view(flat, ((SWIZZLE_ATOM_BYTES - base % SWIZZLE_ATOM_BYTES) % SWIZZLE_ATOM_BYTES) // 2)
        scores = cuda.local.array(score_count, np.float32)  # this thread's part of S, then of P
        acc = cuda.local.array(out_count, np.float32)       # its part of the output rows
        words = cuda.local.array(word_count, np.uint32)  # P as bf16 pairs: the A fragments of P V
        q_chunk = cuda.local.array(CHUNK, np.float32)
        tile = cuda.gridDim.x - 1 - cuda.blockIdx.x  # heaviest first (the module docstring)
        kv_head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        band = tid // WARPGROUP
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        quad = lane % 4
        seq = tile_seq[tile]
        key_len = tile_key_len[tile]
        if key_len == 0:  # a CUDA graph's padding tile: no query, nothing to write
            return
        column = kv_head * head_dim  # this KV head's first column of a pool row
        table = block_tables[seq]
        row_len = np.uint64(np.uint32(cuda.gridDim.y * head_dim))
        copy_row = tid // chunks
        copy_chunk = tid % chunks
        # the copy's shared row within a K (or V) tile: its slice's rows, then its row; chunk swizzled (row % 8)
        copy_dest = (copy_chunk // CHUNKS) * keys_per_tile + copy_row
        source_col = np.uint64(np.uint32(column + copy_chunk * CHUNK))
        copy_dest_chunk = (copy_chunk % CHUNKS) ^ (copy_row % 8)
        for s in range(stages - 1):  # key tiles 0 .. stages - 2 into their stages, landing while Q is stored
            if s * keys_per_tile < key_len:
                copy_tile(k_flat, v_flat, table, row_len, s * keys_per_tile, key_len, smem, q_rows + s * stage_rows,
                          copy_row, copy_dest, copy_dest_chunk, source_col)
            cp_async_commit()  # (empty past key_len: every tile's group keeps its place in the count)
        for i in range(tid, rows * chunks, threads):  # Q's rows by 16-byte chunks: 8 loads in flight at once
            r = i // chunks
            d0 = (i % chunks) * CHUNK
            t = tile_tokens[tile, r // group] if r < used_rows else -1
            if t >= 0:
                head = kv_head * group + r % group
                for e in range(CHUNK):
                    q_chunk[e] = q[t, head, d0 + e] * scale
            else:
                for e in range(CHUNK):
                    q_chunk[e] = np.float32(0.0)
            q_row = (d0 // SLICE) * rows + r
            q_col = ((d0 % SLICE) // CHUNK) ^ (r % 8)
            for e in range(CHUNK):
                smem[q_row, q_col, e] = f32_to_bf16(q_chunk[e])
        row_a = 16 * warp + g  # this thread's two rows
        row_b = row_a + 8
        pos_a = tile_positions[tile, row_a // group] if row_a < used_rows else np.int32(-1)  # -1: a padding row,
        pos_b = tile_positions[tile, row_b // group] if row_b < used_rows else np.int32(-1)  # no key
        max_a = minus_inf
        max_b = minus_inf
        sum_a = np.float32(0.0)  # this thread's columns only; the quad's four add up at the end
        sum_b = np.float32(0.0)
        zero_output(acc)
        q_address = shared_address(smem, band * BAND, 0, 0)  # the band's Q rows, slice 0

        key_start = np.int32(0)
        ahead_below = np.int32(key_len - (stages - 1) * keys_per_tile)  # key_start below it: a tile to copy ahead
        stage_row = q_rows  # the tile's first K row (its stage's); its V rows keys_per_tile slices on
        ahead_row = last_stage_row  # where tile + stages - 1 goes: the stage tile - 1 used
        while key_start < key_len:
            wait_tile()          # this thread's copies of the tile have landed
            fence_proxy_async()  # they (and Q's stores) are visible to the wgmmas' async proxy
            cuda.syncthreads()   # everyone's are; every warpgroup is done with tile - 1's stage
            if key_start < ahead_below:  # tile + stages - 1 into that stage, landing during the next ones
                copy_tile(k_flat, v_flat, table, row_len, key_start + (stages - 1) * keys_per_tile, key_len, smem,
                          ahead_row, copy_row, copy_dest, copy_dest_chunk, source_col)
            cp_async_commit()
            # 1. S = Q K^T for the band's 64 rows
            k_address = shared_address(smem, stage_row, 0, 0)
            zero_scores(scores)
            wgmma_fence()
            for s in range(slices):
                for ks in range(SLICE // WGMMA_K):
                    mma_scores(scores,
                               matrix_descriptor_sw128(q_address + s * rows * SWIZZLE_ROW_BYTES + ks * K_STEP_BYTES),
                               matrix_descriptor_sw128(k_address + s * slice_bytes + ks * K_STEP_BYTES))
            wgmma_commit()
            wait_scores(scores)
            # 2. causal mask, the rows' new max (the thread's columns, then its quad), P = 2^(S - m): prefill_tc's
            tile_max_a = minus_inf
            tile_max_b = minus_inf
            if key_start + (keys_per_tile - 1) > min(pos_a, pos_b):
                reach_a = np.int32(pos_a - key_start - 2 * quad)
                reach_b = np.int32(pos_b - key_start - 2 * quad)
                for n in range(key_tiles):
                    if 8 * n > reach_a:
                        scores[4 * n] = minus_inf
                    if 8 * n + 1 > reach_a:
                        scores[4 * n + 1] = minus_inf
                    if 8 * n > reach_b:
                        scores[4 * n + 2] = minus_inf
                    if 8 * n + 1 > reach_b:
                        scores[4 * n + 3] = minus_inf
            for n in range(key_tiles):
                tile_max_a = max(tile_max_a, max(scores[4 * n], scores[4 * n + 1]))
                tile_max_b = max(tile_max_b, max(scores[4 * n + 2], scores[4 * n + 3]))
            new_a = max(max_a, quad_max(tile_max_a))
            new_b = max(max_b, quad_max(tile_max_b))
            rescale_a = np.float32(1.0) if new_a == minus_inf else exp2_approx(max_a - new_a)
            rescale_b = np.float32(1.0) if new_b == minus_inf else exp2_approx(max_b - new_b)
            shift_a = np.float32(0.0) if new_a == minus_inf else new_a
            shift_b = np.float32(0.0) if new_b == minus_inf else new_b
            max_a = new_a
            max_b = new_b
            sum_a *= rescale_a
            sum_b *= rescale_b
            for n in range(key_tiles):
                scores[4 * n] = exp2_approx(scores[4 * n] - shift_a)
                scores[4 * n + 1] = exp2_approx(scores[4 * n + 1] - shift_a)
                scores[4 * n + 2] = exp2_approx(scores[4 * n + 2] - shift_b)
                scores[4 * n + 3] = exp2_approx(scores[4 * n + 3] - shift_b)
                sum_a += scores[4 * n] + scores[4 * n + 1]
                sum_b += scores[4 * n + 2] + scores[4 * n + 3]
            for j in range(dim_tiles):
                acc[4 * j] *= rescale_a
                acc[4 * j + 1] *= rescale_a
                acc[4 * j + 2] *= rescale_b
                acc[4 * j + 3] *= rescale_b
            # 3. acc += P V: key step p's A fragment is S's accumulators 8 p .. 8 p + 7 as bf16 pairs, all packed
            # before the fence (a register the wgmmas read, written after it, makes ptxas wait for each one)
            for p in range(key_steps):
                for w in range(4):
                    words[4 * p + w] = pack_f32_bf16x2(scores[8 * p + 2 * w], scores[8 * p + 2 * w + 1])
            v_address = k_address + slices * slice_bytes
            wgmma_fence()
            for p in range(key_steps):
                mma_output(acc, words[4 * p], words[4 * p + 1], words[4 * p + 2], words[4 * p + 3],
                           matrix_descriptor_sw128_mn(v_address + p * 16 * SWIZZLE_ROW_BYTES, slice_bytes))
            wgmma_commit()
            wait_output(acc)  # this stage is free for the copies after the next barrier
            ahead_row = stage_row
            stage_row = stage_row + stage_rows if stage_row < last_stage_row else q_rows
            key_start = np.int32(key_start + keys_per_tile)

        sum_a = quad_sum(sum_a)
        sum_b = quad_sum(sum_b)
        t_a = tile_tokens[tile, row_a // group] if row_a < used_rows else -1
        t_b = tile_tokens[tile, row_b // group] if row_b < used_rows else -1
        for j in range(dim_tiles):
            d = 8 * j + 2 * quad
            if t_a >= 0:
                out[t_a, kv_head * group + row_a % group, d] = acc[4 * j] / sum_a
                out[t_a, kv_head * group + row_a % group, d + 1] = acc[4 * j + 1] / sum_a
            if t_b >= 0:
                out[t_b, kv_head * group + row_b % group, d] = acc[4 * j + 2] / sum_b
                out[t_b, kv_head * group + row_b % group, d + 1] = acc[4 * j + 3] / sum_b

    return kernel


def build_prefill_wgmma_tiles(query_seq, query_pos, group: int, warpgroups: int = WARPGROUPS) -> PrefillTiles:
    """The query tiles paged_attention_prefill_wgmma wants (prefill_tc's for 4 warpgroups warps)."""
    return build_prefill_tiles(query_seq, query_pos, tc_queries_per_tile(group, 4 * warpgroups))


def paged_attention_prefill_wgmma(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None,
                                  tiles: PrefillTiles | None = None, warpgroups: int | None = None,
                                  keys_per_tile: int | None = None, stages: int | None = None,
                                  route: str | None = None):
    """paged_attention_prefill's contract on wgmma, with prefill_tc's arithmetic (its default TcOptions): bf16 pools
    (uint16 bits, C-contiguous: read flat), head_dim 64 or a multiple of it, the group at most 64 warpgroups
    rows. `tiles` from build_prefill_wgmma_tiles (built once per step) skips rebuilding them. Returns out."""
    num_tokens, n_heads, head_dim = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    assert query_seq.shape == (num_tokens,) and query_pos.shape == (num_tokens,), (query_seq.shape, query_pos.shape)
    assert k_pool.dtype == np.uint16 and v_pool.dtype == np.uint16, (
        f"prefill_wgmma copies bf16 pools (uint16 bits) as they are, got {k_pool.dtype}: use prefill_tc")
    _, block_size, n_kv_heads, _ = k_pool.shape
    group = n_heads // n_kv_heads
    warpgroups = WARPGROUPS if warpgroups is None else warpgroups
    keys_per_tile = KEY_TILE if keys_per_tile is None else keys_per_tile
    stages = STAGES if stages is None else stages
    assert wgmma_attention_supported(head_dim, group, warpgroups), (
        f"prefill_wgmma needs head_dim a multiple of {SLICE} (got {head_dim}) and a group of at most "
        f"{BAND * warpgroups} heads (got {group})")
    queries = tc_queries_per_tile(group, 4 * warpgroups)
    tiles = build_prefill_tiles(query_seq, query_pos, queries) if tiles is None else tiles
    assert tiles.tokens.shape[1] == queries, (
        f"tiles of {tiles.tokens.shape[1]} queries, prefill_wgmma wants {queries}: use build_prefill_wgmma_tiles")
    out = _output(q, out)
    assert k_pool.is_c_contiguous() and v_pool.is_c_contiguous(), (
        f"prefill_wgmma reads the pools as flat arrays: they must be C-contiguous (strides {k_pool.strides})")
    if tiles.num_tiles > 0:
        route = "numba" if SIMULATOR else (route or wgmma_route())
        kernel = paged_attention_prefill_wgmma_kernel(head_dim, group, block_size, warpgroups, keys_per_tile, stages,
                                                      route)
        args = (q, *flat_rows(k_pool, v_pool), block_tables, tiles.seq, tiles.tokens, tiles.positions, tiles.key_len,
                q_scale(scale, OPTIONS), out)
        if route == "ptx":
            compile_through_ptx_rewrite(kernel, args)
        launch_with_shared(kernel, (tiles.num_tiles, n_kv_heads), WARPGROUP * warpgroups,
                           shared_bytes(head_dim, warpgroups, keys_per_tile, stages), *args)
    return out
