"""PagedAttention: causal grouped-query attention over a block-paged float32 KV pool, online softmax.

    out[t, h] = sum_{j<=p} softmax_j(scale * q[t, h] . K(s, j)[g]) V(s, j)[g]
        s = the query's sequence, p = its position, g = h // (n_heads // n_kv_heads),
        K(s, j) = k_pool[block_tables[s, j // block_size], j % block_size]

KV pool per layer: k_pool, v_pool float32 [num_blocks, block_size, n_kv_heads, head_dim]. A slot is
`block_id * block_size + offset`; a sequence's row of block_tables (int32 [num_seqs, max_blocks_per_seq],
-1 padded) lists its physical blocks in logical order, so blocks need not be contiguous and several
sequences may share the same prefix blocks.

- `write_kv_paged`: copies k and v into their slot, one thread per (token, kv head, d) on the GPU (grid-stride,
  so the simulator can run a small grid); slot -1 = padding, skipped.
- `paged_attention_per_query`: varlen queries, one thread per (query, head): query t of sequence s at
  position p walks s's blocks over keys 0..p, keeping a running max m, a running sum l and the head_dim
  accumulator in a cuda.local.array; when a score raises m, l and the accumulator are rescaled by
  exp(m_old - m_new), so exp never sees a positive argument. No shared memory, no syncthreads. Grid:
  grid_stride_launch(T * n_heads, THREADS), so the simulator can run a small grid. It serves decode
  (`paged_attention_decode`: one query per sequence at its newest position) and, in the simulator where
  syncthreads cost milliseconds, prefill too.
- `paged_attention_prefill`: varlen queries of any number of sequences (chunked prefill and prefix-cache
  hits included: keys come from the pool, the new tokens' K/V are written with write_kv_paged first).
  The host groups each sequence's queries, sorted by position, into query tiles of up to QTILE tokens
  (`build_prefill_tiles`; a tile never spans two sequences). Grid (num_tiles, n_heads), QTILE threads per
  block, thread i owning the tile's i-th query. The block walks key tiles of KTILE positions up to its
  highest query position: all threads load the tile's K and V through the block table into shared memory,
  syncthreads, each thread scores its query against the keys it may see (causal), rescales its running
  (m, l, acc) once per key tile by the tile's max, accumulates, syncthreads, next key tile. Scores only
  ever exist for one KTILE at a time: no T x T matrix is materialised.
- `paged_attention_split_keys`: the same varlen contract as per_query, but one BLOCK per (query, head)
  (grid (T, n_heads), SPLIT_THREADS threads) instead of one thread: thread i walks keys i, i + n, i + 2n, ...
  (neighbouring threads read neighbouring key rows) with its own online-softmax state (m_i, l_i, acc_i).
  The block then merges: m_i and l_i go to shared memory, every thread computes M = max_i m_i and
  L = sum_i l_i exp(m_i - M); the accumulators are summed MERGE_DIMS dimensions at a time through a shared
  [SPLIT_THREADS_MAX, MERGE_DIMS] array, each scaled by exp(m_i - M), and divided by L. A thread that got no
  key has m_i = -inf, l_i = 0 and weighs exp(-inf) = 0; key 0 always exists, so M is finite. Per_query
  leaves a decode step with T * n_heads busy threads (32 at batch 1 on Llama-3.2-1B) each walking the
  whole context serially; here T * n_heads blocks of SPLIT_THREADS threads share that walk, so long
  contexts fill the GPU and each thread's serial chain is context / SPLIT_THREADS keys long.
"""
from dataclasses import dataclass
import math

import numpy as np

from .common import SIMULATOR, cuda, jit, cdiv, grid_stride_launch, launch_stream, device_empty

THREADS = 128
MAX_HEAD_DIM = 256  # size of the per-thread accumulators: cuda.local.array needs a compile-time size
QTILE = 16  # queries per prefill block (one thread each)
KTILE = 16  # key positions per shared-memory tile
SPLIT_THREADS_MAX = 128  # rows of the split-keys merge buffers (shared sizes are compile-time constants)
SPLIT_THREADS = 4 if SIMULATOR else SPLIT_THREADS_MAX  # threads sharing one (query, head); each syncthreads
#                                                        costs milliseconds in the simulator
MERGE_DIMS = 32  # head_dim columns merged per round: SPLIT_THREADS_MAX x MERGE_DIMS x 4 B = 16 KB of shared


@jit
def write_kv_paged_kernel(k, v, k_pool, v_pool, slot_mapping):
    num_tokens, n_kv_heads, head_dim = k.shape
    block_size = k_pool.shape[1]
    for i in range(cuda.grid(1), num_tokens * n_kv_heads * head_dim, cuda.gridsize(1)):
        t = i // (n_kv_heads * head_dim)
        kv_head = (i // head_dim) % n_kv_heads
        d = i % head_dim
        slot = slot_mapping[t]
        if slot < 0:  # padding token
            continue
        k_pool[slot // block_size, slot % block_size, kv_head, d] = k[t, kv_head, d]
        v_pool[slot // block_size, slot % block_size, kv_head, d] = v[t, kv_head, d]


@jit(device=True)
def attend_to_key(q_scaled, k_pool, v_pool, block, offset, kv_head, head_dim, acc, running_max, running_sum):
    """One online-softmax step: fold key/value (block, offset) into acc, return the new (max, sum)."""
    score = np.float32(0.0)
    for d in range(head_dim):
        score += q_scaled[d] * k_pool[block, offset, kv_head, d]
    if score > running_max:
        correction = np.float32(math.exp(running_max - score))  # exp(-inf) = 0 on the first key
        running_sum *= correction
        for d in range(head_dim):
            acc[d] *= correction
        running_max = score
    weight = np.float32(math.exp(score - running_max))
    running_sum += weight
    for d in range(head_dim):
        acc[d] += weight * v_pool[block, offset, kv_head, d]
    return running_max, running_sum


@jit
def paged_attention_per_query_kernel(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out):
    num_queries, n_heads, head_dim = q.shape
    block_size = k_pool.shape[1]
    q_scaled = cuda.local.array(MAX_HEAD_DIM, np.float32)
    acc = cuda.local.array(MAX_HEAD_DIM, np.float32)
    for i in range(cuda.grid(1), num_queries * n_heads, cuda.gridsize(1)):
        t = i // n_heads
        h = i % n_heads
        kv_head = h // (n_heads // k_pool.shape[2])
        b = query_seq[t]
        context_len = query_pos[t] + 1  # causal: keys 0..position

        for d in range(head_dim):
            q_scaled[d] = q[t, h, d] * scale  # scale once here, so each score is a plain dot product
            acc[d] = np.float32(0.0)
        running_max = np.float32(-math.inf)
        running_sum = np.float32(0.0)

        for logical_block in range((context_len + block_size - 1) // block_size):
            block = block_tables[b, logical_block]
            for offset in range(min(block_size, context_len - logical_block * block_size)):
                running_max, running_sum = attend_to_key(q_scaled, k_pool, v_pool, block, offset, kv_head,
                                                         head_dim, acc, running_max, running_sum)

        inv_sum = np.float32(1.0) / running_sum
        for d in range(head_dim):
            out[t, h, d] = acc[d] * inv_sum


@jit
def paged_attention_prefill_kernel(q, k_pool, v_pool, block_tables, tile_seq, tile_tokens, tile_positions,
                                   tile_key_len, scale, out):
    tile = cuda.blockIdx.x
    h = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    n_heads = q.shape[1]
    head_dim = q.shape[2]
    block_size = k_pool.shape[1]
    kv_head = h // (n_heads // k_pool.shape[2])
    seq = tile_seq[tile]
    key_len = tile_key_len[tile]  # the tile's highest query position + 1: no key beyond it is loaded
    t = tile_tokens[tile, tid]    # -1: a padding thread; it still loads tiles and meets every syncthreads
    pos = tile_positions[tile, tid]  # -1 for padding, so it sees no key
    # one shared array per line: the simulator aliases two declared on the same line
    k_tile = cuda.shared.array((KTILE, MAX_HEAD_DIM), np.float32)
    v_tile = cuda.shared.array((KTILE, MAX_HEAD_DIM), np.float32)

    q_scaled = cuda.local.array(MAX_HEAD_DIM, np.float32)
    acc = cuda.local.array(MAX_HEAD_DIM, np.float32)
    scores = cuda.local.array(KTILE, np.float32)
    for d in range(head_dim):
        q_scaled[d] = q[t, h, d] * scale if t >= 0 else np.float32(0.0)
        acc[d] = np.float32(0.0)
    running_max = np.float32(-math.inf)
    running_sum = np.float32(0.0)

    for key_start in range(0, key_len, KTILE):
        tile_keys = min(KTILE, key_len - key_start)
        for idx in range(tid, tile_keys * head_dim, n_threads):
            j = idx // head_dim
            d = idx % head_dim
            key_pos = key_start + j
            block = block_tables[seq, key_pos // block_size]
            k_tile[j, d] = k_pool[block, key_pos % block_size, kv_head, d]
            v_tile[j, d] = v_pool[block, key_pos % block_size, kv_head, d]
        cuda.syncthreads()

        visible = min(tile_keys, pos + 1 - key_start)  # causal: keys key_start..pos of this tile
        if visible > 0:
            tile_max = np.float32(-math.inf)
            for j in range(visible):
                score = np.float32(0.0)
                for d in range(head_dim):
                    score += q_scaled[d] * k_tile[j, d]
                scores[j] = score
                tile_max = max(tile_max, score)
            if tile_max > running_max:
                correction = np.float32(math.exp(running_max - tile_max))  # exp(-inf) = 0 on the first tile
                running_sum *= correction
                for d in range(head_dim):
                    acc[d] *= correction
                running_max = tile_max
            for j in range(visible):
                weight = np.float32(math.exp(scores[j] - running_max))
                running_sum += weight
                for d in range(head_dim):
                    acc[d] += weight * v_tile[j, d]
        cuda.syncthreads()  # nobody reloads the tile while another thread still reads it

    if t >= 0:
        inv_sum = np.float32(1.0) / running_sum
        for d in range(head_dim):
            out[t, h, d] = acc[d] * inv_sum


@jit
def paged_attention_split_keys_kernel(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out):
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    head_dim = q.shape[2]
    block_size = k_pool.shape[1]
    kv_head = h // (q.shape[1] // k_pool.shape[2])
    b = query_seq[t]
    context_len = query_pos[t] + 1  # causal: keys 0..position
    # one shared array per line: the simulator aliases two declared on the same line
    thread_max = cuda.shared.array(SPLIT_THREADS_MAX, np.float32)
    thread_sum = cuda.shared.array(SPLIT_THREADS_MAX, np.float32)
    merge = cuda.shared.array((SPLIT_THREADS_MAX, MERGE_DIMS), np.float32)

    q_scaled = cuda.local.array(MAX_HEAD_DIM, np.float32)
    acc = cuda.local.array(MAX_HEAD_DIM, np.float32)
    for d in range(head_dim):
        q_scaled[d] = q[t, h, d] * scale  # scale once here, so each score is a plain dot product
        acc[d] = np.float32(0.0)
    running_max = np.float32(-math.inf)  # stays -inf, with running_sum 0, for a thread that gets no key
    running_sum = np.float32(0.0)

    for j in range(tid, context_len, n_threads):
        block = block_tables[b, j // block_size]
        offset = j % block_size
        running_max, running_sum = attend_to_key(q_scaled, k_pool, v_pool, block, offset, kv_head, head_dim,
                                                 acc, running_max, running_sum)

    thread_max[tid] = running_max
    thread_sum[tid] = running_sum
    cuda.syncthreads()
    block_max = np.float32(-math.inf)
    for i in range(n_threads):
        block_max = max(block_max, thread_max[i])  # finite: thread 0 always has key 0
    total = np.float32(0.0)
    for i in range(n_threads):
        total += thread_sum[i] * np.float32(math.exp(thread_max[i] - block_max))
    own_weight = np.float32(math.exp(running_max - block_max))  # 0 for a thread without keys
    inv_total = np.float32(1.0) / total

    for d_start in range(0, head_dim, MERGE_DIMS):
        width = min(MERGE_DIMS, head_dim - d_start)
        for d in range(width):
            merge[tid, d] = acc[d_start + d] * own_weight
        cuda.syncthreads()
        for d in range(tid, width, n_threads):  # thread d sums column d over the block's threads
            column = np.float32(0.0)
            for i in range(n_threads):
                column += merge[i, d]
            out[t, h, d_start + d] = column * inv_total
        cuda.syncthreads()  # nobody overwrites the buffer while another thread still sums it


@dataclass
class PrefillTiles:
    """Device arrays describing the prefill query tiles; build once per step, reuse for every layer."""
    seq: object        # int32 [num_tiles]: the tile's row of block_tables
    tokens: object     # int32 [num_tiles, QTILE]: query token indices into q, -1 padded
    positions: object  # int32 [num_tiles, QTILE]: their absolute positions, -1 padded
    key_len: object    # int32 [num_tiles]: highest position in the tile + 1
    num_tiles: int


def build_prefill_tiles(query_seq, query_pos) -> PrefillTiles:
    """Group queries by sequence, sorted by position, into tiles of up to QTILE (host-side; accepts
    numpy or device arrays). Sorting keeps each tile's positions close, so its key range stays tight."""
    query_seq = _to_host(query_seq)
    query_pos = _to_host(query_pos)
    assert query_seq.shape == query_pos.shape and query_seq.ndim == 1, (query_seq.shape, query_pos.shape)
    assert (query_seq >= 0).all() and (query_pos >= 0).all(), "padding queries are not supported in prefill"
    order = np.lexsort((query_pos, query_seq))  # by sequence, then position
    seqs, tokens, positions = [], [], []
    start = 0
    while start < len(order):
        seq = query_seq[order[start]]
        end = start
        while end < len(order) and end - start < QTILE and query_seq[order[end]] == seq:
            end += 1
        seqs.append(seq)
        tokens.append(order[start:end])
        positions.append(query_pos[order[start:end]])
        start = end
    num_tiles = len(seqs)
    tile_tokens = np.full((num_tiles, QTILE), -1, np.int32)
    tile_positions = np.full((num_tiles, QTILE), -1, np.int32)
    for i, (tok, pos) in enumerate(zip(tokens, positions)):
        tile_tokens[i, : len(tok)] = tok
        tile_positions[i, : len(pos)] = pos
    key_len = tile_positions.max(axis=1) + 1 if num_tiles else np.zeros(0, np.int32)
    return PrefillTiles(cuda.to_device(np.array(seqs, np.int32)), cuda.to_device(tile_tokens),
                        cuda.to_device(tile_positions), cuda.to_device(key_len.astype(np.int32)), num_tiles)


def _to_host(x) -> np.ndarray:
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


def _check_pool(q, k_pool, v_pool, block_tables):
    n_heads, head_dim = q.shape[1:]
    assert k_pool.ndim == 4 and k_pool.shape == v_pool.shape, (k_pool.shape, v_pool.shape)
    assert k_pool.dtype == np.float32 and v_pool.dtype == np.float32, (k_pool.dtype, v_pool.dtype)
    assert k_pool.shape[3] == head_dim, (q.shape, k_pool.shape)
    assert head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} > MAX_HEAD_DIM {MAX_HEAD_DIM}"
    assert n_heads % k_pool.shape[2] == 0, f"{n_heads} query heads do not group over {k_pool.shape[2]} kv heads"
    assert block_tables.ndim == 2 and block_tables.dtype == np.int32, (block_tables.shape, block_tables.dtype)


def _output(q, out):
    out = device_empty(q.shape, np.float32) if out is None else out
    assert out.shape == q.shape and out.dtype == np.float32, (out.shape, out.dtype)
    return out


def write_kv_paged(k, v, k_pool, v_pool, slot_mapping):
    """Store k[t], v[t] ([T, n_kv_heads, head_dim]) at slot slot_mapping[t] of the pools; -1 skips."""
    assert k.shape == v.shape and k.shape[1:] == k_pool.shape[2:], (k.shape, v.shape, k_pool.shape)
    assert k_pool.shape == v_pool.shape, (k_pool.shape, v_pool.shape)
    assert slot_mapping.shape == (k.shape[0],) and slot_mapping.dtype == np.int32, (slot_mapping.shape,
                                                                                    slot_mapping.dtype)
    if k.size > 0:
        blocks, threads = grid_stride_launch(k.size, THREADS)
        write_kv_paged_kernel[blocks, threads, launch_stream()](k, v, k_pool, v_pool, slot_mapping)


def paged_attention_per_query(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """q [T, n_heads, head_dim]: query t of sequence query_seq[t] (a row of block_tables) at position
    query_pos[t] attends causally to that sequence's keys 0..query_pos[t]; one thread per (query, head).
    Serves decode (one query per sequence) and, where syncthreads are dear (the simulator), prefill."""
    num_queries, n_heads, _ = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    assert query_seq.shape == (num_queries,) and query_pos.shape == (num_queries,), (query_seq.shape,
                                                                                     query_pos.shape)
    assert query_seq.dtype == np.int32 and query_pos.dtype == np.int32, (query_seq.dtype, query_pos.dtype)
    out = _output(q, out)
    if num_queries > 0:
        blocks, threads = grid_stride_launch(num_queries * n_heads, THREADS)
        paged_attention_per_query_kernel[blocks, threads, launch_stream()](
            q, k_pool, v_pool, block_tables, query_seq, query_pos, np.float32(scale), out)
    return out


def paged_attention_split_keys(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """Same contract as paged_attention_per_query (query t of sequence query_seq[t] attends to keys
    0..query_pos[t]), but one block of SPLIT_THREADS threads per (query, head) splits the keys: the decode
    kernel for GPUs, where per_query leaves most of the chip idle."""
    num_queries, n_heads, _ = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    assert query_seq.shape == (num_queries,) and query_pos.shape == (num_queries,), (query_seq.shape,
                                                                                     query_pos.shape)
    assert query_seq.dtype == np.int32 and query_pos.dtype == np.int32, (query_seq.dtype, query_pos.dtype)
    assert 1 <= SPLIT_THREADS <= SPLIT_THREADS_MAX, f"SPLIT_THREADS {SPLIT_THREADS} outside 1..{SPLIT_THREADS_MAX}"
    out = _output(q, out)
    if num_queries > 0:
        paged_attention_split_keys_kernel[(num_queries, n_heads), SPLIT_THREADS, launch_stream()](
            q, k_pool, v_pool, block_tables, query_seq, query_pos, np.float32(scale), out)
    return out


def paged_attention_decode(q, k_pool, v_pool, block_tables, context_lens, scale, out=None):
    """q [B, n_heads, head_dim]: sequence b's query at position context_lens[b] - 1 (>= 0) attends to its
    context_lens[b] keys through block_tables[b]. Returns out [B, n_heads, head_dim]."""
    batch = q.shape[0]
    assert block_tables.shape[0] >= batch, (block_tables.shape, batch)
    assert context_lens.shape == (batch,) and context_lens.dtype == np.int32, (context_lens.shape,
                                                                               context_lens.dtype)
    query_pos = _to_host(context_lens) - np.int32(1)
    assert (query_pos >= 0).all(), "every sequence needs at least one key"
    return paged_attention_per_query(q, k_pool, v_pool, block_tables, cuda.to_device(np.arange(batch, dtype=np.int32)),
                                     cuda.to_device(query_pos.astype(np.int32)), scale, out)


def paged_attention_prefill(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None,
                            tiles: PrefillTiles | None = None):
    """q [T, n_heads, head_dim]: query t of sequence query_seq[t] (a row of block_tables) at position
    query_pos[t] attends causally to that sequence's keys 0..query_pos[t]. Pass `tiles` (from
    build_prefill_tiles) to skip rebuilding them, e.g. once per step for all layers. Returns out."""
    num_tokens, n_heads, _ = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    assert query_seq.shape == (num_tokens,) and query_pos.shape == (num_tokens,), (query_seq.shape,
                                                                                   query_pos.shape)
    tiles = build_prefill_tiles(query_seq, query_pos) if tiles is None else tiles
    out = _output(q, out)
    if tiles.num_tiles > 0:
        paged_attention_prefill_kernel[(tiles.num_tiles, n_heads), QTILE, launch_stream()](
            q, k_pool, v_pool, block_tables, tiles.seq, tiles.tokens, tiles.positions, tiles.key_len,
            np.float32(scale), out)
    return out


def write_kv_paged_ref(k, v, k_pool, v_pool, slot_mapping):
    """numpy twin of write_kv_paged: returns updated copies of the pools."""
    k_pool, v_pool = k_pool.copy(), v_pool.copy()
    real = slot_mapping >= 0
    block_size = k_pool.shape[1]
    blocks, offsets = slot_mapping[real] // block_size, slot_mapping[real] % block_size
    k_pool[blocks, offsets] = k[real]
    v_pool[blocks, offsets] = v[real]
    return k_pool, v_pool


def paged_attention_ref(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale):
    """numpy twin of all three attention launchers: gathers each query's keys through the block table, then a
    materialised, max-subtracted softmax in float64."""
    num_tokens, n_heads, head_dim = q.shape
    _, block_size, n_kv_heads, _ = k_pool.shape
    group = n_heads // n_kv_heads
    out = np.empty(q.shape, np.float64)
    for t in range(num_tokens):
        n_keys = query_pos[t] + 1
        blocks = block_tables[query_seq[t], : cdiv(n_keys, block_size)]
        assert (blocks >= 0).all(), f"query {t} reaches past its block table"
        keys = k_pool[blocks].reshape(-1, n_kv_heads, head_dim)[:n_keys].astype(np.float64)
        values = v_pool[blocks].reshape(-1, n_kv_heads, head_dim)[:n_keys].astype(np.float64)
        for h in range(n_heads):
            scores = keys[:, h // group] @ q[t, h].astype(np.float64) * scale
            weights = np.exp(scores - scores.max())
            out[t, h] = weights @ values[:, h // group] / weights.sum()
    return out.astype(np.float32)


def paged_attention_decode_ref(q, k_pool, v_pool, block_tables, context_lens, scale):
    """numpy twin of paged_attention_decode: one query per sequence, at its last position."""
    batch = q.shape[0]
    return paged_attention_ref(q, k_pool, v_pool, block_tables, np.arange(batch), context_lens - 1, scale)
