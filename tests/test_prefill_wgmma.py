"""paged_attention_prefill_wgmma against float64 attention (test_prefill_tc's bound: prefill_tc's arithmetic) and
against prefill_tc's own bits, over test_paged_attention's steps (shuffled block tables, poisoned pool entries
nobody wrote); empty tiles and padding rows: test_prefill_tc. In the simulator one warpgroup a block and 16-key tiles (128 simulated threads); on the GPU
(TINYVLLM_TEST_GPU=1, a Hopper device) also the engine's block, two warpgroups and 64-key tiles."""
import numpy as np
import pytest

from kernels_numba.attention.prefill_tc import tc_key_tile
from kernels_numba.attention.prefill_wgmma import paged_attention_prefill_wgmma, shared_bytes
from kernels_numba.common import SIMULATOR, cuda
from kernels_numba.wgmma import wgmma_available
from tests.test_paged_attention import LOG_F32_MAX
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
    # Same arithmetic in the same order: the same bits as prefill_tc at the same key tile (prefill_tc narrows its
    # tile where its static shared memory cannot hold it: head_dim 128 at 8 warps)
    seed = int(rng.integers(1 << 30))
    _, bits = _check_tc(np.random.default_rng(seed), scenario, *layout, warps=warps, keys_per_tile=keys,
                        kv_dtype=np.uint16, wgmma=True)
    if tc_key_tile(layout[3], warps, keys) != keys:
        return
    _, tc_bits = _check_tc(np.random.default_rng(seed), scenario, *layout, warps=warps, keys_per_tile=keys,
                           kv_dtype=np.uint16)
    np.testing.assert_array_equal(bits, tc_bits)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_prefill_wgmma_pipeline_over_many_key_tiles(rng, stages):
    # 16-key tiles: 5 tiles after a cached prefix, a shared prefix, a partial last tile; group 3's padding rows;
    # copies 1 to 3 tiles ahead, more than some sequences have
    _check_tc(rng, PIPELINE_SPECS, 4, 6, 2, 64, warps=4, keys_per_tile=16, kv_dtype=np.uint16, wgmma=True,
              stages=stages)


@SLOW_IN_SIMULATOR
@pytest.mark.parametrize("q_gain, score_offset", [(300.0, 0.0), (1.0, 600.0)])
def test_prefill_wgmma_stable_with_huge_scores(rng, q_gain, score_offset):
    scores, _ = _check_tc(rng, "chunked", 4, 4, 2, 64, warps=4, keys_per_tile=16, q_gain=q_gain,
                          score_offset=score_offset, kv_dtype=np.uint16, wgmma=True)
    assert max(np.abs(s).max() for s in scores) > LOG_F32_MAX, "scores too small to prove anything"


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
    assert shared_bytes(64, 2, 64, 2) == (128 + 4 * 64) * 128 + 1024
