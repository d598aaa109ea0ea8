"""SmolLM2-135M's shapes through every kernel family, in the simulator (and on a GPU with TINYVLLM_TEST_GPU=1).

SmolLM2 is unlike Llama-3.2-1B where launchers could hide assumptions: hidden 576 (not a power of two nor a
multiple of 128 or 256), 9 query heads over 3 KV heads (groups of 3), head_dim 64, intermediate 1536. The
kernel tests' own checks run here on those sizes (the output rows of plain projections cut to a few, as the
in_features and head layout are what the launch layouts depend on); then a one-layer model of SmolLM2's
width runs through the engine against HF transformers stage by stage.
"""
import numpy as np
import pytest

from kernels_numba.attention import paged_attention_flash_decode_warps
import tests.test_matmul as matmul_tests
import tests.test_paged_attention as attention_tests
import tests.test_rmsnorm as rmsnorm_tests
import tests.test_rope as rope_tests

pytestmark = pytest.mark.slow  # big simulator kernels: SmolLM2-135M's shapes, and a layer against HF

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 576, 9, 3, 64, 1536


@pytest.mark.parametrize("in_features", [HIDDEN, INTERMEDIATE])
def test_projections(rng, in_features):
    matmul_tests.test_gemv_matches_ref(rng, 1, in_features)           # the simulator's GEMV
    matmul_tests.test_gemv_coalesced_matches_ref(rng, 1, in_features)  # the GPU's decode GEMV


def test_gemm_blocked_and_fused_norm_gemv(rng):
    matmul_tests.test_gemm_matches_ref(rng, 3, HIDDEN)
    matmul_tests.test_gemm_blocked_matches_ref(rng, 9, HIDDEN, 45)     # the GPU's prefill GEMM
    matmul_tests.test_gemv_fused_rmsnorm_matches_rmsnorm_then_linear(rng, 1, HIDDEN)


def test_fused_qkv_rope_gemv(rng):
    """q|k|v = 960 rows of 576, RoPE on 9 + 3 heads of 64 and the K/V write: the decode layer's first launch."""
    matmul_tests.test_gemv_fused_rmsnorm_rope_matches_norm_linear_rope_and_the_pool_writes(rng, 1, HEADS, KV_HEADS,
                                                                                     HEAD_DIM, HIDDEN, np.float32)


def test_norms_and_rope(rng):
    rmsnorm_tests.test_rmsnorm_matches_ref(rng, HIDDEN, None)
    rmsnorm_tests.test_add_rmsnorm_matches_ref_and_unfused_bit_for_bit(rng, 2, HIDDEN, None)
    rope_tests.test_rope_qkv_matches_ref_and_unfused_rope_bit_for_bit(rng, HEADS, KV_HEADS, HEAD_DIM)


@pytest.mark.parametrize("scenario, kernel", [("decode", "per_query"), ("decode", "tiled"),
                                              ("decode", "decode_gqa"),
                                              ("decode", paged_attention_flash_decode_warps),
                                              ("chunked", "tiled"), ("chunked", "gqa")])
def test_attention(rng, scenario, kernel):
    attention_tests._check(rng, scenario, 16, HEADS, KV_HEADS, HEAD_DIM, kernel=kernel)
