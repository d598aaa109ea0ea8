from dataclasses import dataclass

import numpy as np
import pytest

from kernels_numba.common import BufferArena, cdiv, cuda, device_zeros, launching_into
import kernels_numba.attention.decode_gqa as decode_gqa_module
import kernels_numba.attention.prefill_gqa as prefill_gqa_module
from kernels_numba.attention.prefill_gqa import _gqa_shared_bytes
from kernels_numba.attention import (
    GQA_SHARED_BYTES, QTILE, build_prefill_gqa_tiles, build_prefill_tiles, gqa_shape,
    paged_attention_decode, paged_attention_decode_ref, paged_attention_per_query, paged_attention_prefill,
    paged_attention_prefill_gqa, paged_attention_ref, write_kv_paged,
    paged_attention_decode_gqa, paged_attention_flash_decode_warps,
    write_kv_paged_ref, prefill_tiles_host)
from kernels_numba.kv_dtype import kv_decode_ref, kv_encode_ref
from tests.helpers import poisoned

UNIT_ROUNDOFF = 2.0**-24
HUGE_KEY = np.float32(1e30)  # if ever read, its score swamps every real key and the NaN value behind it wins
LOG_F32_MAX = np.log(np.finfo(np.float32).max)  # ~88.7: exp of a score above this overflows float32
SPARE_BLOCKS = 3  # physical blocks no block table reaches: they stay poisoned

# (block_size, n_heads, n_kv_heads, head_dim): block sizes 4 and 16, GQA ratios 1, 2, 3, 3, head dims 12 and 16
LAYOUTS = [(4, 2, 2, 16), (16, 4, 2, 12), (4, 6, 2, 12), (16, 3, 1, 16)]


@dataclass
class SeqSpec:
    length: int                 # tokens in the pool after this step
    cached: int                 # tokens already in the pool before it (the rest arrive now)
    share_from: int = -1        # another sequence whose first `shared_blocks` physical blocks this one reuses
    shared_blocks: int = 0


def _scenario(name: str, block_size: int) -> list[SeqSpec]:
    if name == "decode":  # lengths 1, a partial block, one and several full tiles, odd tails
        return [SeqSpec(n, n - 1) for n in (1, 6, 16, 21, 33)]
    if name == "whole_prompt":
        return [SeqSpec(3, 0), SeqSpec(16, 0), SeqSpec(21, 0)]
    if name == "chunked":  # second chunks of prompts whose first chunk is in the pool; one decode-like query
        return [SeqSpec(21, 9), SeqSpec(30, 16), SeqSpec(7, 6)]
    if name == "shared_prefix":  # sequences 1 and 2 hit sequence 0's cached prefix blocks
        shared = cdiv(9, block_size)
        prefix = shared * block_size
        return [SeqSpec(23, 17), SeqSpec(prefix + 11, prefix, 0, shared), SeqSpec(prefix + 2, prefix, 0, shared)]
    if name == "long_chunk":  # 36 new queries after 9 cached keys, and a 20-token prompt: 2 x 32-key tiles
        return [SeqSpec(45, 9), SeqSpec(20, 0)]
    raise ValueError(name)


@dataclass
class Step:
    """Host inputs of one forward step over a paged pool."""
    q: np.ndarray             # [T, n_heads, hd], the new tokens' queries
    k: np.ndarray             # [T + 1, n_kv, hd]: the new tokens' keys plus one padding row (slot -1)
    v: np.ndarray
    slot_mapping: np.ndarray  # [T + 1]
    k_pool: np.ndarray        # before the write: cached tokens real, everything else poisoned
    v_pool: np.ndarray
    block_tables: np.ndarray
    query_seq: np.ndarray     # [T]
    query_pos: np.ndarray     # [T]


def _step(rng, specs, block_size, n_heads, n_kv_heads, head_dim, shuffle=True) -> Step:
    """Random shuffled block tables over a pool where every entry no test writes is a huge key and a NaN value."""
    own_blocks = [cdiv(s.length, block_size) - s.shared_blocks for s in specs]
    num_blocks = sum(own_blocks) + SPARE_BLOCKS
    free = list(rng.permutation(num_blocks))
    block_tables = np.full((len(specs), max(cdiv(s.length, block_size) for s in specs) + 1), -1, np.int32)
    for i, (spec, own) in enumerate(zip(specs, own_blocks)):
        shared = list(block_tables[spec.share_from, : spec.shared_blocks]) if spec.shared_blocks else []
        assert all(b >= 0 for b in shared) and spec.cached >= spec.shared_blocks * block_size
        block_tables[i, : spec.shared_blocks + own] = shared + [free.pop() for _ in range(own)]

    shape = (num_blocks, block_size, n_kv_heads, head_dim)
    k_pool, v_pool = np.full(shape, HUGE_KEY, np.float32), np.full(shape, np.nan, np.float32)
    slots, query_seq, query_pos = [], [], []
    for i, spec in enumerate(specs):
        for pos in range(spec.length):
            block, offset = block_tables[i, pos // block_size], pos % block_size
            if pos >= spec.cached:
                slots.append(block * block_size + offset)
                query_seq.append(i)
                query_pos.append(pos)
            elif pos >= spec.shared_blocks * block_size:  # shared positions were written by their owner
                assert np.isnan(v_pool[block, offset]).all(), "two sequences own one slot"
                k_pool[block, offset] = rng.standard_normal((n_kv_heads, head_dim))
                v_pool[block, offset] = rng.standard_normal((n_kv_heads, head_dim))
    order = rng.permutation(len(slots)) if shuffle else np.arange(len(slots))
    num_tokens = len(slots)
    padding_at = rng.integers(0, num_tokens + 1)
    return Step(
        q=rng.standard_normal((num_tokens, n_heads, head_dim)).astype(np.float32),
        k=rng.standard_normal((num_tokens + 1, n_kv_heads, head_dim)).astype(np.float32),
        v=rng.standard_normal((num_tokens + 1, n_kv_heads, head_dim)).astype(np.float32),
        slot_mapping=np.insert(np.array(slots, np.int32)[order], padding_at, -1).astype(np.int32),
        k_pool=k_pool, v_pool=v_pool, block_tables=block_tables,
        query_seq=np.array(query_seq, np.int32)[order], query_pos=np.array(query_pos, np.int32)[order])


def _write(step: Step, kv_dtype=np.float32):
    """write_kv_paged on the device into pools of kv_dtype (float32, or uint16 bf16 bits: the step's pools encoded,
    poison included); checks the pools bit-exactly and returns the device pools and the host pools' float32 values
    (a bf16 pool's decoded: the rounded K/V every attention reference then uses)."""
    k_pool, v_pool = kv_encode_ref(step.k_pool, kv_dtype), kv_encode_ref(step.v_pool, kv_dtype)
    d_k_pool, d_v_pool = cuda.to_device(k_pool), cuda.to_device(v_pool)
    write_kv_paged(cuda.to_device(step.k), cuda.to_device(step.v), d_k_pool, d_v_pool,
                   cuda.to_device(step.slot_mapping))
    want_k_pool, want_v_pool = write_kv_paged_ref(step.k, step.v, k_pool, v_pool, step.slot_mapping)
    # A copy (or a bf16 rounding to nearest even) is bit-exact; the padding row lands nowhere and every other entry
    # keeps its poison (NaN == NaN here).
    np.testing.assert_array_equal(d_k_pool.copy_to_host(), want_k_pool)
    np.testing.assert_array_equal(d_v_pool.copy_to_host(), want_v_pool)
    return d_k_pool, d_v_pool, kv_decode_ref(want_k_pool), kv_decode_ref(want_v_pool)


def _gather(pool, block_tables, seq, n_keys):
    blocks = block_tables[seq, : cdiv(n_keys, pool.shape[1])]
    return pool[blocks].reshape(-1, *pool.shape[2:])[:n_keys]


def _tolerance(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale):
    """Per-(query, head) bound on |kernel - float64 reference|, from the float32 error sources.

    Each float32 score (q*scale rounded, then a head_dim dot) is off by at most
    E = gamma_{hd+1} * scale * max_j sum_d |q_d k_jd|. Shifting every score by at most E moves each normalised
    softmax weight by a factor within exp(+-2E), so the output moves by at most expm1(2E) * max|v|.
    The float32 exps, the rescales (per key in decode, per key tile in both prefills) and the two running sums (l
    and the accumulator) over p+1 keys add a relative error of a few ulps per key: (2(p+1) + 10) * 4u * max|v|
    covers them with room (4u allows for a 2-ulp expf on the GPU). Scores of O(1) give ~1e-5; O(1000), ~1e-3.
    """
    num_tokens, n_heads, head_dim = q.shape
    group = n_heads // k_pool.shape[2]
    terms = head_dim + 1
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    tol = np.empty((num_tokens, n_heads, 1))
    for t in range(num_tokens):
        n_keys = query_pos[t] + 1
        keys = np.abs(_gather(k_pool, block_tables, query_seq[t], n_keys).astype(np.float64))
        values = np.abs(_gather(v_pool, block_tables, query_seq[t], n_keys).astype(np.float64))
        for h in range(n_heads):
            score_err = gamma * scale * (keys[:, h // group] @ np.abs(q[t, h].astype(np.float64))).max()
            tail = (2 * n_keys + 10) * 4 * UNIT_ROUNDOFF
            tol[t, h] = (np.expm1(2 * score_err) + tail) * values[:, h // group].max()
    return tol


def _stretch(step: Step, scale, q_gain, score_offset):
    """q_gain stretches the gaps between scores; score_offset adds the same constant to every real score
    (softmax ignores it, a naive exp does not). Poisoned keys stay poisoned."""
    step.q *= np.float32(q_gain)
    if score_offset:
        step.k[..., 0] = 1.0
        step.k_pool[..., 0][step.k_pool[..., 0] != HUGE_KEY] = 1.0
        step.q[..., 0] = score_offset / scale


def _check(rng, scenario, block_size, n_heads, n_kv_heads, head_dim, q_gain=1.0, score_offset=0.0, kernel="tiled",
           table_width=0, kv_dtype=np.float32):
    """Build a step, write its K/V, run decode or prefill, compare to the reference; returns the scores.
    kernel "tiled": the scenario's own launcher (decode or prefill); "per_query" / "decode_gqa" / "flash_decode_warps" /
    "gqa": that kernel (gqa: paged_attention_prefill_gqa) on the step's varlen queries, whatever the scenario; a
    launcher with per_query's signature (a lesson's, tests/lessons/) likewise. table_width: pad the block tables
    with -1 to that many blocks (a graph's longest context).
    kv_dtype: the pools' (np.uint16: bf16 bits); the reference and the tolerance use the pools' float32 values."""
    decode = scenario == "decode"
    step = _step(rng, _scenario(scenario, block_size), block_size, n_heads, n_kv_heads, head_dim,
                 shuffle=not decode)
    padding = max(0, table_width - step.block_tables.shape[1])
    step.block_tables = np.pad(step.block_tables, ((0, 0), (0, padding)), constant_values=-1)
    scale = 1.0 / np.sqrt(head_dim)
    _stretch(step, scale, q_gain, score_offset)
    d_k_pool, d_v_pool, k_pool, v_pool = _write(step, kv_dtype)
    d_q, d_tables = cuda.to_device(step.q), cuda.to_device(step.block_tables)
    out = poisoned(step.q.shape, np.float32)

    if decode and kernel == "tiled":
        assert (step.query_seq == np.arange(len(step.q))).all()
        context_lens = (step.query_pos + 1).astype(np.int32)
        got = paged_attention_decode(d_q, d_k_pool, d_v_pool, d_tables, cuda.to_device(context_lens), scale,
                                     out=out)
        want = paged_attention_decode_ref(step.q, k_pool, v_pool, step.block_tables, context_lens, scale)
    elif kernel == "gqa":  # one block per (query tile, KV head); whole_prompt lets the launcher build the tiles
        d_seq, d_pos = cuda.to_device(step.query_seq), cuda.to_device(step.query_pos)
        tiles = (None if scenario == "whole_prompt"
                 else build_prefill_gqa_tiles(d_seq, d_pos, head_dim, n_heads // n_kv_heads))
        got = paged_attention_prefill_gqa(d_q, d_k_pool, d_v_pool, d_tables, d_seq, d_pos, scale, out=out,
                                          tiles=tiles)
        want = paged_attention_ref(step.q, k_pool, v_pool, step.block_tables, step.query_seq, step.query_pos,
                                   scale)
    elif callable(kernel) or kernel in ("per_query", "decode_gqa", "flash_decode_warps"):  # varlen queries: a thread
        launch = kernel if callable(kernel) else {  # / block per (query, head or KV head)
            "per_query": paged_attention_per_query, "decode_gqa": paged_attention_decode_gqa,
            "flash_decode_warps": paged_attention_flash_decode_warps}[kernel]
        got = launch(d_q, d_k_pool, d_v_pool, d_tables, cuda.to_device(step.query_seq),
                     cuda.to_device(step.query_pos), scale, out=out)
        want = paged_attention_ref(step.q, k_pool, v_pool, step.block_tables, step.query_seq, step.query_pos,
                                   scale)
    else:
        d_seq, d_pos = cuda.to_device(step.query_seq), cuda.to_device(step.query_pos)
        # whole_prompt lets the launcher build the tiles; the others pass them prebuilt, as a runner would
        tiles = None if scenario == "whole_prompt" else build_prefill_tiles(d_seq, d_pos)
        got = paged_attention_prefill(d_q, d_k_pool, d_v_pool, d_tables, d_seq, d_pos, scale, out=out,
                                      tiles=tiles)
        want = paged_attention_ref(step.q, k_pool, v_pool, step.block_tables, step.query_seq, step.query_pos,
                                   scale)
    assert got is out
    got = out.copy_to_host()
    assert np.isfinite(want).all(), "the reference itself read a poisoned pool entry"
    assert np.isfinite(got).all(), "the kernel left an output unwritten, read a poisoned entry or overflowed"
    err = np.abs(got.astype(np.float64) - want)
    tol = _tolerance(step.q, k_pool, v_pool, step.block_tables, step.query_seq, step.query_pos, scale)
    assert (err <= tol).all(), f"max err {err.max()}, worst err/tol {(err / tol).max()}"

    group = n_heads // n_kv_heads
    return [_gather(k_pool, step.block_tables, s, p + 1)[:, h // group] @ step.q[t, h] * scale
            for t, (s, p) in enumerate(zip(step.query_seq, step.query_pos)) for h in range(n_heads)]


@pytest.mark.parametrize("block_size, n_heads, n_kv_heads, head_dim", LAYOUTS)
def test_decode_matches_ref(rng, block_size, n_heads, n_kv_heads, head_dim):
    _check(rng, "decode", block_size, n_heads, n_kv_heads, head_dim)


# Each prefill scenario runs on two layouts (one per block size) to keep the simulator time down.
@pytest.mark.parametrize("scenario, layout", [
    ("whole_prompt", LAYOUTS[0]), ("whole_prompt", LAYOUTS[1]),
    ("chunked", LAYOUTS[2]), ("chunked", LAYOUTS[3]),
    ("shared_prefix", LAYOUTS[1]), ("shared_prefix", LAYOUTS[2])])
def test_prefill_matches_ref(rng, scenario, layout):
    _check(rng, scenario, *layout)


@pytest.mark.parametrize("scenario, layout", [
    ("whole_prompt", LAYOUTS[0]), ("chunked", LAYOUTS[3]), ("shared_prefix", LAYOUTS[2])])
def test_per_query_kernel_serves_prefill_too(rng, scenario, layout):
    _check(rng, scenario, *layout, kernel="per_query")


STABILITY_CASES = [(scenario, kernel) for kernel in ("tiled", "decode_gqa", "flash_decode_warps")
                   for scenario in ("decode", "chunked")]
STABILITY_CASES.append(("chunked", "gqa"))


@pytest.mark.parametrize("scenario, kernel", STABILITY_CASES)
def test_stable_with_huge_score_gaps(rng, scenario, kernel):
    # Scores spread over +-1000s: the running max must rise and rescale, and exp(m_old - m_new) underflows to 0.
    scores = _check(rng, scenario, 4, 6, 2, 16, q_gain=300.0, kernel=kernel)
    assert max(np.abs(s).max() for s in scores) > 2 * LOG_F32_MAX, "scores too small to prove anything"


@pytest.mark.parametrize("score_offset", [600.0, -600.0])
@pytest.mark.parametrize("scenario, kernel", STABILITY_CASES)
def test_stable_when_every_naive_exp_overflows_or_underflows(rng, scenario, kernel, score_offset):
    # Every score is 600 +- O(1) (or -600 +- O(1)): exp(score) is inf (or 0, so 0/0) for all keys in float32,
    # yet the softmax weights are well mixed, so the result must still match the reference closely.
    scores = _check(rng, scenario, 16, 4, 2, 12, score_offset=score_offset, kernel=kernel)
    assert min(np.abs(s).min() for s in scores) > LOG_F32_MAX + np.log(64), "some naive exp would be finite"


# bf16 pools (uint16 bit patterns, kernels_numba.kv_dtype): write_kv_paged rounds K and V to nearest even (_write
# checks every bit), and each launcher computes the float32 pool's math on the rounded values: decoding a bf16 is
# exact, so with the reference run on the decoded pool the float32 path's bound (_tolerance) holds unchanged.
# Every launcher on the engine's path, plus the readable prefill, on decode and prefill steps.
BF16_POOL_CASES = [
    ("decode", "tiled", LAYOUTS[2]),  # paged_attention_decode: per_query
    ("chunked", "per_query", LAYOUTS[3]),
    ("decode", "decode_gqa", LAYOUTS[1]), ("shared_prefix", "decode_gqa", LAYOUTS[2]),
    ("decode", "flash_decode_warps", LAYOUTS[2]), ("chunked", "flash_decode_warps", LAYOUTS[1]),
    ("chunked", "gqa", LAYOUTS[2]),
    ("shared_prefix", "tiled", LAYOUTS[1])]  # paged_attention_prefill (readable)


@pytest.mark.parametrize("scenario, kernel, layout", BF16_POOL_CASES)
def test_bf16_pool_matches_ref_on_the_rounded_kv(rng, scenario, kernel, layout):
    _check(rng, scenario, *layout, kernel=kernel, kv_dtype=np.uint16)


@pytest.mark.parametrize("per_load, layout", [(1, 2), (4, 2), (4, 3), (2, 0)])
def test_bf16_pool_any_elements_per_load(rng, monkeypatch, per_load, layout):
    # decode_gqa reads a bf16 pool in words of KV_BF16_PER_LOAD elements (uint16, uint32, uint64),
    # unpacked into the float32 tile: head_dim 12 in words of 1 and 4 (3 words a row), 16 in 4 (the default, 2,
    # runs above); the tile's loads then do not divide evenly over the simulator's 4 threads.
    monkeypatch.setattr(decode_gqa_module, "KV_BF16_PER_LOAD", per_load)
    _check(rng, "decode", *LAYOUTS[layout], kernel="decode_gqa", kv_dtype=np.uint16)


def test_bf16_pool_stable_when_every_naive_exp_overflows(rng):
    scores = _check(rng, "chunked", 16, 4, 2, 12, score_offset=600.0, kernel="decode_gqa", kv_dtype=np.uint16)
    assert min(np.abs(s).min() for s in scores) > LOG_F32_MAX + np.log(64), "some naive exp would be finite"


# The decode kernels' cases (decode_gqa, flash_decode_warps; split_keys in tests/lessons/test_split_keys.py): decode on
# every layout (lengths 1 and 6 leave threads without keys); chunked and shared_prefix give several queries per
# sequence at different positions, in shuffled order.
DECODE_CASES = [("decode", LAYOUTS[0]), ("decode", LAYOUTS[1]), ("decode", LAYOUTS[2]), ("decode", LAYOUTS[3]),
                ("chunked", LAYOUTS[3]), ("shared_prefix", LAYOUTS[1])]


# paged_attention_decode_gqa: group ratios 1, 2, 3 and 3 (LAYOUTS), so a block serves 1 to 3 query heads (one
# head per score/output item for odd groups, two for even ones); in the simulator 4 threads per block and chunks of
# 8 keys.
@pytest.mark.parametrize("scenario, layout", DECODE_CASES)
def test_decode_gqa_kernel_matches_ref(rng, scenario, layout):
    _check(rng, scenario, *layout, kernel="decode_gqa")


@pytest.mark.parametrize("threads, key_chunk, layout", [(1, 8, 2), (7, 12, 2), (37, 32, 2), (5, 4, 1)])
def test_decode_gqa_any_thread_count_and_chunk(rng, monkeypatch, threads, key_chunk, layout):
    # 1 thread does everything; 7 threads: the (head, key) and (head, dim) items do not divide evenly; 37
    # threads: more than a chunk's items, some idle; 5 threads over group 2 (two heads per item) and chunks of
    # 4 keys, so most sequences cross many chunks.
    monkeypatch.setattr(decode_gqa_module, "GQA_DECODE_THREADS", threads)
    monkeypatch.setattr(decode_gqa_module, "GQA_DECODE_KEY_CHUNK", key_chunk)
    monkeypatch.setattr(decode_gqa_module, "GQA_DECODE_KEY_CHUNK_FEW_BLOCKS", key_chunk)
    _check(rng, "decode", *LAYOUTS[layout], kernel="decode_gqa")


# paged_attention_flash_decode_warps (its own tests: tests/test_decode_warps.py) on these steps: in the simulator
# 64-key partitions, so each context here is one partition, finished by its own block; with the block tables padded
# to 64 blocks (1,024 keys, 16 partitions), as a CUDA graph's are, the blocks past a context leave at once.
@pytest.mark.parametrize("scenario, layout", DECODE_CASES)
def test_flash_decode_warps_kernel_matches_ref(rng, scenario, layout):
    _check(rng, scenario, *layout, kernel="flash_decode_warps")
    _check(rng, scenario, *layout, kernel="flash_decode_warps", table_width=64)


def test_device_zeros_is_zeroed_once_then_replayed_as_left():
    # Outside an arena: a fresh zeroed array. In one: zeroed while recording, then handed back untouched on every
    # replay (no memset inside a graph; the kernels reset their counters).
    assert (device_zeros((2, 3), np.int32).copy_to_host() == 0).all()
    arena = BufferArena()
    with launching_into(0, arena):
        counters = device_zeros((2, 3), np.int32)
        assert (counters.copy_to_host() == 0).all()
        counters.copy_to_device(np.full((2, 3), 7, np.int32))
        arena.rewind()
        again = device_zeros((2, 3), np.int32)
    assert again is counters and (again.copy_to_host() == 7).all()


@pytest.mark.parametrize("width", [None, 1, 5])  # None: the default, QTILE
def test_prefill_tiles_cover_each_query_once_within_one_sequence(rng, width):
    query_seq = np.repeat(np.array([2, 0, 1], np.int32), [QTILE + 3, 1, 2 * QTILE])
    query_pos = np.concatenate([np.arange(5, 5 + QTILE + 3), [7], np.arange(2 * QTILE)]).astype(np.int32)
    order = rng.permutation(len(query_seq))
    query_seq, query_pos = query_seq[order], query_pos[order]
    d_seq, d_pos = cuda.to_device(query_seq), cuda.to_device(query_pos)
    tiles = build_prefill_tiles(d_seq, d_pos) if width is None else build_prefill_tiles(d_seq, d_pos, width)
    width = width or QTILE
    tokens, positions = tiles.tokens.copy_to_host(), tiles.positions.copy_to_host()
    seqs, key_len = tiles.seq.copy_to_host(), tiles.key_len.copy_to_host()
    assert tokens.shape == positions.shape == (tiles.num_tiles, width)
    # no tile mixes sequences: ceil(19/16) + 1 + 32/16 tiles of QTILE = 16
    assert tiles.num_tiles == cdiv(QTILE + 3, width) + 1 + cdiv(2 * QTILE, width)
    real = tokens >= 0
    assert sorted(tokens[real]) == list(range(len(query_seq)))
    assert ((positions >= 0) == real).all()
    for i in range(tiles.num_tiles):
        members = tokens[i][real[i]]
        assert (query_seq[members] == seqs[i]).all()
        assert (query_pos[members] == positions[i][real[i]]).all()
        assert (np.diff(positions[i][real[i]]) > 0).all()  # sorted by position
        assert key_len[i] == positions[i].max() + 1


def test_padded_prefill_tiles_put_the_empty_ones_first(rng):
    """A CUDA graph's fixed tile count: the padding leads, so heaviest-first kernels (the last tile first) start the
    real tiles before it; the real tiles are the unpadded ones, in the same order."""
    query_seq = np.repeat(np.array([1, 0], np.int32), [QTILE + 3, 5])
    query_pos = np.concatenate([np.arange(QTILE + 3), np.arange(40, 45)]).astype(np.int32)
    order = rng.permutation(len(query_seq))
    plain = prefill_tiles_host(query_seq[order], query_pos[order], QTILE)
    used = len(plain[0])
    padded = prefill_tiles_host(query_seq[order], query_pos[order], QTILE, used + 4)
    assert (padded[3][:4] == 0).all() and (padded[1][:4] == -1).all() and (padded[3][4:] > 0).all()
    for got, want in zip(padded, plain):
        np.testing.assert_array_equal(got[4:], want)


def test_rejects_head_dim_beyond_local_accumulator():
    q = cuda.to_device(np.ones((1, 1, 264), np.float32))
    pool = cuda.to_device(np.ones((1, 4, 1, 264), np.float32))
    table = cuda.to_device(np.zeros((1, 1), np.int32))
    ones = cuda.to_device(np.ones(1, np.int32))
    with pytest.raises(AssertionError):
        paged_attention_decode(q, pool, pool, table, ones, 1.0)
    with pytest.raises(AssertionError):
        paged_attention_prefill(q, pool, pool, table, ones, ones, 1.0)
    with pytest.raises(AssertionError):
        paged_attention_decode_gqa(q, pool, pool, table, ones, ones, 1.0)
    with pytest.raises(AssertionError):
        paged_attention_flash_decode_warps(q, pool, pool, table, ones, ones, 1.0)


# paged_attention_prefill_gqa. In the simulator its blocks are GQA_ROWS = 8 (query, head) rows (8 // group
# queries) on 2 x 2 threads, with GQA_KTILE = 8 keys per shared tile, so these prompts (up to 30 keys, 14 new
# queries per sequence) cross several query tiles and key tiles, partial ones included, and chunked /
# shared_prefix read earlier keys from the pool through shuffled block tables.
@pytest.mark.parametrize("scenario, layout", [
    ("whole_prompt", LAYOUTS[1]), ("whole_prompt", LAYOUTS[3]),
    ("chunked", LAYOUTS[0]), ("chunked", LAYOUTS[2]),
    ("shared_prefix", LAYOUTS[1]), ("decode", LAYOUTS[2])])
def test_prefill_gqa_matches_ref(rng, scenario, layout):
    _check(rng, scenario, *layout, kernel="gqa")


@pytest.mark.parametrize("rows, keys, row_threads, col_threads", [(2, 16, 1, 1), (16, 4, 4, 4)])
def test_prefill_gqa_other_tile_shapes(rng, monkeypatch, rows, keys, row_threads, col_threads):
    # head_dim 32, group 2. One-thread blocks with one query per tile and a 16-key tile; 16-thread blocks of
    # 8 queries whose 4-key tiles give each thread one key of the scores.
    for name, value in [("GQA_ROWS", rows), ("GQA_KTILE", keys), ("GQA_ROW_THREADS", row_threads),
                        ("GQA_COL_THREADS", col_threads)]:
        monkeypatch.setattr(prefill_gqa_module, name, value)
    _check(rng, "chunked", 4, 4, 2, 32, kernel="gqa")


def test_prefill_gqa_at_the_gpu_tile_shape(rng, monkeypatch):
    # The GPU's own sizes and index math, once (~3 s): 128-thread blocks of 16 queries x 4 heads (Llama-3.2-1B's
    # group and head_dim), 32-key tiles; 36 + 20 new queries make full and partial query tiles, 45 keys two key
    # tiles, the first 9 of them read from the pool.
    for name, value in [("GQA_ROWS", 64), ("GQA_KTILE", 32), ("GQA_ROW_THREADS", 16), ("GQA_COL_THREADS", 8)]:
        monkeypatch.setattr(prefill_gqa_module, name, value)
    assert gqa_shape(64, 4) == (16, 32, 16, 8)
    _check(rng, "long_chunk", 16, 4, 1, 64, kernel="gqa")


def test_prefill_gqa_gpu_shapes_fit_shared_memory(monkeypatch):
    # The GPU's sizes, checked on the host: Llama-3.2-1B gets the full 16 x 32 tile on 128 threads, and every
    # (head_dim, group) tried fits the static shared memory with sizes that divide the work evenly.
    for name, value in [("GQA_ROWS", 64), ("GQA_KTILE", 32), ("GQA_ROW_THREADS", 16), ("GQA_COL_THREADS", 8)]:
        monkeypatch.setattr(prefill_gqa_module, name, value)
    assert gqa_shape(64, 4) == (16, 32, 16, 8)
    assert gqa_shape(64, 1) == (64, 32, 16, 8) and gqa_shape(64, 8) == (8, 32, 16, 8)
    for head_dim in (32, 64, 80, 96, 128, 256):
        for group in (1, 2, 4, 8):
            queries, keys, row_threads, col_threads = gqa_shape(head_dim, group)
            assert _gqa_shared_bytes(head_dim, queries * group, keys) <= GQA_SHARED_BYTES
            assert (queries * group) % row_threads == 0 and keys % col_threads == 0 and head_dim % col_threads == 0
            assert keys * head_dim % (row_threads * col_threads) == 0


def test_prefill_gqa_rejects_tiles_of_another_width(rng):
    q = cuda.to_device(rng.standard_normal((3, 2, 16)).astype(np.float32))
    pool = cuda.to_device(rng.standard_normal((1, 4, 1, 16)).astype(np.float32))
    table = cuda.to_device(np.zeros((1, 1), np.int32))
    seq, pos = np.zeros(3, np.int32), np.arange(3, dtype=np.int32)
    tiles = build_prefill_tiles(seq, pos, gqa_shape(16, 2)[0] + 1)
    with pytest.raises(AssertionError, match="build_prefill_gqa_tiles"):
        paged_attention_prefill_gqa(q, pool, pool, table, cuda.to_device(seq), cuda.to_device(pos), 1.0, tiles=tiles)
