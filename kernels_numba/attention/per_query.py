"""Paged attention, one thread per (query, head): the readable varlen kernel (the simulator's for decode and
prefill alike, but for the fast precision's prefill: prefill_tc). The math and the pool layout: paged_kv.

- `paged_attention_per_query`: varlen queries, one thread per (query, head): query t of sequence s at
  position p walks s's blocks over keys 0..p, keeping a running max m, a running sum l and the head_dim
  accumulator in a cuda.local.array; when a score raises m, l and the accumulator are rescaled by
  exp(m_old - m_new), so exp never sees a positive argument. No shared memory, no syncthreads. Grid:
  grid_stride_launch(T * n_heads, THREADS), so the simulator can run a small grid. It serves decode
  (`paged_attention_decode`: one query per sequence at its newest position) and, in the simulator where
  syncthreads cost milliseconds, prefill too.
"""
import math

import numpy as np

from ..common import cuda, jit, grid_stride_launch, launch_stream
from ..kv_dtype import kv_to_f32
from .paged_kv import MAX_HEAD_DIM, THREADS, _check_pool, _check_queries, _output, _to_host, paged_attention_ref


@jit(device=True)
def attend_to_key(q_scaled, k_cache, v_cache, row, column, kv_head, head_dim, acc, running_max, running_sum):
    """One online-softmax step: fold the key/value at cache[row, column] (a block and offset of the paged KV pool,
    float32 or bf16 bits; a sequence slot and position of lessons/contiguous_cache.py's cache) into acc, return the
    new (max, sum)."""
    score = np.float32(0.0)
    for d in range(head_dim):
        score += q_scaled[d] * kv_to_f32(k_cache[row, column, kv_head, d])
    if score > running_max:
        correction = np.float32(math.exp(running_max - score))  # exp(-inf) = 0 on the first key
        running_sum *= correction
        for d in range(head_dim):
            acc[d] *= correction
        running_max = score
    weight = np.float32(math.exp(score - running_max))
    running_sum += weight
    for d in range(head_dim):
        acc[d] += weight * kv_to_f32(v_cache[row, column, kv_head, d])
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


def paged_attention_decode_ref(q, k_pool, v_pool, block_tables, context_lens, scale):
    """numpy twin of paged_attention_decode: one query per sequence, at its last position."""
    batch = q.shape[0]
    return paged_attention_ref(q, k_pool, v_pool, block_tables, np.arange(batch), context_lens - 1, scale)
