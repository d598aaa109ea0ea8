"""Lesson: paged decode attention with a block per (query, head) splitting the keys, and for small batches a block
per key partition too, merged by a second launch (flash-decoding). Production: kernels_numba/attention/decode_gqa.py
and decode_warps.py (`paged_attention_decode_gqa`, `paged_attention_flash_decode_warps`), which do the same online
softmax with a block per (query, KV head): each K/V row is read once for the whole group of query heads instead of
once per query head, and flash_decode_warps merges its partitions in the same launch (partitions.py). The math and
the pool layout: paged_kv.

- `paged_attention_split_keys`: the same varlen contract as per_query, but one BLOCK per (query, head)
  (grid (T, n_heads), SPLIT_THREADS threads) instead of one thread, walking the context SPLIT_KEY_CHUNK keys
  at a time in three phases: (1) a thread per key computes its score against q (kept in shared memory, so
  every read of it is a broadcast) and notes the key's pool row; (2) block reductions give the chunk's max,
  which raises the running max m; the scores become weights exp(score - m) in shared memory and their block
  sum, with the old sum rescaled by exp(m_old - m_new), gives the running sum l; (3) threads across head_dim
  (a warp reads consecutive floats of one V row) and across key slices add weights @ V to accumulators
  rescaled by the same factor. At the end the slices' accumulators are summed through shared memory and
  divided by l. Per_query leaves a decode step with T * n_heads busy threads (32 at batch 1 on Llama-3.2-1B),
  each walking the whole context serially; here T * n_heads blocks share the work. With fewer than
  SPLIT_PARTITION_BELOW_BLOCKS (query, head) pairs it also splits each pair's keys into partitions of
  PARTITION_KEYS, a block each (grid z): each block writes its unnormalised (m, l, acc) and
  `combine_partitions_kernel` merges them, rescaling each partition by exp(m_p - M). A partition past the
  context has m = -inf, l = 0 and weighs nothing. Measured against decode_gqa: docs/bench-h200.md.
"""
import functools
import math

import numpy as np

from kernels_numba.attention.paged_kv import THREADS, _check_pool, _check_queries, _output, _pool_rows
from kernels_numba.common import SIMULATOR, cuda, jit, cdiv, grid_stride_launch, launch_stream, device_empty
from kernels_numba.kv_dtype import kv_to_f32

SPLIT_THREADS = 4 if SIMULATOR else 128  # threads sharing one (query, head); each syncthreads costs
#                                          milliseconds in the simulator
SPLIT_KEY_CHUNK = 8 if SIMULATOR else 256  # keys whose weights sit in shared memory at once (the simulator's
#                                            few-dozen-key tests cross several chunks)
# split_keys partitions the keys of each (query, head) over several blocks while there are fewer than
# SPLIT_PARTITION_BELOW_BLOCKS (query, head) pairs (2 blocks per SM of a 132-SM GPU: decode batches up to 8 on
# Llama-3.2-1B); PARTITION_KEYS keys each (the simulator's 33-key tests cross 3 partitions).
SPLIT_PARTITION_BELOW_BLOCKS = 2 * 132
PARTITION_KEYS = 16 if SIMULATOR else 64


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
                    score += q_scaled[d] * kv_to_f32(k_rows[row, column + d])
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
                # thread waits for memory once per four keys instead of once per key (the loop is latency
                # bound: a batch-1 decode's 32 blocks have little else to hide it). Same adds, same order.
                j = key_slice
                while j + 3 * slices < n_keys:
                    w0, w1, w2, w3 = weights[j], weights[j + slices], weights[j + 2 * slices], weights[j + 3 * slices]
                    r0, r1, r2, r3 = rows[j], rows[j + slices], rows[j + 2 * slices], rows[j + 3 * slices]
                    for i in range(dims):
                        d = lane + i * lanes
                        if d < head_dim:
                            v0, v1 = kv_to_f32(v_rows[r0, column + d]), kv_to_f32(v_rows[r1, column + d])
                            v2, v3 = kv_to_f32(v_rows[r2, column + d]), kv_to_f32(v_rows[r3, column + d])
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
                            acc[i] += weight * kv_to_f32(v_rows[row, column + d])
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


def paged_attention_split_keys(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """Same contract as paged_attention_per_query (query t of sequence query_seq[t] attends to keys
    0..query_pos[t]), but one block of SPLIT_THREADS threads per (query, head) splits the keys: on a GPU,
    per_query leaves most of the chip idle."""
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
    (flash-decoding: a batch-1 decode's 32 blocks would leave most of a 132-SM GPU idle, and each block
    would walk the whole context alone)."""
    if num_queries * n_heads >= SPLIT_PARTITION_BELOW_BLOCKS:
        return 1
    return max(1, cdiv(max_context, PARTITION_KEYS))
