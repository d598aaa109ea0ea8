import numpy as np
import pytest

from kernels_numba.bf16 import bf16_to_f32_ref, f32_to_bf16_ref
from kernels_numba.common import cuda
from kernels_numba.matmul import (COALESCED_ROWS, MAX_GEMV_TOKENS, gemm, gemv, gemv_coalesced, linear,
                                  linear_ref)
from tests.helpers import poisoned

OUT_FEATURES = 45  # not a multiple of TILE (16), of a warp, nor of gemv_coalesced's rows per block
UNIT_ROUNDOFF = 2.0**-24


def _inputs(rng, num_tokens, in_features):
    x = rng.standard_normal((num_tokens, in_features)).astype(np.float32)
    w_bits = f32_to_bf16_ref(rng.standard_normal((OUT_FEATURES, in_features)).astype(np.float32))
    return x, w_bits


def _assert_close_to_ref(got, x, w_bits):
    """The classic dot-product error bound, so the tolerance holds for any summation order (and FMA).

    A float32 dot product of length K is within gamma_K * sum_k |x_k w_k| of the exact value
    (gamma_K = K u / (1 - K u), u = 2^-24; products of f32 and bf16 are exact in float64, so the float64
    reference is exact up to its own ~K 2^-53 error). The reference's final cast to float32 adds at most
    u |exact|. Two extra terms of gamma cover both. A wrong index or a missed tile is off by O(1).
    """
    want = linear_ref(x, w_bits)
    abs_dot = np.abs(x).astype(np.float64) @ np.abs(bf16_to_f32_ref(w_bits)).astype(np.float64).T
    terms = x.shape[1] + 2
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    assert not np.isnan(got).any(), "some outputs were never written"
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= gamma * abs_dot).all(), f"max err {err.max()}, bound {(gamma * abs_dot).min()}"


@pytest.mark.parametrize("num_tokens", [1, 3, MAX_GEMV_TOKENS])
@pytest.mark.parametrize("in_features", [67, 32])
def test_gemv_matches_ref(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemv(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


def test_gemv_rejects_too_many_tokens(rng):
    x, w_bits = _inputs(rng, MAX_GEMV_TOKENS + 1, 16)
    with pytest.raises(AssertionError):
        gemv(cuda.to_device(x), cuda.to_device(w_bits))


assert OUT_FEATURES % COALESCED_ROWS != 0


# In the simulator a block is 4 threads stepping 16 words (32 elements) of K at a time: 64 is whole steps,
# 66 and 130 end in a partial step (odd word counts, 33 and 65).
@pytest.mark.parametrize("num_tokens", [1, 3, MAX_GEMV_TOKENS])
@pytest.mark.parametrize("in_features", [64, 66, 130])
def test_gemv_coalesced_matches_ref(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    assert got is out
    _assert_close_to_ref(out.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("threads", [8, 32])  # 32: one full warp per block, as each warp runs on the GPU
def test_gemv_coalesced_other_block_sizes(rng, threads):
    x, w_bits = _inputs(rng, 3, 130)
    out = poisoned((3, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out, threads=threads)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


def test_gemv_coalesced_reads_a_row_slice_of_a_bigger_weight(rng):
    """Fused projections hand it row ranges of one weight: the uint32 view must start at the slice."""
    x, w_bits = _inputs(rng, 2, 66)
    stacked = np.concatenate([f32_to_bf16_ref(rng.standard_normal((5, 66)).astype(np.float32)), w_bits])
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(stacked)[5:], out=poisoned((2, OUT_FEATURES), np.float32))
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("num_tokens, in_features", [(MAX_GEMV_TOKENS + 1, 16), (2, 67)])
def test_gemv_coalesced_rejects_too_many_tokens_and_odd_in_features(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    with pytest.raises(AssertionError):
        gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits))


@pytest.mark.parametrize("num_tokens", [1, 3, 8, 13])
@pytest.mark.parametrize("in_features", [67, 32])  # a partial last K tile, and exact tiles
def test_gemm_matches_ref(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemm(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("num_tokens", [1, 8, 13, 17])  # 13 and 17 need chunks in the simulator
def test_linear_matches_ref_and_fills_given_out(rng, num_tokens):
    x, w_bits = _inputs(rng, num_tokens, 67)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = linear(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    assert got is out
    _assert_close_to_ref(out.copy_to_host(), x, w_bits)
