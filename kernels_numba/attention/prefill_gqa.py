"""Paged prefill attention for GPUs: FlashAttention-2 on CUDA cores, a block per (query tile, KV head) for
all the group's query heads. The math and the pool layout: paged_kv; the query tiles: prefill.

- `paged_attention_prefill_gqa`: paged_attention_prefill's contract. A block owns one query tile x one KV
  head with ALL `group` query heads of that KV head:
  GQA_ROWS = 64 (query, head) rows (16 queries x 4 heads on Llama-3.2-1B; build_prefill_gqa_tiles), so each
  K/V tile in shared memory serves group x more rows. 128 threads = 16 row threads x 8 column threads; a
  thread owns a 4 rows x 4 keys tile of the scores and a 4 rows x 8 dims tile of the output, both in registers
  (the kernel comes from a factory with head_dim, group and the tile sizes as compile-time constants, so the
  micro-tile loops unroll). Per key tile of 32 positions: coalesced cooperative load of K (transposed) and V
  through precomputed pool rows; scores as outer products over head_dim from shared Q^T and K^T, causal mask
  to -inf; one thread per row raises the running max m, rescales l by exp(m_old - m_new) and turns scores
  into weights; every thread rescales its accumulators and adds weights @ V. Key tiles past the tile's last
  query are never loaded. Why it is faster: paged_attention_prefill runs 16-thread blocks, one head each,
  reloading each K/V tile per query head, and keeps q and the accumulator in local memory (a local and a
  shared load per FMA); here each shared load feeds 2-2.7 FMAs from registers, blocks are 8x wider and the
  group shares every tile.
"""
import functools
import math

import numpy as np

from ..common import SIMULATOR, cuda, jit, cdiv, launch_stream
from ..kv_dtype import kv_to_f32
from .paged_kv import _ix, _check_pool, _output, _pool_rows
from .prefill import PrefillTiles, build_prefill_tiles

# prefill_gqa tile sizes (upper bounds: gqa_shape shrinks the tiles to fit the shared memory). A simulated
# syncthreads costs ~2.5 ms per thread of the block, so the simulator gets 4-thread blocks and short tiles: the
# same index math and phases, and its few-dozen-key tests still cross several query and key tiles.
GQA_ROWS = 8 if SIMULATOR else 64         # (query, head) rows per block: 64 // group queries x group heads
GQA_KTILE = 8 if SIMULATOR else 32        # key positions per shared K/V tile
GQA_ROW_THREADS = 2 if SIMULATOR else 16  # threads across the block's rows
GQA_COL_THREADS = 2 if SIMULATOR else 8   # threads across a tile's keys (scores) and head_dim (output)
GQA_SHARED_BYTES = 48 * 1024              # static shared memory per block


@jit(device=True)
def _slot(block_tables, seq, key_pos, key_len, block_size):
    """The pool row (block * block_size + offset) of sequence seq's key key_pos; -1 from key_len on."""
    if key_pos >= key_len:
        return -1
    return block_tables[seq, key_pos // block_size] * block_size + key_pos % block_size


@functools.cache
def paged_attention_prefill_gqa_kernel(head_dim: int, group: int, block_size: int, queries_per_tile: int,
                                       keys_per_tile: int, row_threads: int, col_threads: int):
    """The prefill_gqa kernel for one shape: every size is a compile-time constant inside it, so the shared
    arrays have fixed shapes and each thread's score and output micro-tiles are registers (constant-trip loops,
    fully unrolled). Grid (query tiles, n_kv_heads), row_threads x col_threads threads. It reads the pools as
    rows of slots, k_rows = k_pool.reshape(num_blocks * block_size, n_kv_heads * head_dim).

    On the GPU (Llama-3.2-1B: head_dim 64, group 4, block 16): 64 rows x 32 keys, 128 threads, each with a
    4 x 4 score tile and a 4 x 8 output tile; shared 4 B x (64 x 65 Q + 64 x 33 K + 32 x 64 V + 32 x 68 scores
    + 4 x 64 row state + 32 slots) = 43 KB; ptxas (sm_90): 118 registers, no spills (Llama-3.2-3B/8B's
    head_dim 128 too), so 4 blocks (16 warps) per SM.
    """
    rows = queries_per_tile * group          # row r: query r // group of the tile, head kv_head * group + r % group
    threads = row_threads * col_threads
    rows_per_thread = rows // row_threads
    keys_per_thread = keys_per_tile // col_threads
    dims_per_thread = head_dim // col_threads
    assert rows_per_thread * row_threads == rows and keys_per_thread * col_threads == keys_per_tile
    assert dims_per_thread * col_threads == head_dim
    q_stride = rows + 1           # row strides of the shared arrays, padded so that the transposed stores
    k_stride = keys_per_tile + 1  # (consecutive threads, consecutive d) and the score stores (4 rows x 8 key
    p_stride = rows + 4           # columns per warp) fall in distinct banks
    q_rounds = cdiv(rows * head_dim, threads)
    kv_rounds = keys_per_tile * head_dim // threads
    assert kv_rounds * threads == keys_per_tile * head_dim, "every thread loads the same number of K/V floats"
    batch = math.gcd(kv_rounds, 4)  # K and V floats each thread loads before storing any: loads in flight

    # The two hot loops (scores over head_dim, weights @ V over a tile's keys) are `while` loops indexing
    # shared memory through _ix: numba's `for ... in range` counter hides the trip count from LLVM, and its
    # negative-index fix-up blocks address folding; written this way each step is its loads and FMAs plus
    # ~2 integer ops (checked in the PTX: ld.shared [reg+offset], the loop unrolled twice).
    @jit
    def kernel(q, k_rows, v_rows, block_tables, tile_seq, tile_tokens, tile_positions, tile_key_len, scale, out):
        tile = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        row0 = tid // col_threads  # this thread's rows: row0 + row_threads * i
        col0 = tid % col_threads   # its keys (scores) and head dims (output): col0 + col_threads * u
        seq = tile_seq[tile]
        key_len = tile_key_len[tile]  # the tile's highest query position + 1: no key beyond it is loaded
        # one shared array per line: the simulator aliases two declared on the same line
        q_t = cuda.shared.array((head_dim, q_stride), np.float32)       # scaled queries, transposed [d, row]
        k_t = cuda.shared.array((head_dim, k_stride), np.float32)       # the key tile, transposed [d, key]
        v_tile = cuda.shared.array((keys_per_tile, head_dim), np.float32)
        p_tile = cuda.shared.array((keys_per_tile, p_stride), np.float32)  # scores, then weights [key, row]
        slots = cuda.shared.array(keys_per_tile, np.int64)  # the key tile's pool rows; -1 past key_len
        row_pos = cuda.shared.array(rows, np.int32)        # the row's query position; -1: padding
        row_max = cuda.shared.array(rows, np.float32)      # running max m of the row's scores
        row_sum = cuda.shared.array(rows, np.float32)      # running sum l of exp(score - m)
        row_rescale = cuda.shared.array(rows, np.float32)  # exp(m_old - m_new) of the current key tile

        scores = cuda.local.array((rows_per_thread, keys_per_thread), np.float32)
        acc = cuda.local.array((rows_per_thread, dims_per_thread), np.float32)
        row_in = cuda.local.array(rows_per_thread, np.float32)
        key_in = cuda.local.array(keys_per_thread, np.float32)
        dim_in = cuda.local.array(dims_per_thread, np.float32)
        k_in = cuda.local.array(batch, np.float32)
        v_in = cuda.local.array(batch, np.float32)

        # The tile's queries, scaled once (so each score is a plain dot product); a group's heads are adjacent
        # in q, so consecutive threads read consecutive floats. Padding rows are zeros.
        for n in range(q_rounds):
            idx = n * threads + tid
            if idx < rows * head_dim:
                r = idx // head_dim
                d = idx % head_dim
                t = tile_tokens[tile, r // group]
                value = np.float32(0.0)
                if t >= 0:
                    value = q[t, kv_head * group + r % group, d] * scale
                q_t[d, r] = value
        for r in range(tid, rows, threads):  # row r's softmax state belongs to this thread throughout
            row_pos[r] = tile_positions[tile, r // group]
            row_max[r] = np.float32(-math.inf)
            row_sum[r] = np.float32(0.0)
        for j in range(tid, keys_per_tile, threads):
            slots[j] = _slot(block_tables, seq, j, key_len, block_size)
        for i in range(rows_per_thread):
            for e in range(dims_per_thread):
                acc[i, e] = np.float32(0.0)
        cuda.syncthreads()

        for key_start in range(0, key_len, keys_per_tile):
            tile_keys = min(keys_per_tile, key_len - key_start)
            # 1. K and V rows of the tile's slots; consecutive threads read consecutive floats of a row. Keys
            #    past key_len are zeros: their weight is 0, and 0 x garbage could be NaN.
            for first in range(0, kv_rounds, batch):
                for b in range(batch):  # all loads first, then all stores: `batch` loads in flight
                    idx = (first + b) * threads + tid
                    slot = slots[idx // head_dim]
                    k_in[b] = np.float32(0.0)
                    v_in[b] = np.float32(0.0)
                    if slot >= 0:
                        column = _ix(kv_head * head_dim + idx % head_dim)
                        k_in[b] = kv_to_f32(k_rows[_ix(slot), column])  # float32 or bf16 bits
                        v_in[b] = kv_to_f32(v_rows[_ix(slot), column])
                for b in range(batch):
                    idx = (first + b) * threads + tid
                    j = idx // head_dim
                    d = idx % head_dim
                    k_t[_ix(d), _ix(j)] = k_in[b]
                    v_tile[_ix(j), _ix(d)] = v_in[b]
            cuda.syncthreads()

            # 2. Scores: each thread's rows x keys outer products, one head dim at a time; causal mask -> -inf.
            for i in range(rows_per_thread):
                for u in range(keys_per_thread):
                    scores[i, u] = np.float32(0.0)
            d = 0
            while d < head_dim:  # hot loops: `while`, see the note above the kernel
                for i in range(rows_per_thread):
                    row_in[i] = q_t[_ix(d), _ix(row0 + row_threads * i)]
                for u in range(keys_per_thread):
                    key_in[u] = k_t[_ix(d), _ix(col0 + col_threads * u)]
                for i in range(rows_per_thread):
                    for u in range(keys_per_thread):
                        scores[i, u] += row_in[i] * key_in[u]
                d += 1
            for i in range(rows_per_thread):
                r = row0 + row_threads * i
                last_visible = row_pos[r] - key_start  # the row sees this tile's keys 0..last_visible
                for u in range(keys_per_thread):
                    j = col0 + col_threads * u
                    p_tile[j, r] = scores[i, u] if j <= last_visible else np.float32(-math.inf)
            cuda.syncthreads()

            # 3. Online softmax, one thread per row: raise m to the tile's max, rescale l, scores -> weights.
            #    Meanwhile the next key tile's slots (nobody reads `slots` between the load and its next use).
            for r in range(tid, rows, threads):
                old_max = row_max[r]
                new_max = old_max
                for j in range(tile_keys):
                    new_max = max(new_max, p_tile[_ix(j), _ix(r)])
                if new_max == -math.inf:  # no visible key yet (a padding row): weights 0, nothing to rescale
                    row_rescale[r] = np.float32(1.0)
                    for j in range(tile_keys):
                        p_tile[_ix(j), _ix(r)] = np.float32(0.0)
                else:
                    rescale = np.float32(math.exp(old_max - new_max))  # <= 1; exp(-inf) = 0 the first time
                    total = np.float32(0.0)
                    for j in range(tile_keys):
                        weight = np.float32(math.exp(p_tile[_ix(j), _ix(r)] - new_max))  # masked: exp(-inf) = 0
                        p_tile[_ix(j), _ix(r)] = weight
                        total += weight
                    row_sum[r] = row_sum[r] * rescale + total
                    row_max[r] = new_max
                    row_rescale[r] = rescale
            for j in range(tid, keys_per_tile, threads):
                slots[j] = _slot(block_tables, seq, key_start + keys_per_tile + j, key_len, block_size)
            cuda.syncthreads()

            # 4. acc = acc * rescale + weights @ V: each thread's rows x head dims, one key at a time.
            for i in range(rows_per_thread):
                rescale = row_rescale[row0 + row_threads * i]
                for e in range(dims_per_thread):
                    acc[i, e] *= rescale
            j = 0
            while j < tile_keys:
                for i in range(rows_per_thread):
                    row_in[i] = p_tile[_ix(j), _ix(row0 + row_threads * i)]
                for e in range(dims_per_thread):
                    dim_in[e] = v_tile[_ix(j), _ix(col0 + col_threads * e)]
                for i in range(rows_per_thread):
                    for e in range(dims_per_thread):
                        acc[i, e] += row_in[i] * dim_in[e]
                j += 1
            cuda.syncthreads()  # nobody reloads K, V or the weights while another thread still reads them

        for i in range(rows_per_thread):
            r = row0 + row_threads * i
            t = tile_tokens[tile, r // group]
            if t >= 0:
                inv_sum = np.float32(1.0) / row_sum[r]  # > 0: key 0 is visible to every real row
                for e in range(dims_per_thread):
                    out[t, kv_head * group + r % group, col0 + col_threads * e] = acc[i, e] * inv_sum

    return kernel


def gqa_shape(head_dim: int, group: int) -> tuple[int, int, int, int]:
    """(queries per tile, keys per tile, row threads, col threads) of paged_attention_prefill_gqa: GQA_ROWS //
    group queries and GQA_KTILE keys, halved (keys down to 16 first, then queries) until the shared arrays fit
    GQA_SHARED_BYTES. Llama-3.2-1B (head_dim 64, group 4): 16 queries x 32 keys on 16 x 8 threads."""
    queries, keys = max(1, GQA_ROWS // group), GQA_KTILE
    while _gqa_shared_bytes(head_dim, queries * group, keys) > GQA_SHARED_BYTES:
        assert keys > 1 or queries > 1, f"head_dim {head_dim} too large for prefill_gqa's shared memory"
        if keys > 16 or queries == 1:
            keys //= 2
        else:
            queries //= 2
    return (queries, keys, math.gcd(GQA_ROW_THREADS, queries * group),
            math.gcd(GQA_COL_THREADS, keys, head_dim))


def _gqa_shared_bytes(head_dim: int, rows: int, keys: int) -> int:
    floats = head_dim * (rows + 1) + head_dim * (keys + 1) + keys * head_dim + keys * (rows + 4) + 4 * rows
    return 4 * floats + 8 * keys  # float32 tiles and row state (row_pos counted as 4 B), int64 slots


def build_prefill_gqa_tiles(query_seq, query_pos, head_dim: int, group: int) -> PrefillTiles:
    """The query tiles paged_attention_prefill_gqa wants for this model shape (group = n_heads // n_kv_heads)."""
    return build_prefill_tiles(query_seq, query_pos, gqa_shape(head_dim, group)[0])


def paged_attention_prefill_gqa(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None,
                                tiles: PrefillTiles | None = None):
    """paged_attention_prefill's contract (query t of sequence query_seq[t] attends causally to that
    sequence's keys 0..query_pos[t]), built for GPUs: one block per (query tile, KV head) serving the
    group's query heads, FlashAttention-style register tiles. Pass `tiles` from build_prefill_gqa_tiles (built
    once per step, reused by every layer) to skip rebuilding them. Returns out."""
    num_tokens, n_heads, head_dim = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    assert query_seq.shape == (num_tokens,) and query_pos.shape == (num_tokens,), (query_seq.shape,
                                                                                   query_pos.shape)
    _, block_size, n_kv_heads, _ = k_pool.shape
    group = n_heads // n_kv_heads
    queries, keys, row_threads, col_threads = gqa_shape(head_dim, group)
    tiles = build_prefill_tiles(query_seq, query_pos, queries) if tiles is None else tiles
    assert tiles.tokens.shape[1] == queries, (
        f"tiles of {tiles.tokens.shape[1]} queries, prefill_gqa wants {queries}: use build_prefill_gqa_tiles")
    out = _output(q, out)
    if tiles.num_tiles > 0:
        kernel = paged_attention_prefill_gqa_kernel(head_dim, group, block_size, queries, keys, row_threads,
                                                    col_threads)
        kernel[(tiles.num_tiles, n_kv_heads), row_threads * col_threads, launch_stream()](
            q, *_pool_rows(k_pool, v_pool), block_tables, tiles.seq, tiles.tokens,
            tiles.positions, tiles.key_len, np.float32(scale), out)
    return out
