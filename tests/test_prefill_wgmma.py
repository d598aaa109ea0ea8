"""paged_attention_prefill_wgmma against float64 attention (test_prefill_tc's bound: prefill_tc's arithmetic) and
against prefill_tc's own bits, over test_paged_attention's steps (shuffled block tables, poisoned pool entries
nobody wrote). In the simulator one warpgroup a block and 16-key tiles (128 simulated threads); on the GPU
(TINYVLLM_TEST_GPU=1, a Hopper device) also the engine's block, two warpgroups and 64-key tiles."""
import functools

import numpy as np
import pytest

from kernels_numba.attention import PrefillTiles, max_prefill_tiles, prefill_tiles_host
from kernels_numba.attention.prefill_tc import tc_queries_per_tile
from kernels_numba.attention.prefill_wgmma import paged_attention_prefill_wgmma, shared_bytes
from kernels_numba.common import SIMULATOR, cuda
from kernels_numba.wgmma import wgmma_available
from tests.helpers import poisoned
from tests.test_paged_attention import LOG_F32_MAX, _scenario, _step, _write
from tests.test_prefill_tc import PIPELINE_SPECS, _check_tc

pytestmark = pytest.mark.skipif(not SIMULATOR and not wgmma_available(), reason="wgmma needs a Hopper GPU")

# (block_size, n_heads, n_kv_heads, head_dim): groups 1, 2, 4 and 3 (SmolLM2's: 21 queries and a padding row a
# 64-row warpgroup), head_dim 64 (one 128-byte row) and 128 (two slices: V's second 64 columns through the LBO)
LAYOUTS = [(4, 2, 2, 64), (16, 4, 2, 64), (16, 4, 1, 64), (4, 6, 2, 64), (4, 4, 2, 128)]
SHAPES = [(4, 16)] if SIMULATOR else [(4, 16), (8, 64)]  # (warps, keys per tile); 8 x 64 the engine's
SLOW_IN_SIMULATOR = pytest.mark.slow if SIMULATOR else pytest.mark.skipif(False, reason="")  # 128 threads a block


@pytest.mark.parametrize("warps, keys", SHAPES)
@pytest.mark.parametrize("scenario, layout", [
    ("whole_prompt", LAYOUTS[0]), ("chunked", LAYOUTS[1]), ("long_chunk", LAYOUTS[2]), ("chunked", LAYOUTS[3]),
    pytest.param("shared_prefix", LAYOUTS[4], marks=SLOW_IN_SIMULATOR),
    pytest.param("decode", LAYOUTS[1], marks=SLOW_IN_SIMULATOR)])
def test_prefill_wgmma_matches_ref_with_prefill_tc_bits(rng, scenario, layout, warps, keys):
    # Same arithmetic in the same order: the same bits as prefill_tc at the same block and key tile
    seed = int(rng.integers(1 << 30))
    _, bits = _check_tc(np.random.default_rng(seed), scenario, *layout, warps=warps, keys_per_tile=keys,
                        kv_dtype=np.uint16, wgmma=True)
    _, tc_bits = _check_tc(np.random.default_rng(seed), scenario, *layout, warps=warps, keys_per_tile=keys,
                           kv_dtype=np.uint16)
    np.testing.assert_array_equal(bits, tc_bits)


def test_prefill_wgmma_pipeline_over_many_key_tiles(rng):
    # 16-key tiles: 5 tiles after a cached prefix, a shared prefix, a partial last tile; group 3's padding rows
    _check_tc(rng, PIPELINE_SPECS, 4, 6, 2, 64, warps=4, keys_per_tile=16, kv_dtype=np.uint16, wgmma=True)


@SLOW_IN_SIMULATOR
@pytest.mark.parametrize("q_gain, score_offset", [(300.0, 0.0), (1.0, 600.0)])
def test_prefill_wgmma_stable_with_huge_scores(rng, q_gain, score_offset):
    scores, _ = _check_tc(rng, "chunked", 4, 4, 2, 64, warps=4, keys_per_tile=16, q_gain=q_gain,
                          score_offset=score_offset, kv_dtype=np.uint16, wgmma=True)
    assert max(np.abs(s).max() for s in scores) > LOG_F32_MAX, "scores too small to prove anything"


def test_prefill_wgmma_skips_empty_tiles_and_rows_in_no_tile(rng):
    # A prefill CUDA graph's fixed grid: empty tiles anywhere (blocks run the tiles from the last), padding rows in
    # no tile; the real rows keep the unpadded launch's bits, the padding rows stay poisoned.
    block_size, n_heads, n_kv_heads, head_dim = LAYOUTS[1]
    step = _step(rng, _scenario("chunked", block_size), block_size, n_heads, n_kv_heads, head_dim)
    d_k_pool, d_v_pool, _, _ = _write(step, np.uint16)
    queries = tc_queries_per_tile(n_heads // n_kv_heads, 4)
    launch = functools.partial(paged_attention_prefill_wgmma, warpgroups=1, keys_per_tile=16)
    tables = cuda.to_device(step.block_tables)
    scale = 1.0 / np.sqrt(head_dim)

    def run(q, query_seq, query_pos, tiles):
        out = poisoned(q.shape, np.float32)
        launch(cuda.to_device(q), d_k_pool, d_v_pool, tables, cuda.to_device(query_seq), cuda.to_device(query_pos),
               scale, out=out, tiles=tiles)
        return out.copy_to_host()

    num_tokens, extra = len(step.q), 3
    host = prefill_tiles_host(step.query_seq, step.query_pos, queries)
    plain = run(step.q, step.query_seq, step.query_pos, PrefillTiles(*map(cuda.to_device, host), len(host[0])))
    num_tiles = max_prefill_tiles(num_tokens + extra, 8, queries)
    order = rng.permutation(num_tiles)
    padded = [a[order] for a in prefill_tiles_host(step.query_seq, step.query_pos, queries, num_tiles)]
    q = np.concatenate([step.q, rng.standard_normal((extra, n_heads, head_dim)).astype(np.float32)])
    query_seq = np.concatenate([step.query_seq, np.zeros(extra, np.int32)])
    query_pos = np.concatenate([step.query_pos, np.zeros(extra, np.int32)])
    got = run(q, query_seq, query_pos, PrefillTiles(*map(cuda.to_device, padded), num_tiles))
    assert np.isfinite(plain).all()
    np.testing.assert_array_equal(got[:num_tokens].view(np.uint32), plain.view(np.uint32))
    assert np.isnan(got[num_tokens:]).all(), "the kernel wrote a row that is in no tile"


def test_prefill_wgmma_rejects_what_it_cannot_take():
    table = cuda.to_device(np.zeros((1, 1), np.int32))
    ones = cuda.to_device(np.ones(1, np.int32))
    q = cuda.to_device(np.ones((1, 4, 64), np.float32))
    f32_pool = cuda.to_device(np.ones((1, 4, 2, 64), np.float32))
    with pytest.raises(AssertionError, match="bf16 pools"):
        paged_attention_prefill_wgmma(q, f32_pool, f32_pool, table, ones, ones, 1.0)
    q = cuda.to_device(np.ones((1, 4, 48), np.float32))
    pool = cuda.to_device(np.ones((1, 4, 2, 48), np.uint16))
    with pytest.raises(AssertionError, match="head_dim a multiple of 64"):
        paged_attention_prefill_wgmma(q, pool, pool, table, ones, ones, 1.0)


def test_shared_memory_of_the_engine_block():
    # Q's 128 rows, K and V of two 64-key stages, 128 bytes a row at head_dim 64; + 1 KB to align
    assert shared_bytes(64, 2, 64) == (128 + 4 * 64) * 128 + 1024
