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
- `paged_attention_prefill_gqa`: paged_attention_prefill's contract, FlashAttention-2 on CUDA cores, for
  GPUs (meant to be 10x+ faster; not yet timed on one). A block owns one query tile x one KV head with ALL `group` query heads of that KV head:
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
- `paged_attention_split_keys`: the same varlen contract as per_query, but one BLOCK per (query, head)
  (grid (T, n_heads), SPLIT_THREADS threads) instead of one thread, walking the context SPLIT_KEY_CHUNK keys
  at a time in three phases: (1) a thread per key computes its score against q (kept in shared memory, so
  every read of it is a broadcast) and notes the key's pool row; (2) block reductions give the chunk's max,
  which raises the running max m; the scores become weights exp(score - m) in shared memory and their block
  sum, with the old sum rescaled by exp(m_old - m_new), gives the running sum l; (3) threads across head_dim
  (a warp reads consecutive floats of one V row) and across key slices add weights @ V to accumulators
  rescaled by the same factor. At the end the slices' accumulators are summed through shared memory and
  divided by l. Per_query leaves a decode step with T * n_heads busy threads (32 at batch 1 on Llama-3.2-1B),
  each walking the whole context serially; here T * n_heads blocks share the work. The runner's decode kernel
  for small GPU batches until flash_decode. With fewer than SPLIT_PARTITION_BELOW_BLOCKS (query, head) pairs it
  also splits each pair's keys into partitions of PARTITION_KEYS, a block each (grid z; flash-decoding): each
  block writes its unnormalised (m, l, acc) and `combine_partitions_kernel` merges them, rescaling each
  partition by exp(m_p - M). A partition past the context has m = -inf, l = 0 and weighs nothing.
- `paged_attention_decode_gqa`: the same contract again, one block per (query, KV head) for the whole
  group of query heads (4 on Llama-3.2-1B), GQA_DECODE_KEY_CHUNK keys at a time: the block copies the
  chunk's K and V rows into shared memory once (coalesced: consecutive threads read consecutive floats of a
  row), then a thread per (pair of heads, key) scores it, every thread takes each head's chunk max itself
  (broadcast reads) and raises its running max m, the scores become weights, and a thread per (pair of heads,
  dim) adds weights @ V and the weights' sum l, both rescaled by exp(m_old - m_new). The next chunk's K/V
  loads are issued into registers before this chunk's compute (register prefetch), so memory and math
  overlap. split_keys reads each K/V row once per query head (4x the traffic); this reads it once. The
  decode kernel for large GPU batches (long contexts at batch 256).
- `paged_attention_flash_decode`: decode_gqa split over key partitions (flash-decoding), for small GPU
  batches, whose T x n_kv_heads blocks would leave most SMs idle (8 at batch 1). Grid (T, n_kv_heads,
  partitions), partitions of FLASH_DECODE_PARTITION_KEYS covering the longest context the block tables address
  (a CUDA graph's are padded to the model's); a block whose partition starts past its query's context exits at
  once. The others run decode_gqa's chunk loop over their partition's keys and write its unnormalised state
  per query head: m, l and acc[head_dim]. One launch: each block then fences its writes and counts itself in,
  an atomic add on its (query, KV head)'s counter; the block that brings the count to the number of partitions
  with keys merges them all, in partition order (the same result whichever block finishes last),
      out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p,  M = max_p m_p  (as a running merge),
  and sets the counter back to 0 for the next launch (a graph replays it; device_zeros zeroes it once).
"""
from dataclasses import dataclass
import functools
import math

import numpy as np

from .attention import MAX_HEAD_DIM, attend_to_key
from .common import (SIMULATOR, SHARED_ALIGN, SHARED_ROW_PAD, cuda, jit, cdiv, grid_stride_launch, launch_stream,
                     device_empty, device_zeros)

THREADS = 128
QTILE = 16  # queries per prefill block (one thread each)
KTILE = 16  # key positions per shared-memory tile
SPLIT_THREADS = 4 if SIMULATOR else 128  # threads sharing one (query, head); each syncthreads costs
#                                          milliseconds in the simulator
SPLIT_KEY_CHUNK = 8 if SIMULATOR else 256  # keys whose weights sit in shared memory at once (the simulator's
#                                            few-dozen-key tests cross several chunks)
# split_keys partitions the keys of each (query, head) over several blocks while there are fewer than
# SPLIT_PARTITION_BELOW_BLOCKS (query, head) pairs (2 blocks per SM of an H200: decode batches up to 8 on
# Llama-3.2-1B); PARTITION_KEYS keys each (the simulator's 33-key tests cross 3 partitions).
SPLIT_PARTITION_BELOW_BLOCKS = 2 * 132
PARTITION_KEYS = 16 if SIMULATOR else 64
GQA_DECODE_THREADS = 4 if SIMULATOR else 128
# The runner's switch from split_keys (T x n_heads blocks; now flash_decode) to decode_gqa (T x n_kv_heads blocks):
# from 64 (query, KV head) pairs, a decode batch of 8 on Llama-3.2-1B. Graph-timed on the H200
# (docs/bench/h200-round4-final-sweep_decode_attention.log, 512-key contexts): batch 8 split_keys 74.7 us,
# decode_gqa 42.6; batch 32 183.1 vs 59.5; at batch 1 (256 keys) split_keys' partitions win, 14.3 vs 22.4.
DECODE_GQA_MIN_BLOCKS = 64
# Keys whose K and V rows sit in shared memory (and, prefetched, in registers) at once. On the H200 (same
# log) 16 keys x 128 threads read the KV of batch 256 x 1024 keys at 1.70 TB/s, 32 keys 1.13, 64 keys 1.35
# (ptxas: 98, 134, 156 registers: 5, 3, 3 blocks per SM), 256 threads slower still; but while the grid is
# under GQA_FEW_BLOCKS blocks (2 per SM) fewer, longer chunks win: batch 8 x 512 keys 42.6 us with 64-key
# chunks vs 55.1 with 16, batch 32 59.5 vs 63.9; batch 64 (512 blocks) 112.9 vs 84.9.
GQA_DECODE_KEY_CHUNK = 8 if SIMULATOR else 16
GQA_DECODE_KEY_CHUNK_FEW_BLOCKS = 8 if SIMULATOR else 64
GQA_FEW_BLOCKS = 2 * 132
# flash_decode (decode_gqa split over key partitions), for decode batches under DECODE_GQA_MIN_BLOCKS
# (query, KV head) pairs. 64-key partitions: a 400-key context gets 7 per (query, KV head), 56 blocks at batch 1
# instead of decode_gqa's 8; one 64-key chunk each, so a block issues all its K/V loads at once (decode_gqa's
# fastest chunk while its grid is small, above). 256 threads: batch 1, 128 / 384 keys, 11.0 -> 9.9 / 12.5 -> 11.4
# us against 128 (graph-timed sweep, docs/bench/h200-round5-sweep_decode_attention.log; ptxas: 126 registers).
# The simulator: 16-key partitions of two 8-key chunks, so its 33-key tests cross 3 partitions and chunks.
FLASH_DECODE_THREADS = 4 if SIMULATOR else 256
FLASH_DECODE_PARTITION_KEYS = 16 if SIMULATOR else 64
FLASH_DECODE_KEY_CHUNK = 8 if SIMULATOR else 64
# prefill_gqa tile sizes (upper bounds: gqa_shape shrinks the tiles to fit the shared memory). A simulated
# syncthreads costs ~2.5 ms per thread of the block, so the simulator gets 4-thread blocks and short tiles: the
# same index math and phases, and its few-dozen-key tests still cross several query and key tiles.
GQA_ROWS = 8 if SIMULATOR else 64         # (query, head) rows per block: 64 // group queries x group heads
GQA_KTILE = 8 if SIMULATOR else 32        # key positions per shared K/V tile
GQA_ROW_THREADS = 2 if SIMULATOR else 16  # threads across the block's rows
GQA_COL_THREADS = 2 if SIMULATOR else 8   # threads across a tile's keys (scores) and head_dim (output)
GQA_SHARED_BYTES = 48 * 1024              # static shared memory per block


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


def _block_reduce(take_max: bool, threads: int):
    """A device function combining one float32 per thread of a `threads`-thread block (max, or sum) through
    the shared `buffer`; every thread gets the result. Any thread count: each round folds the upper half of
    the live values onto the lower half. Ends with a barrier, so the buffer may be reused at once."""

    @jit(device=True)
    def reduce(value, buffer, tid):
        buffer[tid] = value
        cuda.syncthreads()
        size = threads
        while size > 1:
            half = (size + 1) // 2
            if tid < size - half:
                if take_max:
                    buffer[tid] = max(buffer[tid], buffer[tid + half])
                else:
                    buffer[tid] += buffer[tid + half]
            cuda.syncthreads()
            size = half
        result = buffer[0]
        cuda.syncthreads()  # everyone has read buffer[0] before anyone writes the buffer again
        return result

    return reduce


@functools.cache
def paged_attention_split_keys_kernel(head_dim: int, block_size: int, threads: int, key_chunk: int,
                                      partitioned: bool):
    """The split-keys decode kernel for one shape (compile-time constants: shared arrays are sized by them
    and the loops over them unroll). `partitioned`: block z of the grid takes keys [z * partition_keys,
    (z + 1) * partition_keys) only and writes its unnormalised (m, l, acc) for combine_partitions_kernel;
    otherwise one block takes the whole context and writes the output."""
    lanes = min(threads, head_dim)        # threads across head_dim in the V pass
    slices = max(1, threads // lanes)     # ... times key slices: thread tid takes dims of lane tid % lanes
    dims = cdiv(head_dim, lanes)          # output dims per thread (1 on the GPU: head_dim 64, 128 threads)
    block_max = _block_reduce(True, threads)
    block_sum = _block_reduce(False, threads)

    @jit
    def kernel(q, k_rows, v_rows, block_tables, query_seq, query_pos, scale, partition_keys, out,
               part_max, part_sum, part_acc):
        t = cuda.blockIdx.x
        h = cuda.blockIdx.y
        partition = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        n_kv_heads = k_rows.shape[1] // head_dim
        column = (h // (q.shape[1] // n_kv_heads)) * head_dim  # this KV head's first column of a pool row
        b = query_seq[t]
        context_len = query_pos[t] + 1  # causal: keys 0..position
        keys_begin = partition * partition_keys
        keys_end = min(context_len, keys_begin + partition_keys)  # <= keys_begin: a partition past the context
        # one shared array per line: the simulator aliases two declared on the same line
        q_scaled = cuda.shared.array(head_dim, np.float32)
        weights = cuda.shared.array(key_chunk, np.float32)  # the chunk's scores, then exp(score - m)
        rows = cuda.shared.array(key_chunk, np.int32)       # the chunk's pool rows
        reduce_buffer = cuda.shared.array(threads, np.float32)
        partial_out = cuda.shared.array((slices, head_dim), np.float32)
        acc = cuda.local.array(dims, np.float32)
        lane = tid % lanes
        key_slice = tid // lanes
        for d in range(tid, head_dim, threads):
            q_scaled[d] = q[t, h, d] * scale  # scale once here, so each score is a plain dot product
        for i in range(dims):
            acc[i] = np.float32(0.0)
        running_max = np.float32(-math.inf)
        running_sum = np.float32(0.0)
        cuda.syncthreads()

        for chunk_start in range(keys_begin, keys_end, key_chunk):
            n_keys = min(key_chunk, keys_end - chunk_start)
            # 1. scores: a thread per key
            chunk_max = np.float32(-math.inf)
            for j in range(tid, n_keys, threads):
                key = chunk_start + j
                row = block_tables[b, key // block_size] * block_size + key % block_size
                rows[j] = row
                score = np.float32(0.0)
                for d in range(head_dim):
                    score += q_scaled[d] * k_rows[row, column + d]
                weights[j] = score
                chunk_max = max(chunk_max, score)
            # 2. the block's new running max; scores become weights exp(score - m), summed
            new_max = max(running_max, block_max(chunk_max, reduce_buffer, tid))  # finite: n_keys >= 1
            chunk_sum = np.float32(0.0)
            for j in range(tid, n_keys, threads):
                weight = np.float32(math.exp(weights[j] - new_max))
                weights[j] = weight
                chunk_sum += weight
            rescale = np.float32(math.exp(running_max - new_max))  # 0 on the first chunk (running_max -inf)
            running_sum = running_sum * rescale + block_sum(chunk_sum, reduce_buffer, tid)
            running_max = new_max
            # 3. acc += weights @ V: lanes across head_dim (a warp reads consecutive floats of one row),
            # slices across keys
            for i in range(dims):
                acc[i] *= rescale
            if key_slice < slices:
                # Four keys at a time: their V loads are all issued before the first multiply-add, so a
                # thread waits for memory once per four keys instead of once per key (the loop was latency
                # bound: a batch-1 decode's 32 blocks have little else to hide it). Same adds, same order.
                j = key_slice
                while j + 3 * slices < n_keys:
                    w0, w1, w2, w3 = weights[j], weights[j + slices], weights[j + 2 * slices], weights[j + 3 * slices]
                    r0, r1, r2, r3 = rows[j], rows[j + slices], rows[j + 2 * slices], rows[j + 3 * slices]
                    for i in range(dims):
                        d = lane + i * lanes
                        if d < head_dim:
                            v0, v1 = v_rows[r0, column + d], v_rows[r1, column + d]
                            v2, v3 = v_rows[r2, column + d], v_rows[r3, column + d]
                            acc[i] += w0 * v0
                            acc[i] += w1 * v1
                            acc[i] += w2 * v2
                            acc[i] += w3 * v3
                    j += 4 * slices
                while j < n_keys:
                    weight = weights[j]
                    row = rows[j]
                    for i in range(dims):
                        d = lane + i * lanes
                        if d < head_dim:
                            acc[i] += weight * v_rows[row, column + d]
                    j += slices
            cuda.syncthreads()  # nobody overwrites weights / rows while another thread still reads them

        if key_slice < slices:
            for i in range(dims):
                d = lane + i * lanes
                if d < head_dim:
                    partial_out[key_slice, d] = acc[i]
        cuda.syncthreads()
        if partitioned:  # m = -inf, l = 0, acc = 0 for a partition without keys: it weighs nothing
            if tid == 0:
                part_max[t, h, partition] = running_max
                part_sum[t, h, partition] = running_sum
            for d in range(tid, head_dim, threads):
                total = np.float32(0.0)
                for s in range(slices):
                    total += partial_out[s, d]
                part_acc[t, h, partition, d] = total
        else:
            inv_sum = np.float32(1.0) / running_sum
            for d in range(tid, head_dim, threads):
                total = np.float32(0.0)
                for s in range(slices):
                    total += partial_out[s, d]
                out[t, h, d] = total * inv_sum

    return kernel


@jit
def combine_partitions_kernel(part_max, part_sum, part_acc, out):
    """out[t, h] = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p, M = max_p m_p: the partitions' online
    softmax states merged (partition 0 always holds key 0, so M is finite); a thread per output element."""
    num_queries, n_heads, partitions, head_dim = part_acc.shape
    for i in range(cuda.grid(1), num_queries * n_heads * head_dim, cuda.gridsize(1)):
        t = i // (n_heads * head_dim)
        h = (i // head_dim) % n_heads
        d = i % head_dim
        overall_max = np.float32(-math.inf)
        for p in range(partitions):
            overall_max = max(overall_max, part_max[t, h, p])
        total_sum = np.float32(0.0)
        total = np.float32(0.0)
        for p in range(partitions):
            weight = np.float32(math.exp(part_max[t, h, p] - overall_max))  # 0 for an empty partition
            total_sum += part_sum[t, h, p] * weight
            total += part_acc[t, h, p, d] * weight
        out[t, h, d] = total / total_sum


@functools.cache
def paged_attention_decode_gqa_kernel(head_dim: int, block_size: int, group: int, threads: int, key_chunk: int,
                                      partition_keys: int = 0):
    """The GQA decode kernel for one shape: a block per (query, KV head) serves the group's query heads
    from one shared copy of each K/V chunk (compile-time constants size the shared arrays and unroll loops).
    partition_keys > 0 makes it flash_decode's kernel (see paged_attention_flash_decode): block z takes keys
    [z * partition_keys, (z + 1) * partition_keys) of its query's context only, and the (query, KV head)'s
    last block to finish merges the partitions' states into `out`; otherwise the part_* and `arrivals`
    arguments are unused.

    Per chunk, four barriers: (1) the chunk's K/V rows, already in registers, into shared memory, then the
    next chunk's loads issued (they land during 2-4); (2) a thread per (head set, key) scores heads_per_item
    heads from one read of the key's K row (masked keys score -inf); (3) every thread
    takes each head's chunk max itself (broadcast reads, no reduction tree) and turns its scores into
    weights exp(score - m); (4) a thread per (head set, dim) adds weights @ V and the weights' sum, both
    rescaled by exp(m_old - m_new). Every shared read in (2)-(4) is a broadcast or a conflict-free row, four
    floats at a time where the layout allows (16-byte aligned tiles)."""
    heads_per_item = 2 if group % 2 == 0 else 1  # heads one thread scores / accumulates from one K or V read
    head_sets = group // heads_per_item
    load_steps = cdiv(key_chunk * head_dim, threads)       # tile elements each thread copies
    score_steps = cdiv(head_sets * key_chunk, threads)     # (head set, key) items per thread
    out_steps = cdiv(head_sets * head_dim, threads)        # (head set, dim) items per thread
    k_row_stride = head_dim + SHARED_ROW_PAD               # keeps rows 16-byte aligned; thread j reading K row j
    #                                                        four floats at a time hits banks 4j..4j+3 (mod 32)
    assert head_dim % 4 == 0 and key_chunk % 4 == 0
    partitioned = partition_keys > 0

    @jit(device=True)
    def load_chunk(k_rows, v_rows, block_tables, b, column, chunk_start, last, tid, k_loaded, v_loaded):
        """Issue this thread's loads of the chunk's K/V rows into registers. Element i is tile element
        e = tid + i * threads: key e // head_dim, dim e % head_dim (consecutive threads read consecutive floats
        of a row: coalesced). Keys past the context load the last key again (branch-free; weights 0)."""
        for i in range(load_steps):
            e = _ix(tid) + _ix(i * threads)
            key = min(_ix(chunk_start) + min(e // _ix(head_dim), _ix(key_chunk - 1)), _ix(last))
            row = _ix(block_tables[b, key // _ix(block_size)]) * _ix(block_size) + key % _ix(block_size)
            k_loaded[i] = k_rows[row, _ix(column) + e % _ix(head_dim)]
            v_loaded[i] = v_rows[row, _ix(column) + e % _ix(head_dim)]

    @jit
    def kernel(q, k_rows, v_rows, block_tables, query_seq, query_pos, scale, out, part_max, part_sum, part_acc,
               arrivals):
        t = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        first_head = kv_head * group
        column = kv_head * head_dim  # this KV head's first column of a pool row
        b = query_seq[t]
        context_len = query_pos[t] + 1  # causal: keys 0..position
        keys_begin = 0
        keys_end = context_len
        if partitioned:
            keys_begin = cuda.blockIdx.z * partition_keys
            if keys_begin >= context_len:
                return  # the grid covers the longest context the block tables address; this one is shorter
            keys_end = min(context_len, keys_begin + partition_keys)
        # one shared array per line: the simulator aliases two declared on the same line
        q_scaled = cuda.shared.array((group, head_dim), np.float32, alignment=SHARED_ALIGN)
        k_tile = cuda.shared.array((key_chunk, k_row_stride), np.float32, alignment=SHARED_ALIGN)
        v_tile = cuda.shared.array((key_chunk, head_dim), np.float32, alignment=SHARED_ALIGN)
        scores = cuda.shared.array((group, key_chunk), np.float32, alignment=SHARED_ALIGN)
        weights = cuda.shared.array((group, key_chunk), np.float32, alignment=SHARED_ALIGN)
        merging = cuda.shared.array(1, np.int32)  # flash_decode: whether this block merges the partitions
        running_max = cuda.local.array(group, np.float32)   # m per head, the same in every thread
        rescale = cuda.local.array(group, np.float32)       # exp(m_old - m_new) of this chunk
        chunk_max = cuda.local.array(group, np.float32)
        acc = cuda.local.array((out_steps, heads_per_item), np.float32)
        sums = cuda.local.array((out_steps, heads_per_item), np.float32)  # l of the thread's (head, dim) items
        merged_max = cuda.local.array((out_steps, heads_per_item), np.float32)  # flash_decode's merge
        dot = cuda.local.array(heads_per_item, np.float32)
        k_loaded = cuda.local.array(load_steps, np.float32)
        v_loaded = cuda.local.array(load_steps, np.float32)
        for e in range(tid, group * head_dim, threads):
            q_scaled[e // head_dim, e % head_dim] = q[t, first_head + e // head_dim, e % head_dim] * scale
        for g in range(group):
            running_max[g] = np.float32(-math.inf)
        for s in range(out_steps):
            for i in range(heads_per_item):
                acc[s, i] = np.float32(0.0)
                sums[s, i] = np.float32(0.0)
        chunks = (keys_end - keys_begin + key_chunk - 1) // key_chunk
        last = keys_end - 1
        # Register prefetch: chunk c + 1's K/V loads are issued before chunk c's compute and land while it runs.
        load_chunk(k_rows, v_rows, block_tables, b, column, keys_begin, last, tid, k_loaded, v_loaded)
        for chunk in range(chunks):
            chunk_start = keys_begin + chunk * key_chunk
            n_keys = min(key_chunk, keys_end - chunk_start)
            # 1. this chunk's K and V rows (in registers) into shared memory, once for the whole group
            for i in range(load_steps):
                e = _ix(tid) + _ix(i * threads)
                j = min(e // _ix(head_dim), _ix(key_chunk - 1))  # past the tile: the last row, own value
                k_tile[j, e % _ix(head_dim)] = k_loaded[i]
                v_tile[j, e % _ix(head_dim)] = v_loaded[i]
            cuda.syncthreads()
            if chunk + 1 < chunks:
                load_chunk(k_rows, v_rows, block_tables, b, column, chunk_start + key_chunk, last, tid,
                           k_loaded, v_loaded)
            # 2. scores: a thread per (head set, key), one pass over the key's K row for the set's heads
            for s in range(score_steps):
                item = tid + s * threads
                head_set = item // key_chunk
                j = item % key_chunk
                if head_set < head_sets:
                    for i in range(heads_per_item):
                        dot[i] = np.float32(0.0)
                    for d0 in range(0, head_dim, 4):
                        for d in range(d0, d0 + 4):
                            k_value = k_tile[j, d]
                            for i in range(heads_per_item):
                                dot[i] += q_scaled[head_set * heads_per_item + i, d] * k_value
                    for i in range(heads_per_item):
                        scores[head_set * heads_per_item + i, j] = dot[i] if j < n_keys else np.float32(-math.inf)
            cuda.syncthreads()
            # 3. every thread raises each head's running max by the chunk's max (n_keys >= 1: finite)...
            for g in range(group):
                chunk_max[g] = scores[g, 0]
            for j in range(1, key_chunk):
                for g in range(group):
                    chunk_max[g] = max(chunk_max[g], scores[g, j])
            for g in range(group):
                new_max = max(running_max[g], chunk_max[g])
                rescale[g] = np.float32(math.exp(running_max[g] - new_max))  # 0 on the first chunk
                running_max[g] = new_max
            # ... and turns its own scores into weights (exp(-inf) = 0 for masked keys)
            for s in range(score_steps):
                item = tid + s * threads
                head_set = item // key_chunk
                j = item % key_chunk
                for g in range(group):  # compile-time g: running_max stays in registers
                    if g // heads_per_item == head_set:
                        weights[g, j] = np.float32(math.exp(scores[g, j] - running_max[g]))
            cuda.syncthreads()
            # 4. acc += weights @ V and l += sum(weights): a thread per (head set, dim), a warp reading
            # consecutive dims of a V row
            for s in range(out_steps):
                item = tid + s * threads
                head_set = item // head_dim
                d = item % head_dim
                if head_set < head_sets:
                    for g in range(group):
                        if g // heads_per_item == head_set:
                            acc[s, g % heads_per_item] *= rescale[g]
                            sums[s, g % heads_per_item] *= rescale[g]
                    for j0 in range(0, key_chunk, 4):
                        for j in range(j0, j0 + 4):
                            v_value = v_tile[j, d]
                            for i in range(heads_per_item):
                                weight = weights[head_set * heads_per_item + i, j]
                                acc[s, i] += weight * v_value
                                sums[s, i] += weight
            cuda.syncthreads()  # nobody overwrites the tiles, scores or weights while another thread reads them

        if partitioned:
            # This partition's unnormalised state: m and l per head, acc per (head, dim)...
            partition = cuda.blockIdx.z
            for s in range(out_steps):
                item = tid + s * threads
                head_set = item // head_dim
                d = item % head_dim
                if head_set < head_sets:
                    for g in range(group):  # compile-time g: running_max stays in registers
                        if g // heads_per_item == head_set:
                            part_acc[t, first_head + g, partition, d] = acc[s, g % heads_per_item]
                            if d == 0:
                                part_max[t, first_head + g, partition] = running_max[g]
                                part_sum[t, first_head + g, partition] = sums[s, g % heads_per_item]
            # ... then the block checks in; the last of the (query, KV head)'s partitions with keys to arrive
            # merges them all. Each thread's fence publishes its writes GPU-wide before thread 0 counts the block.
            cuda.threadfence()
            cuda.syncthreads()
            partitions = (context_len + partition_keys - 1) // partition_keys
            if tid == 0:
                merging[0] = cuda.atomic.add(arrivals, (t, kv_head), 1) == partitions - 1
                cuda.threadfence()  # the other blocks' writes, published before they checked in, are seen
            cuda.syncthreads()
            if not merging[0]:
                return  # another block of this (query, KV head) arrives later and merges
            if tid == 0:
                arrivals[t, kv_head] = 0  # every partition has arrived: ready for the next launch (graph replays)
            # acc and sums become the merged state of the thread's (head, dim) items; running max in merged_max.
            # Partitions in order, so the result is the same whichever block merges.
            for s in range(out_steps):
                for i in range(heads_per_item):
                    merged_max[s, i] = np.float32(-math.inf)
                    acc[s, i] = np.float32(0.0)
                    sums[s, i] = np.float32(0.0)
            for p in range(partitions):
                for s in range(out_steps):
                    item = tid + s * threads
                    head_set = item // head_dim
                    if head_set < head_sets:
                        for i in range(heads_per_item):
                            h = first_head + head_set * heads_per_item + i
                            m = part_max[t, h, p]
                            new_max = max(merged_max[s, i], m)  # finite: every partition merged has keys
                            old_weight = np.float32(math.exp(merged_max[s, i] - new_max))  # 0 for partition 0
                            weight = np.float32(math.exp(m - new_max))
                            sums[s, i] = sums[s, i] * old_weight + part_sum[t, h, p] * weight
                            acc[s, i] = acc[s, i] * old_weight + part_acc[t, h, p, item % head_dim] * weight
                            merged_max[s, i] = new_max
        # out = acc / l for the thread's (head, dim) items (merged over the partitions by flash_decode's merger)
        for s in range(out_steps):
            item = tid + s * threads
            head_set = item // head_dim
            if head_set < head_sets:
                for i in range(heads_per_item):
                    out[t, first_head + head_set * heads_per_item + i, item % head_dim] = acc[s, i] / sums[s, i]

    return kernel


@jit(device=True)
def _ix(i):
    """An index as uint64: numba then skips its negative-index wraparound (a sign test and an add per index),
    and LLVM can fold shared-array addresses into base + constant offsets. For indices known to be >= 0."""
    return np.uint64(i)


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
                        k_in[b] = k_rows[_ix(slot), column]
                        v_in[b] = v_rows[_ix(slot), column]
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
    tile = (np.cumsum(run_tiles) - run_tiles)[run] + rank // queries_per_tile
    num_tiles = int(run_tiles.sum())
    tile_tokens = np.full((num_tiles, queries_per_tile), -1, np.int32)
    tile_positions = np.full((num_tiles, queries_per_tile), -1, np.int32)
    tile_tokens[tile, rank % queries_per_tile] = order
    tile_positions[tile, rank % queries_per_tile] = query_pos[order]
    tile_seq = np.zeros(num_tiles, np.int32)
    tile_seq[tile] = sorted_seq
    key_len = tile_positions.max(axis=1) + 1 if num_tiles else np.zeros(0, np.int32)
    return PrefillTiles(cuda.to_device(tile_seq), cuda.to_device(tile_tokens),
                        cuda.to_device(tile_positions), cuda.to_device(key_len.astype(np.int32)), num_tiles)


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


def _pool_rows(k_pool, v_pool):
    """The pools as [slot, n_kv_heads * head_dim] views: a slot's K (or V) row for every KV head."""
    num_blocks, block_size, n_kv_heads, head_dim = k_pool.shape
    rows = (num_blocks * block_size, n_kv_heads * head_dim)
    return k_pool.reshape(rows), v_pool.reshape(rows)


def _check_queries(num_queries, query_seq, query_pos):
    assert query_seq.shape == (num_queries,) and query_pos.shape == (num_queries,), (query_seq.shape,
                                                                                     query_pos.shape)
    assert query_seq.dtype == np.int32 and query_pos.dtype == np.int32, (query_seq.dtype, query_pos.dtype)


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
    _check_queries(num_queries, query_seq, query_pos)
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
    _check_queries(num_queries, query_seq, query_pos)
    assert SPLIT_THREADS >= 1, f"SPLIT_THREADS {SPLIT_THREADS}"
    out = _output(q, out)
    if num_queries > 0:
        _, block_size, _, head_dim = k_pool.shape
        max_context = block_tables.shape[1] * block_size  # what the block tables can address: static per graph
        partitions = split_partitions(num_queries, n_heads, max_context)
        partition_keys = cdiv(max_context, partitions)
        kernel = paged_attention_split_keys_kernel(head_dim, block_size, SPLIT_THREADS, SPLIT_KEY_CHUNK,
                                                   partitions > 1)
        if partitions > 1:
            part_max = device_empty((num_queries, n_heads, partitions), np.float32)
            part_sum = device_empty((num_queries, n_heads, partitions), np.float32)
            part_acc = device_empty((num_queries, n_heads, partitions, head_dim), np.float32)
        else:  # unused: any float32 arrays of the right rank
            part_max = part_sum = out
            part_acc = out.reshape((num_queries, n_heads, 1, head_dim))
        kernel[(num_queries, n_heads, partitions), SPLIT_THREADS, launch_stream()](
            q, *_pool_rows(k_pool, v_pool), block_tables, query_seq, query_pos,
            np.float32(scale), partition_keys, out, part_max, part_sum, part_acc)
        if partitions > 1:
            blocks, threads = grid_stride_launch(out.size, THREADS)
            combine_partitions_kernel[blocks, threads, launch_stream()](part_max, part_sum, part_acc, out)
    return out


def split_partitions(num_queries: int, n_heads: int, max_context: int) -> int:
    """How many key partitions split_keys cuts each (query, head) into: one when the (query, head) blocks
    alone reach SPLIT_PARTITION_BELOW_BLOCKS; else enough partitions of PARTITION_KEYS to cover max_context
    (flash-decoding: a batch-1 decode's 32 blocks would leave 100 of the H200's SMs idle, and each block
    would walk the whole context alone)."""
    if num_queries * n_heads >= SPLIT_PARTITION_BELOW_BLOCKS:
        return 1
    return max(1, cdiv(max_context, PARTITION_KEYS))


def paged_attention_decode_gqa(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """Same contract as paged_attention_per_query, one block of GQA_DECODE_THREADS threads per (query, KV
    head) serving all its query heads: each K/V row is read from memory once per group instead of once per
    query head. The decode kernel for GPUs once the batch has enough (query, KV head) pairs to fill them."""
    num_queries, n_heads, _ = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    _check_queries(num_queries, query_seq, query_pos)
    out = _output(q, out)
    if num_queries > 0:
        _, block_size, n_kv_heads, head_dim = k_pool.shape
        few_blocks = num_queries * n_kv_heads < GQA_FEW_BLOCKS
        key_chunk = GQA_DECODE_KEY_CHUNK_FEW_BLOCKS if few_blocks else GQA_DECODE_KEY_CHUNK
        kernel = paged_attention_decode_gqa_kernel(head_dim, block_size, n_heads // n_kv_heads,
                                                   GQA_DECODE_THREADS, key_chunk)
        unused_acc = out.reshape((num_queries, n_heads, 1, head_dim))  # any arrays of the right ranks and types
        kernel[(num_queries, n_kv_heads), GQA_DECODE_THREADS, launch_stream()](
            q, *_pool_rows(k_pool, v_pool), block_tables, query_seq, query_pos,
            np.float32(scale), out, out, out, unused_acc, block_tables)
    return out


def paged_attention_flash_decode(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """Same contract as paged_attention_per_query: decode_gqa (a block per (query, KV head) serving its group
    of query heads) split over key partitions of FLASH_DECODE_PARTITION_KEYS (flash-decoding), a block each,
    grid (T, n_kv_heads, partitions of the longest context the block tables address). Each block writes its
    partition's unnormalised (m, l, acc); the last of a (query, KV head)'s blocks to finish merges them, in
    partition order, into out. One launch. The decode kernel for small GPU batches, whose T x n_kv_heads
    blocks alone would leave most of the GPU idle."""
    num_queries, n_heads, _ = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    _check_queries(num_queries, query_seq, query_pos)
    out = _output(q, out)
    if num_queries > 0:
        _, block_size, n_kv_heads, head_dim = k_pool.shape
        max_context = block_tables.shape[1] * block_size  # what the block tables can address: static per graph
        partitions = cdiv(max_context, FLASH_DECODE_PARTITION_KEYS)
        part_max = device_empty((num_queries, n_heads, partitions), np.float32)
        part_sum = device_empty((num_queries, n_heads, partitions), np.float32)
        part_acc = device_empty((num_queries, n_heads, partitions, head_dim), np.float32)
        arrivals = device_zeros((num_queries, n_kv_heads), np.int32)  # blocks done per (query, KV head)
        kernel = paged_attention_decode_gqa_kernel(head_dim, block_size, n_heads // n_kv_heads,
                                                   FLASH_DECODE_THREADS, FLASH_DECODE_KEY_CHUNK,
                                                   FLASH_DECODE_PARTITION_KEYS)
        kernel[(num_queries, n_kv_heads, partitions), FLASH_DECODE_THREADS, launch_stream()](
            q, *_pool_rows(k_pool, v_pool), block_tables, query_seq, query_pos,
            np.float32(scale), out, part_max, part_sum, part_acc, arrivals)
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
