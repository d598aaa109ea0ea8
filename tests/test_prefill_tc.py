"""paged_attention_prefill_tc (FlashAttention-2 on tensor cores) against float64 attention on the same bf16-rounded
q * scale, K and V, over test_paged_attention's steps (shuffled block tables, poisoned pool entries nobody wrote)."""
import dataclasses
import functools

import ml_dtypes
import numpy as np
import pytest

from kernels_numba.attention import (PrefillTiles, gqa_shape, max_prefill_tiles, paged_attention_prefill_gqa,
                                     paged_attention_ref, prefill_tiles_host)
from kernels_numba.attention.prefill_tc import (TC_OPTIONS, build_prefill_tc_tiles,
                                                paged_attention_prefill_tc, tc_queries_per_tile, tc_shared_bytes)
from kernels_numba.attention.prefill_wgmma import paged_attention_prefill_wgmma
from kernels_numba.common import SIMULATOR, cuda
from kernels_numba.wgmma import wgmma_available
from tests.helpers import poisoned
from tests.test_paged_attention import LOG_F32_MAX, SeqSpec, _gather, _scenario, _step, _stretch, _write

# (block_size, n_heads, n_kv_heads, head_dim): groups 1, 2 and 4, head_dim 16 (one k step of Q K^T) and 32 (two);
# group 3 (SmolLM2's) does not divide a warp's 16 rows: 5 queries a tile and one padding row
TC_LAYOUTS = [(4, 2, 2, 16), (16, 4, 2, 16), (4, 8, 2, 32), (4, 6, 2, 16)]


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def _check_tc(rng, scenario, block_size, n_heads, n_kv_heads, head_dim, warps=1, keys_per_tile=16, q_gain=1.0,
              score_offset=0.0, kv_dtype=np.float32, options=None, wgmma=False, stages=None):
    """Run the step through prefill_tc (in the simulator: 1-warp blocks of 16 / group queries, 16-key tiles, so the
    scenarios' up-to-33-key contexts cross 3 key tiles and their queries several query tiles). Bound: P enters the
    second mma as bf16 (2^-9 relative) while l sums float32 P: 2^-8 of W = sum_j p_j |v_j| / sum_j p_j, plus the
    float32 sums; 2^-7 W checked. The scores' own float32 error E (head_dim products of bf16, 2^-23 each of
    sum |q k|) moves the weights by at most a factor exp(2E), as in test_paged_attention's _tolerance.
    kv_dtype np.uint16: bf16 pools (the same bound: the kernel rounds a float32 pool's K/V to exactly those bits).
    With TcOptions.exp2 the kernel rounds q * scale * log2(e) to bf16 and exponentiates base 2: the reference is
    softmax(ln 2 * q_r . k) on that q_r, and ex2.approx's 2^-22 relative error on each weight (the same weight in
    P's numerator and in l) is far inside the 2^-9 of P's bf16 rounding: the same bound.
    scenario: a test_paged_attention scenario's name, or its list of SeqSpec. wgmma: run prefill_wgmma instead, in
    blocks of warps / 4 warpgroups, `stages` K/V stages (prefill_tc's arithmetic: the same bound). Returns (scores, the output's bits)."""
    specs = _scenario(scenario, block_size) if isinstance(scenario, str) else scenario
    step = _step(rng, specs, block_size, n_heads, n_kv_heads, head_dim)
    scale = 1.0 / np.sqrt(head_dim)
    _stretch(step, scale, q_gain, score_offset)
    d_k_pool, d_v_pool, k_pool, v_pool = _write(step, kv_dtype)
    d_seq, d_pos = cuda.to_device(step.query_seq), cuda.to_device(step.query_pos)
    tiles = build_prefill_tc_tiles(d_seq, d_pos, n_heads // n_kv_heads, warps) if scenario != "whole_prompt" else None
    out = poisoned(step.q.shape, np.float32)
    if wgmma:
        assert options is None and warps % 4 == 0, (options, warps)
        launch = functools.partial(paged_attention_prefill_wgmma, warpgroups=warps // 4, stages=stages)
    else:
        launch = functools.partial(paged_attention_prefill_tc, warps=warps, options=options)
    got = launch(cuda.to_device(step.q), d_k_pool, d_v_pool, cuda.to_device(step.block_tables), d_seq, d_pos, scale,
                 out=out, tiles=tiles, keys_per_tile=keys_per_tile)
    assert got is out
    got = got.copy_to_host()
    assert np.isfinite(got).all(), "the kernel left an output unwritten, read a poisoned entry or overflowed"
    options = TC_OPTIONS if options is None else options
    score_unit = np.log(2.0) if options.exp2 else 1.0  # q_r . k in natural-log units
    q_r = _bf16(step.q * np.float32(scale / score_unit))  # what the kernel feeds the mma: the float32 product, rounded
    k_r, v_r = _bf16(k_pool), _bf16(v_pool)
    args = (step.block_tables, step.query_seq, step.query_pos, score_unit)
    want = paged_attention_ref(q_r, k_r, v_r, *args)
    weight = paged_attention_ref(q_r, k_r, np.abs(v_r), *args).astype(np.float64)
    group = n_heads // n_kv_heads
    score_err = np.empty((len(step.q), n_heads, 1))
    scores = []
    for t, (s, p) in enumerate(zip(step.query_seq, step.query_pos)):
        keys = _gather(k_r, step.block_tables, s, p + 1).astype(np.float64)
        for h in range(n_heads):
            score_err[t, h] = score_unit * head_dim * 2.0**-23 * (np.abs(keys[:, h // group]) @ np.abs(q_r[t, h])).max()
            scores.append(score_unit * keys[:, h // group] @ q_r[t, h])
    tol = (2.0**-7 + np.expm1(2 * score_err)) * weight + 1e-6
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= tol).all(), f"max err {err.max()}, worst err/tol {(err / tol).max()}"
    return scores, got.view(np.uint32)


NEEDS_WGMMA = pytest.mark.skipif(not SIMULATOR and not wgmma_available(), reason="wgmma needs a Hopper GPU")
KV_DTYPES = pytest.mark.parametrize("kv_dtype", [np.float32, np.uint16], ids=["f32_pool", "bf16_pool"])


@KV_DTYPES
@pytest.mark.parametrize("scenario, layout", [
    ("whole_prompt", TC_LAYOUTS[0]), ("chunked", TC_LAYOUTS[1]), ("shared_prefix", TC_LAYOUTS[2]),
    ("decode", TC_LAYOUTS[1]), ("chunked", TC_LAYOUTS[3])])
def test_prefill_tc_matches_ref(rng, scenario, layout, kv_dtype):
    _check_tc(rng, scenario, *layout, kv_dtype=kv_dtype)


# Many key tiles through the two-stage pipeline (16-key tiles): a 40-token chunk after a 30-token cached prefix (5
# tiles), a 13-token chunk after sequence 0's first 3 blocks (a shared cached prefix, 3 tiles), a 35-token prompt
# (3 tiles, the last partial); GQA group 3 in 2-warp blocks (10 queries and 2 padding rows a block), so a warp
# that ran ahead into a stage another warp has not finished copying or reading would be seen.
PIPELINE_SPECS = [SeqSpec(70, 30), SeqSpec(12 + 13, 12, 0, 3), SeqSpec(35, 0)]


@KV_DTYPES
def test_prefill_tc_pipeline_over_many_key_tiles(rng, kv_dtype):
    assert tc_shared_bytes(16, 2, 16) == 2 * 4 * 16 * 24  # two stages of K and V; Q over the second
    _check_tc(rng, PIPELINE_SPECS, 4, 6, 2, 16, warps=2, kv_dtype=kv_dtype)


@pytest.mark.parametrize("options", [dataclasses.replace(TC_OPTIONS, max_registers=128)],
                         ids=["max_registers_128"])
def test_prefill_tc_other_options_still_match(rng, options):
    # the register cap the timing script tries (on the GPU: the kernel compiled under it; in the simulator there is
    # no cap), within the same bound; ORIGINAL_OPTIONS: tests/lessons/test_prefill_tc_original.py
    assert options != TC_OPTIONS
    _check_tc(rng, PIPELINE_SPECS[:1], 4, 6, 2, 16, warps=2, kv_dtype=np.uint16, options=options)


def test_prefill_tc_copies_rows_of_any_width_from_blocks_of_any_size(rng):
    # A bf16 pool's copies keep each thread's rows and column across key tiles: head_dim 48 is 6 16-byte chunks a
    # row, which do not divide a warp's 32 threads (30 copy 5 rows a round, 2 copy nothing; 4 rounds reach past the
    # tile's 16 rows), and blocks of 6 keys are not a power of two (the lookup divides instead of shifting).
    _check_tc(rng, "chunked", 6, 4, 2, 48, kv_dtype=np.uint16)


def test_prefill_tc_at_the_gpu_shape(rng):
    # The GPU's block once: 4 warps of 16 rows (16 queries x Llama-3.2-1B's group of 4 heads, head_dim 64), 64-key
    # tiles; 36 + 20 new queries give full and partial query tiles, 45 keys a partial key tile read from the pool.
    _check_tc(rng, "long_chunk", 16, 4, 1, 64, warps=4, keys_per_tile=64)


@pytest.mark.parametrize("q_gain, score_offset", [(300.0, 0.0), (1.0, 600.0)])
def test_prefill_tc_stable_with_huge_scores(rng, q_gain, score_offset):
    # Score gaps of +-1000s (the running max rises, exp(m_old - m_new) underflows), and every score 600 +- O(1)
    # (a naive exp overflows for every key).
    scores, _ = _check_tc(rng, "chunked", 4, 4, 2, 16, q_gain=q_gain, score_offset=score_offset)
    assert max(np.abs(s).max() for s in scores) > LOG_F32_MAX, "scores too small to prove anything"


@pytest.mark.parametrize("scenario, layout", [("whole_prompt", TC_LAYOUTS[0])])  # 3 prompts, partial key tiles
def test_prefill_tc_bf16_pool_is_the_float32_pools_result_bit_for_bit(scenario, layout):
    # A bf16 pool's rows are copied into shared memory 16 bytes at a time (cp.async); a float32 pool's are rounded to
    # bf16 one element at a time: the same K/V (one seed for both steps) give the same tiles, so the same output
    # bits; and both are within the bound of the reference on the rounded K/V.
    results = [_check_tc(np.random.default_rng(15), scenario, *layout, kv_dtype=kv_dtype)[1]
               for kv_dtype in (np.float32, np.uint16)]
    np.testing.assert_array_equal(results[1], results[0])


def test_prefill_tc_rejects_unfit_shapes(rng):
    q = cuda.to_device(np.ones((1, 3, 24), np.float32))
    pool = cuda.to_device(np.ones((1, 4, 1, 24), np.float32))
    table = cuda.to_device(np.zeros((1, 1), np.int32))
    ones = cuda.to_device(np.ones(1, np.int32))
    with pytest.raises(AssertionError, match="multiple of 16"):
        paged_attention_prefill_tc(q, pool, pool, table, ones, ones, 1.0)
    q = cuda.to_device(np.ones((1, 17, 16), np.float32))
    pool = cuda.to_device(np.ones((1, 4, 1, 16), np.float32))
    with pytest.raises(AssertionError, match="does not fit"):
        paged_attention_prefill_tc(q, pool, pool, table, ones, ones, 1.0, warps=1)


@pytest.mark.parametrize("kernel", ["tc", "gqa", pytest.param("wgmma", marks=NEEDS_WGMMA)])
def test_prefill_kernels_skip_empty_tiles_and_rows_in_no_tile(rng, kernel):
    # A prefill CUDA graph launches a fixed grid: the step's tiles padded with empty ones (no tokens, key_len 0), in
    # any order, and its padding rows (past the step's tokens) in no tile. The real rows get exactly the unpadded
    # launch's output bits (checked against the reference by the tests above); the padding rows stay poisoned.
    # (prefill_wgmma: one warpgroup, head_dim 64 and a bf16 pool, which it needs; its blocks take the tiles from the
    # last, so empty tiles come first too)
    block_size, n_heads, n_kv_heads, head_dim = TC_LAYOUTS[1][:3] + (64 if kernel == "wgmma" else TC_LAYOUTS[1][3],)
    group = n_heads // n_kv_heads
    step = _step(rng, _scenario("chunked", block_size), block_size, n_heads, n_kv_heads, head_dim)
    d_k_pool, d_v_pool, _, _ = _write(step, np.uint16 if kernel == "wgmma" else np.float32)
    num_tokens, extra = len(step.q), 3
    queries = {"tc": tc_queries_per_tile(group, 1), "wgmma": tc_queries_per_tile(group, 4),
               "gqa": gqa_shape(head_dim, group)[0]}[kernel]
    launch = {"tc": functools.partial(paged_attention_prefill_tc, warps=1, keys_per_tile=16),
              "wgmma": functools.partial(paged_attention_prefill_wgmma, warpgroups=1, keys_per_tile=16),
              "gqa": paged_attention_prefill_gqa}[kernel]
    scale = 1.0 / np.sqrt(head_dim)
    tables = cuda.to_device(step.block_tables)

    def run(q, query_seq, query_pos, tiles):
        out = poisoned(q.shape, np.float32)
        launch(cuda.to_device(q), d_k_pool, d_v_pool, tables, cuda.to_device(query_seq), cuda.to_device(query_pos),
               scale, out=out, tiles=tiles)
        return out.copy_to_host()

    seq, tokens, positions, key_len = prefill_tiles_host(step.query_seq, step.query_pos, queries)
    plain = run(step.q, step.query_seq, step.query_pos,
                PrefillTiles(*map(cuda.to_device, (seq, tokens, positions, key_len)), len(seq)))
    num_tiles = max_prefill_tiles(num_tokens + extra, 8, queries)  # sized for up to 8 sequences
    padded = prefill_tiles_host(step.query_seq, step.query_pos, queries, num_tiles)
    assert num_tiles - len(seq) >= 3, "too few empty tiles to show anything"
    order = rng.permutation(num_tiles)  # empty tiles between and before the real ones
    padded = [a[order] for a in padded]
    q = np.concatenate([step.q, rng.standard_normal((extra, n_heads, head_dim)).astype(np.float32)])
    query_seq = np.concatenate([step.query_seq, np.zeros(extra, np.int32)])
    query_pos = np.concatenate([step.query_pos, np.zeros(extra, np.int32)])
    got = run(q, query_seq, query_pos, PrefillTiles(*map(cuda.to_device, padded), num_tiles))
    assert np.isfinite(plain).all()
    np.testing.assert_array_equal(got[:num_tokens].view(np.uint32), plain.view(np.uint32))
    assert np.isnan(got[num_tokens:]).all(), "a kernel wrote a row that is in no tile"
