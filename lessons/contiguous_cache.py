"""Lesson: causal grouped-query attention over a contiguous float32 KV cache, the simplest form of the
attention the engine runs. Production: kernels_numba/attention/per_query.py (the same one-thread-per-(query, head)
walk, but through the paged pool's block tables) and the paged kernels beside it.

    out[t, h] = sum_{j<=p} softmax_j(scale * q[t, h] . K[s, j, g]) V[s, j, g]     s = seq_slots[t], p = positions[t],
                                                                                 g = h // (n_heads // n_kv_heads)

What it does differently: the cache is one float32 array per layer, k_cache, v_cache [max_seqs, max_seq_len,
n_kv_heads, head_dim], the token at position p of the sequence in slot s at [s, p]. Every sequence reserves
max_seq_len rows whether it uses them or not, which is what the paged pool (kernels_numba/attention/paged_kv.py)
avoids; the attention math is the same, one key's step shared: `attend_to_key`.
Both kernels give one thread per item on the GPU and loop grid-stride, so the simulator can run a small grid.
- `write_kv`: one thread per (token, kv head, d) copies k and v into the cache.
- `attention`: one thread per (token, head) walks keys 0..p once, keeping a running max m, a running sum l
  and the head_dim accumulator in a cuda.local.array (attend_to_key rescales l and the accumulator by
  exp(m_old - m_new) when a score raises m, so exp never sees a positive argument). The same kernel serves
  prefill (write_kv of the whole prompt, then every position as a query) and decode (one query per sequence
  at its newest position). Grid: grid_stride_launch(T * n_heads, THREADS).
"""
import math

import numpy as np

from kernels_numba.attention.paged_kv import MAX_HEAD_DIM
from kernels_numba.attention.per_query import attend_to_key
from kernels_numba.common import cuda, jit, grid_stride_launch, launch_stream, device_empty

THREADS = 128


@jit
def write_kv_kernel(k, v, k_cache, v_cache, seq_slots, positions):
    num_tokens, n_kv_heads, head_dim = k.shape
    for i in range(cuda.grid(1), num_tokens * n_kv_heads * head_dim, cuda.gridsize(1)):
        t = i // (n_kv_heads * head_dim)
        kv_head = (i // head_dim) % n_kv_heads
        d = i % head_dim
        slot = seq_slots[t]
        pos = positions[t]
        k_cache[slot, pos, kv_head, d] = k[t, kv_head, d]
        v_cache[slot, pos, kv_head, d] = v[t, kv_head, d]


@jit
def attention_kernel(q, k_cache, v_cache, seq_slots, positions, scale, out):
    num_tokens, n_heads, head_dim = q.shape
    q_scaled = cuda.local.array(MAX_HEAD_DIM, np.float32)
    acc = cuda.local.array(MAX_HEAD_DIM, np.float32)
    for i in range(cuda.grid(1), num_tokens * n_heads, cuda.gridsize(1)):
        t = i // n_heads
        h = i % n_heads
        kv_head = h // (n_heads // k_cache.shape[2])
        slot = seq_slots[t]
        pos = positions[t]

        for d in range(head_dim):
            q_scaled[d] = q[t, h, d] * scale  # scale once here, so each score is a plain dot product
            acc[d] = np.float32(0.0)
        running_max = np.float32(-math.inf)
        running_sum = np.float32(0.0)

        for j in range(pos + 1):  # the causal mask: nothing past position p is ever read
            running_max, running_sum = attend_to_key(q_scaled, k_cache, v_cache, slot, j, kv_head, head_dim, acc,
                                                     running_max, running_sum)

        inv_sum = np.float32(1.0) / running_sum
        for d in range(head_dim):
            out[t, h, d] = acc[d] * inv_sum


def _check_cache(k_cache, v_cache, seq_slots, positions, num_tokens):
    assert k_cache.ndim == 4 and k_cache.shape == v_cache.shape, (k_cache.shape, v_cache.shape)
    assert k_cache.dtype == np.float32 and v_cache.dtype == np.float32, (k_cache.dtype, v_cache.dtype)
    assert seq_slots.shape == (num_tokens,) and positions.shape == (num_tokens,), (seq_slots.shape, positions.shape)
    assert seq_slots.dtype == np.int32 and positions.dtype == np.int32, (seq_slots.dtype, positions.dtype)


def write_kv(k, v, k_cache, v_cache, seq_slots, positions):
    """Store k[t], v[t] ([T, n_kv_heads, head_dim]) at cache[seq_slots[t], positions[t]]."""
    assert k.shape == v.shape and k.shape[1:] == k_cache.shape[2:], (k.shape, v.shape, k_cache.shape)
    _check_cache(k_cache, v_cache, seq_slots, positions, k.shape[0])
    if k.size > 0:
        blocks, threads = grid_stride_launch(k.size, THREADS)
        write_kv_kernel[blocks, threads, launch_stream()](k, v, k_cache, v_cache, seq_slots, positions)


def attention(q, k_cache, v_cache, seq_slots, positions, scale, out=None):
    """Causal GQA: q [T, n_heads, head_dim] attends to cache[seq_slots[t], 0..positions[t]]. Returns out."""
    num_tokens, n_heads, head_dim = q.shape
    n_kv_heads = k_cache.shape[2]
    _check_cache(k_cache, v_cache, seq_slots, positions, num_tokens)
    assert k_cache.shape[3] == head_dim, (q.shape, k_cache.shape)
    assert head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} > MAX_HEAD_DIM {MAX_HEAD_DIM}"
    assert n_heads % n_kv_heads == 0, f"{n_heads} query heads do not group over {n_kv_heads} kv heads"
    out = device_empty(q.shape, np.float32) if out is None else out
    assert out.shape == q.shape and out.dtype == np.float32, (out.shape, out.dtype)
    if num_tokens > 0:
        blocks, threads = grid_stride_launch(num_tokens * n_heads, THREADS)
        attention_kernel[blocks, threads, launch_stream()](
            q, k_cache, v_cache, seq_slots, positions, np.float32(scale), out)
    return out


def write_kv_ref(k, v, k_cache, v_cache, seq_slots, positions):
    """numpy twin of write_kv: returns updated copies of the caches."""
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    k_cache[seq_slots, positions] = k
    v_cache[seq_slots, positions] = v
    return k_cache, v_cache


def attention_ref(q, k_cache, v_cache, seq_slots, positions, scale):
    """numpy twin of attention: materialised scores, max-subtracted softmax, all in float64."""
    num_tokens, n_heads, head_dim = q.shape
    group = n_heads // k_cache.shape[2]
    out = np.empty(q.shape, np.float64)
    for t in range(num_tokens):
        keys = k_cache[seq_slots[t], : positions[t] + 1].astype(np.float64)    # [p+1, n_kv, hd]
        values = v_cache[seq_slots[t], : positions[t] + 1].astype(np.float64)
        for h in range(n_heads):
            scores = keys[:, h // group] @ q[t, h].astype(np.float64) * scale
            weights = np.exp(scores - scores.max())
            out[t, h] = weights @ values[:, h // group] / weights.sum()
    return out.astype(np.float32)
