"""paged_attention_decode_warps and paged_attention_flash_decode_warps (kernels_numba/attention/decode_warps.py)
against paged_attention_ref, in the simulator: 2 warps of 32 lanes a block there (WARPS), 32-key chunks, as on the
GPU but for the warp count; flash_decode_warps' partitions of 64 keys there (FLASH_PARTITION_KEYS)."""
import numpy as np
import pytest

from kernels_numba.common import BufferArena, cdiv, cuda, host_version, launching_into
from kernels_numba.attention import paged_attention_ref
from kernels_numba.attention import decode_warps
from kernels_numba.attention.decode_warps import (CHUNK_KEYS, WARPS, paged_attention_decode_warps,
                                                  paged_attention_flash_decode_warps)
from kernels_numba.attention.partitions import merged_output
from kernels_numba.kv_dtype import kv_decode_ref, kv_encode_ref
from tests.helpers import poisoned

UNIT_ROUNDOFF = 2.0**-24
HUGE_KEY = np.float32(1e30)  # every pool slot no query may read: if one is read, its score swamps the real ones
LOG_F32_MAX = np.log(np.finfo(np.float32).max)
SPARE_BLOCKS = 2             # physical blocks no table reaches

# Contexts (query position + 1) of one launch, in the simulator's 2 warps of 32-key chunks: 1 key (warp 1 never sees
# a key); exactly one chunk; one key into warp 1's chunk; one chunk per warp; 3 chunks (warp 0 runs 2 rounds, warp
# 1 one real and one masked); 4 chunks; 5 chunks (3 rounds). Sequence 5 also gets a second query at key 40.
CONTEXTS = (1, CHUNK_KEYS, CHUNK_KEYS + 1, WARPS * CHUNK_KEYS, WARPS * CHUNK_KEYS + 1, 100, 130)
SECOND_QUERY = (5, 40)  # (sequence, context)


def _launch(rng, n_heads, n_kv_heads, head_dim, kv_dtype, block_size=16, contexts=CONTEXTS, q_gain=1.0,
            score_offset=0.0, launcher=paged_attention_decode_warps, table_padding=1):
    """One launch over shuffled block tables, queries in shuffled order; returns (got, want, tolerance, scores).
    Every slot past a sequence's last key, and every block no table reaches, holds a huge key and a NaN value.
    The tables are table_padding -1 blocks wider than the longest context needs (a CUDA graph's are padded to the
    model's length: flash_decode_warps launches a block per partition of that width)."""
    scale = np.float32(head_dim ** -0.5)
    seqs, lengths = list(range(len(contexts))), list(contexts)
    if len(contexts) > SECOND_QUERY[0]:
        seqs.append(SECOND_QUERY[0])
        lengths.append(SECOND_QUERY[1])
        assert SECOND_QUERY[1] <= contexts[SECOND_QUERY[0]]
    blocks_per_seq = [cdiv(n, block_size) for n in contexts]
    num_blocks = sum(blocks_per_seq) + SPARE_BLOCKS
    free = list(rng.permutation(num_blocks))
    tables = np.full((len(contexts), max(blocks_per_seq) + table_padding), -1, np.int32)
    shape = (num_blocks, block_size, n_kv_heads, head_dim)
    k_pool, v_pool = np.full(shape, HUGE_KEY, np.float32), np.full(shape, np.nan, np.float32)
    for s, n in enumerate(contexts):
        tables[s, : blocks_per_seq[s]] = [free.pop() for _ in range(blocks_per_seq[s])]
        for pos in range(n):
            block, offset = tables[s, pos // block_size], pos % block_size
            k_pool[block, offset] = rng.standard_normal((n_kv_heads, head_dim))
            v_pool[block, offset] = rng.standard_normal((n_kv_heads, head_dim))
    q = rng.standard_normal((len(seqs), n_heads, head_dim)).astype(np.float32) * np.float32(q_gain)
    if score_offset:  # every real score = score_offset + O(1): softmax ignores it, a naive exp overflows
        k_pool[..., 0][k_pool[..., 0] != HUGE_KEY] = 1.0
        q[..., 0] = score_offset / scale
    order = rng.permutation(len(seqs))
    query_seq = np.array(seqs, np.int32)[order]
    query_pos = np.array(lengths, np.int32)[order] - 1
    k_stored, v_stored = kv_encode_ref(k_pool, kv_dtype), kv_encode_ref(v_pool, kv_dtype)
    out = poisoned(q.shape, np.float32)
    got = launcher(cuda.to_device(q), cuda.to_device(k_stored), cuda.to_device(v_stored), cuda.to_device(tables),
                   cuda.to_device(query_seq), cuda.to_device(query_pos), scale, out=out)
    assert got is out
    k_values, v_values = kv_decode_ref(k_stored), kv_decode_ref(v_stored)  # a bf16 pool's rounded K/V
    want = paged_attention_ref(q, k_stored, v_stored, tables, query_seq, query_pos, scale)
    keys = [_gather(k_values, tables, s, p + 1) for s, p in zip(query_seq, query_pos)]
    values = [_gather(v_values, tables, s, p + 1) for s, p in zip(query_seq, query_pos)]
    group = n_heads // n_kv_heads
    scores = [keys[t][:, h // group].astype(np.float64) @ q[t, h] * scale
              for t in range(len(q)) for h in range(n_heads)]
    return out.copy_to_host(), want, _tolerance(q, keys, values, group, scale), scores


def _gather(pool, tables, seq, n_keys):
    return pool[tables[seq, : cdiv(n_keys, pool.shape[1])]].reshape(-1, *pool.shape[2:])[:n_keys]


def _tolerance(q, keys, values, group, scale):
    """|kernel - float64 reference| per (query, head), from float32 rounding alone (the kernel sums in another
    order than the reference, nothing else differs; a bf16 pool's values are the reference's too):
    each score (q * scale rounded, a head_dim-term dot) is off by at most E = gamma_{hd+1} scale max_j |q|.|k_j|,
    which moves every softmax weight by a factor within exp(+-2E): the output by expm1(2E) max|v|; the exps, the
    rescales and the running sums over n keys add a few ulps per key: (2n + 10) 4u max|v| (4u: a 2-ulp expf).
    Unit-scale random data, 1 to 130 keys: 3e-5 to 1.5e-4 of max|v| (worst-case bounds: the errors seen are ~6e-7)."""
    num_queries, n_heads, head_dim = q.shape
    terms = head_dim + 1
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    tol = np.empty((num_queries, n_heads, 1))
    for t in range(num_queries):
        k_abs, v_abs = np.abs(keys[t].astype(np.float64)), np.abs(values[t].astype(np.float64))
        for h in range(n_heads):
            score_err = gamma * scale * (k_abs[:, h // group] @ np.abs(q[t, h].astype(np.float64))).max()
            tail = (2 * len(keys[t]) + 10) * 4 * UNIT_ROUNDOFF
            tol[t, h] = (np.expm1(2 * score_err) + tail) * v_abs[:, h // group].max()
    return tol


def _check(got, want, tol):
    assert np.isfinite(want).all(), "the reference read a poisoned pool slot"
    assert np.isfinite(got).all(), "an output left unwritten (NaN poison), a poisoned slot read, or an overflow"
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= tol).all(), f"max err {err.max():.2e}, worst err/tol {(err / tol).max():.2f}"


# (n_heads, n_kv_heads, head_dim, pool dtype, block_size): groups 4 (Llama-3.2-1B), 3 (SmolLM2) and 1; head_dim 64
# (a bf16 row: 16 uint64 words, two keys per warp load; float32: 64 words, two per lane), 16 (bf16: 4 words, 8 keys
# per load), 12 (bf16: 3 words, 10 keys per load with 2 lanes idle and a last key set short of the chunk) and 48
# (float32: 48 words, lanes 16-31 own one word, lanes 0-15 two); blocks of 16 and 4 slots.
LAYOUTS = [(8, 2, 64, np.uint16, 16), (8, 2, 64, np.float32, 16), (6, 2, 64, np.uint16, 16),
           (2, 2, 64, np.float32, 16), (4, 1, 16, np.uint16, 4), (3, 1, 16, np.float32, 16),
           (4, 2, 12, np.uint16, 16), (2, 1, 48, np.float32, 16)]


@pytest.mark.parametrize("n_heads, n_kv_heads, head_dim, kv_dtype, block_size", LAYOUTS)
def test_decode_warps_matches_ref(rng, n_heads, n_kv_heads, head_dim, kv_dtype, block_size):
    _check(*_launch(rng, n_heads, n_kv_heads, head_dim, kv_dtype, block_size)[:3])


@pytest.mark.parametrize("kv_dtype", [np.uint16, np.float32])
def test_decode_warps_stable_with_huge_score_gaps(rng, kv_dtype):
    # Scores over +-1000s: each warp's running max rises chunk after chunk and exp(m_old - m_new) underflows to 0.
    got, want, tol, scores = _launch(rng, 4, 1, 16, kv_dtype, contexts=(CHUNK_KEYS + 1, 130), q_gain=300.0)
    _check(got, want, tol)
    assert max(np.abs(s).max() for s in scores) > 2 * LOG_F32_MAX, "scores too small to prove anything"


@pytest.mark.parametrize("score_offset", [600.0, -600.0])
def test_decode_warps_stable_when_every_naive_exp_overflows_or_underflows(rng, score_offset):
    # Every score 600 +- O(1) (or -600): exp(score) is inf (or 0, so 0/0) in float32 for every key.
    got, want, tol, scores = _launch(rng, 4, 1, 16, np.uint16, contexts=(5, 130), score_offset=score_offset)
    _check(got, want, tol)
    assert min(np.abs(s).min() for s in scores) > LOG_F32_MAX + np.log(64), "some naive exp would be finite"


def test_decode_warps_with_one_warp_and_with_three(rng, monkeypatch):
    # The warp count is a launch constant: one warp runs every chunk itself, three give 65 keys 3 chunks in 1 round.
    for warps in (1, 3):
        monkeypatch.setattr(decode_warps, "WARPS", warps)
        _check(*_launch(rng, 8, 2, 64, np.uint16, contexts=(1, 33, 65, 100))[:3])


def test_decode_warps_no_queries():
    q = cuda.to_device(np.zeros((0, 4, 16), np.float32))
    pool = cuda.to_device(np.zeros((2, 16, 1, 16), np.uint16))
    none = cuda.to_device(np.zeros(0, np.int32))
    out = paged_attention_decode_warps(q, pool, pool, cuda.to_device(np.zeros((1, 2), np.int32)), none, none, 1.0)
    assert out.shape == (0, 4, 16)


# flash_decode_warps: the contexts above (1 to 130 keys) in 64-key partitions: one partition (finished by its own
# block), two, three with a partial last one; 2-round partitions (128 keys) and partitions of one chunk (32 keys:
# warp 1 never has a key) by the partition size; tables padded to 25 partitions, whose blocks past a context leave.
@pytest.mark.parametrize("n_heads, n_kv_heads, head_dim, kv_dtype, block_size", LAYOUTS[:3] + LAYOUTS[4:5])
def test_flash_decode_warps_matches_ref(rng, n_heads, n_kv_heads, head_dim, kv_dtype, block_size):
    _check(*_launch(rng, n_heads, n_kv_heads, head_dim, kv_dtype, block_size,
                    launcher=paged_attention_flash_decode_warps)[:3])


@pytest.mark.parametrize("partition_keys", [CHUNK_KEYS, 2 * WARPS * CHUNK_KEYS])
def test_flash_decode_warps_any_partition_size(rng, monkeypatch, partition_keys):
    monkeypatch.setattr(decode_warps, "FLASH_PARTITION_KEYS", partition_keys)
    _check(*_launch(rng, 8, 2, 64, np.uint16, contexts=(1, 33, 65, 100, 130, 200),
                    launcher=paged_attention_flash_decode_warps)[:3])


def test_flash_decode_warps_tables_padded_and_stable(rng):
    # Scores over +-1000s, each partition's max far from the others': the merge's rescales underflow to 0.
    got, want, tol, scores = _launch(rng, 4, 1, 16, np.uint16, contexts=(CHUNK_KEYS + 1, 130), q_gain=300.0,
                                     launcher=paged_attention_flash_decode_warps, table_padding=90)
    _check(got, want, tol)
    assert max(np.abs(s).max() for s in scores) > 2 * LOG_F32_MAX, "scores too small to prove anything"


def test_flash_decode_warps_replays_on_the_same_buffers(rng):
    # A decode graph replays the launch with the same states and counters: each (query, KV head)'s counter must be
    # back at 0 after every launch, or the next launch would never merge (out stays poisoned).
    arena = BufferArena()

    def replayed(*args, out):
        if arena.buffers:  # the first launch records them
            arena.rewind()
        with launching_into(0, arena):
            return paged_attention_flash_decode_warps(*args, out=out)

    for _ in range(3):
        _check(*_launch(rng, 8, 2, 64, np.uint16, contexts=(130, 65, 20), launcher=replayed)[:3])
        counters = [b for b in arena.buffers if b.dtype == np.int32]
        assert len(counters) == 1 and (counters[0].copy_to_host() == 0).all(), "a counter was not reset"


def test_merged_partitions_are_one_softmax_over_every_key(rng):
    # partitions.merged_output (on the host: the kernels' arithmetic) over the states of uneven partitions (1 to 17
    # keys, maxima far apart) against softmax over all 40 keys at once, in float64.
    scores = rng.standard_normal(40) * 30.0
    values = rng.standard_normal((40, 3))
    bounds = [0, 1, 18, 25, 40]
    partitions = len(bounds) - 1
    part_max = np.zeros((1, 1, partitions), np.float32)
    part_sum = np.zeros((1, 1, partitions), np.float32)
    part_acc = np.zeros((1, 1, partitions, 3), np.float32)
    for p, (a, b) in enumerate(zip(bounds, bounds[1:])):
        m = scores[a:b].max()
        weights = np.exp(scores[a:b] - m)
        part_max[0, 0, p], part_sum[0, 0, p], part_acc[0, 0, p] = m, weights.sum(), weights @ values[a:b]
    weights = np.exp(scores - scores.max())
    want = weights @ values / weights.sum()
    merge = host_version(merged_output)
    got = np.array([merge(part_max, part_sum, part_acc, 0, 0, d, partitions) for d in range(3)])
    # float32 states and a running merge of 4 partitions: a few ulps of max |v| (values are O(1))
    np.testing.assert_allclose(got, want, rtol=0, atol=20 * np.finfo(np.float32).eps * np.abs(values).max())
