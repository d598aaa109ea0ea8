"""The paged KV pool every paged attention kernel reads: the K/V write, the checks the launchers share,
and `paged_attention_ref`, the numpy twin of every paged attention launcher.

    out[t, h] = sum_{j<=p} softmax_j(scale * q[t, h] . K(s, j)[g]) V(s, j)[g]
        s = the query's sequence, p = its position, g = h // (n_heads // n_kv_heads),
        K(s, j) = k_pool[block_tables[s, j // block_size], j % block_size]

KV pool per layer: k_pool, v_pool [num_blocks, block_size, n_kv_heads, head_dim], float32 or bf16 bit patterns
(uint16, kernels_numba.kv_dtype: written as kv_from_f32(x, pool), read as kv_to_f32(element)). A slot is
`block_id * block_size + offset`; a sequence's row of block_tables (int32 [num_seqs, max_blocks_per_seq],
-1 padded) lists its physical blocks in logical order, so blocks need not be contiguous and several
sequences may share the same prefix blocks.

- `write_kv_paged`: copies k and v into their slot, one thread per (token, kv head, d) on the GPU (grid-stride,
  so the simulator can run a small grid); slot -1 = padding, skipped. A bf16 pool gets k and v rounded to
  nearest even.

Every paged launcher reads both pool dtypes (numba compiles a kernel per pool dtype); with a bf16 pool the
attention is the float32 pool's math on the bf16-rounded K/V, so `paged_attention_ref` decodes the pool first.
"""
import numpy as np

from ..common import cuda, jit, cdiv, grid_stride_launch, launch_stream, device_empty
from ..kv_dtype import check_kv_pool_dtype, kv_decode_ref, kv_encode_ref, kv_from_f32

THREADS = 128
MAX_HEAD_DIM = 256  # size of the per-thread accumulator: cuda.local.array needs a compile-time size


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
        k_pool[slot // block_size, slot % block_size, kv_head, d] = kv_from_f32(k[t, kv_head, d], k_pool)
        v_pool[slot // block_size, slot % block_size, kv_head, d] = kv_from_f32(v[t, kv_head, d], v_pool)


@jit(device=True)
def _ix(i):
    """An index as uint64: numba then skips its negative-index wraparound (a sign test and an add per index),
    and LLVM can fold shared-array addresses into base + constant offsets. For indices known to be >= 0."""
    return np.uint64(i)


def _to_host(x) -> np.ndarray:
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


def _check_pool(q, k_pool, v_pool, block_tables):
    n_heads, head_dim = q.shape[1:]
    assert k_pool.ndim == 4 and k_pool.shape == v_pool.shape, (k_pool.shape, v_pool.shape)
    check_kv_pool_dtype(k_pool, v_pool)
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
    check_kv_pool_dtype(k_pool, v_pool)
    assert slot_mapping.shape == (k.shape[0],) and slot_mapping.dtype == np.int32, (slot_mapping.shape,
                                                                                    slot_mapping.dtype)
    if k.size > 0:
        blocks, threads = grid_stride_launch(k.size, THREADS)
        write_kv_paged_kernel[blocks, threads, launch_stream()](k, v, k_pool, v_pool, slot_mapping)


def write_kv_paged_ref(k, v, k_pool, v_pool, slot_mapping):
    """numpy twin of write_kv_paged: returns updated copies of the pools (k, v encoded as the pools store them)."""
    k_pool, v_pool = k_pool.copy(), v_pool.copy()
    real = slot_mapping >= 0
    block_size = k_pool.shape[1]
    blocks, offsets = slot_mapping[real] // block_size, slot_mapping[real] % block_size
    k_pool[blocks, offsets] = kv_encode_ref(k[real], k_pool.dtype)
    v_pool[blocks, offsets] = kv_encode_ref(v[real], v_pool.dtype)
    return k_pool, v_pool


def paged_attention_ref(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale):
    """numpy twin of every paged attention launcher: gathers each query's keys through the block table (a bf16
    pool decoded to its float32 values first), then a materialised, max-subtracted softmax in float64."""
    k_pool, v_pool = kv_decode_ref(np.asarray(k_pool)), kv_decode_ref(np.asarray(v_pool))
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
