"""Paged prefill attention, a block per query tile and head: the readable tiled version (shared K/V tiles,
one thread per query). The math and the pool layout: paged_kv.

- `paged_attention_prefill`: varlen queries of any number of sequences (chunked prefill and prefix-cache
  hits included: keys come from the pool, the new tokens' K/V are written with write_kv_paged first).
  The host groups each sequence's queries, sorted by position, into query tiles of up to QTILE tokens
  (`build_prefill_tiles`; a tile never spans two sequences). Grid (num_tiles, n_heads), QTILE threads per
  block, thread i owning the tile's i-th query. The block walks key tiles of KTILE positions up to its
  highest query position: all threads load the tile's K and V through the block table into shared memory,
  syncthreads, each thread scores its query against the keys it may see (causal), rescales its running
  (m, l, acc) once per key tile by the tile's max, accumulates, syncthreads, next key tile. Scores only
  ever exist for one KTILE at a time: no T x T matrix is materialised.
No step launches paged_attention_prefill itself: it is the readable form of prefill_gqa and prefill_tc, which keep
its contract and take its query tiles (build_prefill_tiles, and prefill_tiles_host for prefill CUDA graphs).
"""
from dataclasses import dataclass
import math

import numpy as np

from ..common import cuda, jit, launch_stream
from ..kv_dtype import kv_to_f32
from .paged_kv import MAX_HEAD_DIM, _check_pool, _output, _to_host

QTILE = 16  # queries per prefill block (one thread each)
KTILE = 16  # key positions per shared-memory tile


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
            k_tile[j, d] = kv_to_f32(k_pool[block, key_pos % block_size, kv_head, d])  # float32 or bf16 bits
            v_tile[j, d] = kv_to_f32(v_pool[block, key_pos % block_size, kv_head, d])
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


@dataclass
class PrefillTiles:
    """Device arrays describing the prefill query tiles; build once per step, reuse for every layer."""
    seq: object        # int32 [num_tiles]: the tile's row of block_tables
    tokens: object     # int32 [num_tiles, queries_per_tile]: query token indices into q, -1 padded
    positions: object  # int32 [num_tiles, queries_per_tile]: their absolute positions, -1 padded
    key_len: object    # int32 [num_tiles]: highest position in the tile + 1
    num_tiles: int


def build_prefill_tiles(query_seq, query_pos, queries_per_tile: int = QTILE) -> PrefillTiles:
    """Group queries by sequence, sorted by position, into tiles of up to queries_per_tile (QTILE for
    paged_attention_prefill; host-side, accepts numpy or device arrays). Sorting keeps each tile's positions
    close, so its key range stays tight; a tile never spans two sequences."""
    seq, tokens, positions, key_len = prefill_tiles_host(query_seq, query_pos, queries_per_tile)
    return PrefillTiles(cuda.to_device(seq), cuda.to_device(tokens), cuda.to_device(positions),
                        cuda.to_device(key_len), len(seq))


def max_prefill_tiles(num_tokens: int, max_seqs: int, queries_per_tile: int) -> int:
    """The most tiles a step of num_tokens queries from at most max_seqs sequences can need: a sequence of n
    queries takes ceil(n / q) <= n // q + 1 tiles, and the n // q add up to at most num_tokens // q."""
    return num_tokens // queries_per_tile + min(num_tokens, max_seqs)


def prefill_tiles_host(query_seq, query_pos, queries_per_tile: int,
                       num_tiles: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """build_prefill_tiles' arrays on the host: (seq, tokens, positions, key_len). With `num_tiles`, padded to that
    many tiles with empty ones (seq 0, no tokens, key_len 0: the prefill kernels load no key and write nothing for
    them), so that a CUDA graph's launch grid stays fixed (tinyvllm/runner/prefill_graphs.py). The empty tiles come
    first: the tensor-core kernels take the tiles from the last one (heaviest first), so they start the real tiles
    before the padding."""
    query_seq = _to_host(query_seq)
    query_pos = _to_host(query_pos)
    assert query_seq.shape == query_pos.shape and query_seq.ndim == 1, (query_seq.shape, query_pos.shape)
    assert (query_seq >= 0).all() and (query_pos >= 0).all(), "padding queries are not supported in prefill"
    order = np.lexsort((query_pos, query_seq))  # by sequence, then position
    sorted_seq = query_seq[order]
    starts = np.flatnonzero(np.r_[True, sorted_seq[1:] != sorted_seq[:-1]]) if len(order) else np.zeros(0, int)
    counts = np.diff(np.r_[starts, len(order)])
    run = np.repeat(np.arange(len(starts)), counts)   # each sorted query's run (one per sequence)
    rank = np.arange(len(order)) - starts[run]         # its place within its sequence
    run_tiles = -(-counts // queries_per_tile)
    used = int(run_tiles.sum())
    num_tiles = used if num_tiles is None else num_tiles
    assert used <= num_tiles, f"{used} query tiles, room for {num_tiles}"
    tile = (num_tiles - used) + (np.cumsum(run_tiles) - run_tiles)[run] + rank // queries_per_tile
    tile_tokens = np.full((num_tiles, queries_per_tile), -1, np.int32)
    tile_positions = np.full((num_tiles, queries_per_tile), -1, np.int32)
    tile_tokens[tile, rank % queries_per_tile] = order
    tile_positions[tile, rank % queries_per_tile] = query_pos[order]
    tile_seq = np.zeros(num_tiles, np.int32)
    tile_seq[tile] = sorted_seq
    key_len = (tile_positions.max(axis=1) + 1).astype(np.int32) if num_tiles else np.zeros(0, np.int32)
    return tile_seq, tile_tokens, tile_positions, key_len


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
