"""Paged decode attention, one block per (query, KV head) for its whole group of query heads: the GPU's decode
kernel for mid-size batches (between flash_decode_warps' and decode_warps'). The math and the pool layout: paged_kv.

`paged_attention_decode_gqa` takes GQA_DECODE_KEY_CHUNK keys at a time: the block copies the chunk's K and V rows
into shared memory once (coalesced: consecutive threads read consecutive floats of a row), then a thread per (pair
of heads, key) scores it, every thread takes each head's chunk max itself (broadcast reads) and raises its running
max m, the scores become weights, and a thread per (pair of heads, dim) adds weights @ V and the weights' sum l,
both rescaled by exp(m_old - m_new). The next chunk's K/V loads are issued into registers before this chunk's
compute (register prefetch), so memory and math overlap. A block per (query, head) would read each K/V row once per
query head (4x the traffic: lessons/split_keys.py); this reads it once for the group (4 heads on Llama-3.2-1B). A
bf16 pool (kv_dtype) is read in words of KV_BF16_PER_LOAD elements (the rows viewed as uint64 by default), each
unpacked into the float32 tile: half the bytes of a float32 pool, in fewer loads.
"""
import functools
import math

import numpy as np

from ..common import SIMULATOR, SHARED_ALIGN, SHARED_ROW_PAD, cuda, jit, cdiv, launch_stream
from ..bf16 import bf16_to_f32
from ..kv_dtype import kv_to_f32
from .paged_kv import _ix, _check_pool, _check_queries, _output, _pool_rows

GQA_DECODE_THREADS = 4 if SIMULATOR else 128
# The runner's switch from key partitions (flash_decode_warps) to decode_gqa (T x n_kv_heads blocks): from 64
# (query, KV head) pairs, a decode batch of 8 on Llama-3.2-1B; below it a block per (query, KV head) leaves most SMs
# idle and partitions of the keys win (measured against decode_gqa split into partitions: docs/bench-h200.md).
DECODE_GQA_MIN_BLOCKS = 64
# Keys whose K and V rows sit in shared memory (and, prefetched, in registers) at once. With many blocks, 16 keys x
# 128 threads read the KV fastest: longer chunks take more registers, so fewer blocks fit an SM; but while the grid
# is under GQA_FEW_BLOCKS blocks (2 per SM of a 132-SM GPU) fewer, longer chunks win (the sweep:
# scripts/sweep_decode_attention.py; measured: docs/bench-h200.md).
GQA_DECODE_KEY_CHUNK = 8 if SIMULATOR else 16
GQA_DECODE_KEY_CHUNK_FEW_BLOCKS = 8 if SIMULATOR else 64
GQA_FEW_BLOCKS = 2 * 132
# A bf16 pool's K/V elements per load: 1 (uint16 loads), 2 (uint32: a warp reads 128 bytes per load instruction, as
# it does from a float32 pool) or 4 (uint64); the rows are viewed as words of that size and each word is unpacked
# into the shared tile. scripts/time_kv_dtype_decode.py times each: with 16-key chunks 4 beats 2 at large batches,
# and 32- and 64-key chunks are slower with either (measured: docs/bench-h200.md).
KV_BF16_PER_LOAD = 4
_BF16_WORDS = {1: np.uint16, 2: np.uint32, 4: np.uint64}


@jit(device=True)
def _unpack_bf16(word, h):
    """bf16 number h (from the low half) of a packed word, as float32."""
    return bf16_to_f32((np.uint64(word) >> np.uint64(16 * h)) & np.uint64(0xFFFF))


@jit(device=True)
def _unpack_element(element, h):
    """A pool element loaded alone (float32, or one bf16 in uint16), as float32."""
    return kv_to_f32(element)


def kv_per_load(pool_dtype, head_dim: int) -> int:
    """Pool elements each K/V load of the decode kernels reads: 1 from a float32 pool, from a bf16 one
    KV_BF16_PER_LOAD, halved until it divides head_dim."""
    per_load = KV_BF16_PER_LOAD if np.dtype(pool_dtype) == np.uint16 else 1
    while head_dim % per_load:
        per_load //= 2
    return per_load


def _load_rows(k_pool, v_pool, per_load: int):
    """The pools as rows of slots (_pool_rows), in words of per_load bf16 for a bf16 pool."""
    rows = _pool_rows(k_pool, v_pool)
    return rows if k_pool.dtype == np.float32 else tuple(r.view(_BF16_WORDS[per_load]) for r in rows)


@functools.cache
def paged_attention_decode_gqa_kernel(head_dim: int, block_size: int, group: int, threads: int, key_chunk: int,
                                      pool_dtype=np.float32, per_load: int = 1):
    """The GQA decode kernel for one shape: a block per (query, KV head) serves the group's query heads
    from one shared copy of each K/V chunk (compile-time constants size the shared arrays and unroll loops).
    pool_dtype float32, or uint16 (bf16) loaded per_load elements at a time (k_rows and v_rows then in words of
    per_load bf16: _load_rows).

    Per chunk, four barriers: (1) the chunk's K/V rows, already in registers, into shared memory, then the
    next chunk's loads issued (they land during 2-4); (2) a thread per (head set, key) scores heads_per_item
    heads from one read of the key's K row (masked keys score -inf); (3) every thread
    takes each head's chunk max itself (broadcast reads, no reduction tree) and turns its scores into
    weights exp(score - m); (4) a thread per (head set, dim) adds weights @ V and the weights' sum, both
    rescaled by exp(m_old - m_new). Every shared read in (2)-(4) is a broadcast or a conflict-free row, four
    floats at a time where the layout allows (16-byte aligned tiles)."""
    heads_per_item = 2 if group % 2 == 0 else 1  # heads one thread scores / accumulates from one K or V read
    head_sets = group // heads_per_item
    assert per_load == 1 or np.dtype(pool_dtype) == np.uint16, "float32 pools load one element at a time"
    assert head_dim % per_load == 0, (head_dim, per_load)
    row_words = head_dim // per_load                       # loads per K (or V) row of one KV head
    load_type = _BF16_WORDS[per_load] if np.dtype(pool_dtype) == np.uint16 else np.float32
    unpack = _unpack_element if per_load == 1 else _unpack_bf16
    load_steps = cdiv(key_chunk * row_words, threads)      # tile loads each thread does
    score_steps = cdiv(head_sets * key_chunk, threads)     # (head set, key) items per thread
    out_steps = cdiv(head_sets * head_dim, threads)        # (head set, dim) items per thread
    k_row_stride = head_dim + SHARED_ROW_PAD               # keeps rows 16-byte aligned; thread j reading K row j
    #                                                        four floats at a time hits banks 4j..4j+3 (mod 32)
    assert head_dim % 4 == 0 and key_chunk % 4 == 0

    @jit(device=True)
    def load_chunk(k_rows, v_rows, block_tables, b, column, chunk_start, last, tid, k_loaded, v_loaded):
        """Issue this thread's loads of the chunk's K/V rows into registers. Load i is tile word
        e = tid + i * threads: key e // row_words, word e % row_words of its row (per_load elements from
        `column`, the KV head's first word; consecutive threads read consecutive words of a row: coalesced).
        Keys past the context load the last key again (branch-free; weights 0)."""
        for i in range(load_steps):
            e = _ix(tid) + _ix(i * threads)
            key = min(_ix(chunk_start) + min(e // _ix(row_words), _ix(key_chunk - 1)), _ix(last))
            row = _ix(block_tables[b, key // _ix(block_size)]) * _ix(block_size) + key % _ix(block_size)
            k_loaded[i] = k_rows[row, _ix(column) + e % _ix(row_words)]
            v_loaded[i] = v_rows[row, _ix(column) + e % _ix(row_words)]

    @jit
    def kernel(q, k_rows, v_rows, block_tables, query_seq, query_pos, scale, out):
        t = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        first_head = kv_head * group
        column = kv_head * row_words  # this KV head's first word of a pool row
        b = query_seq[t]
        context_len = query_pos[t] + 1  # causal: keys 0..position
        # one shared array per line: the simulator aliases two declared on the same line
        q_scaled = cuda.shared.array((group, head_dim), np.float32, alignment=SHARED_ALIGN)
        k_tile = cuda.shared.array((key_chunk, k_row_stride), np.float32, alignment=SHARED_ALIGN)
        v_tile = cuda.shared.array((key_chunk, head_dim), np.float32, alignment=SHARED_ALIGN)
        scores = cuda.shared.array((group, key_chunk), np.float32, alignment=SHARED_ALIGN)
        weights = cuda.shared.array((group, key_chunk), np.float32, alignment=SHARED_ALIGN)
        running_max = cuda.local.array(group, np.float32)   # m per head, the same in every thread
        rescale = cuda.local.array(group, np.float32)       # exp(m_old - m_new) of this chunk
        chunk_max = cuda.local.array(group, np.float32)
        acc = cuda.local.array((out_steps, heads_per_item), np.float32)
        sums = cuda.local.array((out_steps, heads_per_item), np.float32)  # l of the thread's (head, dim) items
        dot = cuda.local.array(heads_per_item, np.float32)
        k_loaded = cuda.local.array(load_steps, load_type)
        v_loaded = cuda.local.array(load_steps, load_type)
        for e in range(tid, group * head_dim, threads):
            q_scaled[e // head_dim, e % head_dim] = q[t, first_head + e // head_dim, e % head_dim] * scale
        for g in range(group):
            running_max[g] = np.float32(-math.inf)
        for s in range(out_steps):
            for i in range(heads_per_item):
                acc[s, i] = np.float32(0.0)
                sums[s, i] = np.float32(0.0)
        chunks = (context_len + key_chunk - 1) // key_chunk
        last = context_len - 1
        # Register prefetch: chunk c + 1's K/V loads are issued before chunk c's compute and land while it runs.
        load_chunk(k_rows, v_rows, block_tables, b, column, 0, last, tid, k_loaded, v_loaded)
        for chunk in range(chunks):
            chunk_start = chunk * key_chunk
            n_keys = min(key_chunk, context_len - chunk_start)
            # 1. this chunk's K and V rows (in registers) into shared memory as float32, once for the whole group
            for i in range(load_steps):
                e = _ix(tid) + _ix(i * threads)
                j = min(e // _ix(row_words), _ix(key_chunk - 1))  # past the tile: the last row, own value
                word_dim = (e % _ix(row_words)) * _ix(per_load)  # (not `d`: numba types it int64 below)
                for part in range(per_load):
                    k_tile[j, word_dim + _ix(part)] = unpack(k_loaded[i], part)
                    v_tile[j, word_dim + _ix(part)] = unpack(v_loaded[i], part)
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

        # out = acc / l for the thread's (head, dim) items
        for s in range(out_steps):
            item = tid + s * threads
            head_set = item // head_dim
            if head_set < head_sets:
                for i in range(heads_per_item):
                    out[t, first_head + head_set * heads_per_item + i, item % head_dim] = acc[s, i] / sums[s, i]

    return kernel


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
        per_load = kv_per_load(k_pool.dtype, head_dim)
        kernel = paged_attention_decode_gqa_kernel(head_dim, block_size, n_heads // n_kv_heads,
                                                   GQA_DECODE_THREADS, key_chunk, k_pool.dtype.type, per_load)
        kernel[(num_queries, n_kv_heads), GQA_DECODE_THREADS, launch_stream()](
            q, *_load_rows(k_pool, v_pool, per_load), block_tables, query_seq, query_pos, np.float32(scale), out)
    return out
