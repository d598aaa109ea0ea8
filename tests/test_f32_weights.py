"""Float32 weights (an F32 or F16 checkpoint) through every weight-reading kernel, against the numpy twins.

The weights here are float32 values no bf16 can hold (random, so their low 16 bits are set): a kernel that read
them as bf16, or rounded them, would be off by ~2^-9 relatively, hundreds of times the float32 bounds below.
"""
import numpy as np
import pytest

from kernels_numba.activation import silu_mul_ref, silu_ref
from kernels_numba.common import cuda
from kernels_numba.embedding import embedding, embedding_ref
from kernels_numba.epilogues import ResidualEpilogue, RMSNormPrologue, RopeKVEpilogue, SwiGLUEpilogue
from kernels_numba.matmul import (COALESCED_PASS_TOKENS, gemm, gemm_blocked, gemv, gemv_coalesced, gemv_fused, linear,
                                  linear_ref)
from kernels_numba.attention import write_kv_paged_ref
from kernels_numba.rmsnorm import add_rmsnorm, add_rmsnorm_ref, rmsnorm, rmsnorm_ref
from kernels_numba.rope import rope_inv_freq, rope_qkv_ref
from kernels_numba.weight_dtype import weight_to_f32, weights_ref
from tests.helpers import poisoned

UNIT_ROUNDOFF = 2.0**-24
EPS = 1e-5
OUT_FEATURES = 13  # not a multiple of any block's rows


def f32_weights(rng, shape, center=0.0):
    w = (center + rng.standard_normal(shape)).astype(np.float32)
    assert (w.view(np.uint32) & 0xFFFF).all(), "every value must be beyond bf16"
    return w


def dot_bound(x, w, terms=None):
    """gamma_K * sum_k |x_k w_k| (see test_matmul._assert_close_to_ref: f32 x f32 products are exact in float64)."""
    terms = (x.shape[1] if terms is None else terms) + 2
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    return gamma * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T)


def assert_linear_close(got, x, w, factor=1.0, terms=None):
    assert not np.isnan(got).any(), "some outputs were never written"
    err = np.abs(got.astype(np.float64) - linear_ref(x, w))
    bound = factor * dot_bound(x, w, terms)
    assert (err <= bound).all(), f"max err {err.max()}, bound there {bound.flat[err.argmax()]}"


def test_the_numpy_twins_read_float32_weights_as_they_are(rng):
    w = f32_weights(rng, (3, 5))
    assert weights_ref(w) is not w and np.array_equal(weights_ref(w), w)
    assert weight_to_f32(w[1, 2]) == w[1, 2] and weight_to_f32(np.uint16(0x3F80)) == 1.0
    with pytest.raises(AssertionError, match="uint16 bf16 bit patterns or float32"):
        weights_ref(w.astype(np.float16))


def test_embedding_gathers_float32_rows_exactly(rng):
    table = f32_weights(rng, (37, 10))
    ids = np.array([3, 0, 36, 3, 17], dtype=np.int32)
    got = embedding(cuda.to_device(ids), cuda.to_device(table), out=poisoned((5, 10), np.float32)).copy_to_host()
    np.testing.assert_array_equal(got, table[ids])
    np.testing.assert_array_equal(embedding_ref(ids, table), table[ids])


def test_rmsnorm_and_add_rmsnorm_with_float32_gains(rng):
    hidden = 67
    x = (3 * rng.standard_normal((3, hidden))).astype(np.float32)
    residual = rng.standard_normal((3, hidden)).astype(np.float32)
    gains = f32_weights(rng, hidden, center=1.0)
    want = gains.astype(np.float64) * x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + EPS)
    got = rmsnorm(cuda.to_device(x), cuda.to_device(gains), EPS, out=poisoned(x.shape, np.float32)).copy_to_host()
    # as test_rmsnorm: only the shared row scale's few ulp differ (1e-5 is ~80 ulp)
    np.testing.assert_allclose(got, rmsnorm_ref(x, gains, EPS), rtol=1e-5, atol=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)  # the float64 formula with the exact gains
    h, y = add_rmsnorm(cuda.to_device(x), cuda.to_device(residual), cuda.to_device(gains), EPS)
    want_h, want_y = add_rmsnorm_ref(x, residual, gains, EPS)
    np.testing.assert_array_equal(h.copy_to_host(), want_h)
    np.testing.assert_allclose(y.copy_to_host(), want_y, rtol=1e-5, atol=0)


@pytest.mark.parametrize("kernel, num_tokens, in_features", [
    (gemv, 3, 67), (gemm, 5, 33), (gemm_blocked, 17, 40), (linear, 2, 67),
    (gemv_coalesced, 1, 66),                               # two float32 per 8-byte word
    (gemv_coalesced, 2 * COALESCED_PASS_TOKENS + 3, 67)])  # one per 4-byte word (odd K), tokens in passes
def test_every_linear_kernel_reads_float32_weights(rng, kernel, num_tokens, in_features):
    x = rng.standard_normal((num_tokens, in_features)).astype(np.float32)
    w = f32_weights(rng, (OUT_FEATURES, in_features))
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = kernel(cuda.to_device(x), cuda.to_device(w), out=out)
    assert got is out
    assert_linear_close(got.copy_to_host(), x, w)


@pytest.mark.parametrize("num_tokens, in_features", [(1, 64), (3, 66), (2, 67)])
def test_gemv_fused_rmsnorm_and_residual_with_float32_weights(rng, num_tokens, in_features):
    """The bounds of test_matmul's gemv_fused RMSNorm and residual tests, with float32 gains and weights."""
    h = (3 * rng.standard_normal((num_tokens, in_features))).astype(np.float32)
    gains = f32_weights(rng, in_features, center=1.0)
    w = f32_weights(rng, (OUT_FEATURES, in_features))
    fused = gemv_fused(cuda.to_device(h), cuda.to_device(w), RMSNormPrologue(cuda.to_device(gains), EPS),
                       out=poisoned((num_tokens, OUT_FEATURES), np.float32))
    got, normed = fused.out, fused.normed
    x = rmsnorm_ref(h, gains, EPS)
    assert_linear_close(got.copy_to_host(), x, w, factor=2, terms=in_features + 4)
    gamma = (in_features + 4) * UNIT_ROUNDOFF / (1 - (in_features + 4) * UNIT_ROUNDOFF)
    assert (np.abs(normed.copy_to_host() - x) <= (gamma + 4 * UNIT_ROUNDOFF) * np.abs(x)).all()
    residual = rng.standard_normal((num_tokens, OUT_FEATURES)).astype(np.float32)
    fused = gemv_fused(cuda.to_device(x), cuda.to_device(w), epilogue=ResidualEpilogue(cuda.to_device(residual)))
    out, summed = fused.out, fused.residual_out
    out = out.copy_to_host()
    assert_linear_close(out, x, w)
    np.testing.assert_array_equal(summed.copy_to_host(), out + residual)


def test_gemv_fused_rmsnorm_swiglu_with_float32_weights(rng):
    """test_matmul's SwiGLU bound: each dot within e, silu's slope below 1.1, 8 u for silu and the product."""
    num_tokens, in_features, intermediate = 2, 64, 7
    h = (3 * rng.standard_normal((num_tokens, in_features))).astype(np.float32)
    gains = f32_weights(rng, in_features, center=1.0)
    w = f32_weights(rng, (2 * intermediate, in_features))
    got = gemv_fused(cuda.to_device(h), cuda.to_device(w), RMSNormPrologue(cuda.to_device(gains), EPS),
                     SwiGLUEpilogue(), out=poisoned((num_tokens, intermediate), np.float32)).out.copy_to_host()
    x = rmsnorm_ref(h, gains, EPS)
    gate, up = linear_ref(x, w[:intermediate]), linear_ref(x, w[intermediate:])
    e_gate = 2 * dot_bound(x, w[:intermediate], in_features + 4)
    e_up = 2 * dot_bound(x, w[intermediate:], in_features + 4)
    want = silu_mul_ref(gate, up).astype(np.float64)
    bound = (1.1 * e_gate * (np.abs(up) + e_up) + np.abs(silu_ref(gate)).astype(np.float64) * e_up
             + 8 * UNIT_ROUNDOFF * np.abs(want))
    assert (np.abs(got - want) <= bound).all(), f"max err {np.abs(got - want).max()}"


def test_gemv_fused_rmsnorm_rope_with_float32_weights(rng):
    """test_matmul's bound for the norm + q|k|v + RoPE + K/V write launch: a rotated value within e1 + e2 plus
    rope's own 1e-5; v within e; the pools get k and v at the tokens' slots."""
    n_heads, n_kv_heads, head_dim, hidden, num_tokens, block_size = 2, 1, 8, 64, 2, 4
    h = (3 * rng.standard_normal((num_tokens, hidden))).astype(np.float32)
    gains = f32_weights(rng, hidden, center=1.0)
    w = f32_weights(rng, ((n_heads + 2 * n_kv_heads) * head_dim, hidden))
    positions, slots = np.array([5, 130], np.int32), np.array([9, 2], np.int32)
    inv_freq = rope_inv_freq(head_dim, 10000.0, None)
    pool_shape = (3, block_size, n_kv_heads, head_dim)
    k_pool, v_pool = (rng.standard_normal(pool_shape).astype(np.float32) for _ in range(2))
    d_pools = (cuda.to_device(k_pool), cuda.to_device(v_pool))
    fused = gemv_fused(cuda.to_device(h), cuda.to_device(w), RMSNormPrologue(cuda.to_device(gains), EPS),
                       RopeKVEpilogue(cuda.to_device(positions), cuda.to_device(inv_freq), n_heads, n_kv_heads,
                                      head_dim, d_pools, cuda.to_device(slots)))
    q, k, v, normed = (a.copy_to_host() for a in (fused.q, fused.k, fused.v, fused.normed))
    x = rmsnorm_ref(h, gains, EPS)
    e = 2 * dot_bound(x, w, hidden + 4)
    want_q, want_k, want_v = rope_qkv_ref(linear_ref(x, w), positions, inv_freq, n_heads, n_kv_heads, head_dim)
    q_cols, kv_cols, half = n_heads * head_dim, n_kv_heads * head_dim, head_dim // 2
    e_q = e[:, :q_cols].reshape(q.shape)
    e_k = e[:, q_cols:q_cols + kv_cols].reshape(k.shape)
    e_v = e[:, q_cols + kv_cols:].reshape(v.shape)
    for got, want, err in ((q, want_q, e_q), (k, want_k, e_k)):
        pair = err[..., :half] + err[..., half:]
        bound = np.concatenate([pair, pair], axis=-1) + 1e-5 + 1e-5 * np.abs(want)
        assert (np.abs(got - want) <= bound).all(), f"max err {np.abs(got - want).max()}"
    assert (np.abs(v - want_v) <= e_v).all()
    want_k_pool, want_v_pool = write_kv_paged_ref(k, v, k_pool, v_pool, slots)
    np.testing.assert_array_equal(d_pools[0].copy_to_host(), want_k_pool)
    np.testing.assert_array_equal(d_pools[1].copy_to_host(), want_v_pool)
    assert not np.isnan(normed).any()


def test_gains_must_be_stored_as_the_weights_are(rng):
    h = rng.standard_normal((1, 64)).astype(np.float32)
    with pytest.raises(AssertionError, match="norm weight"):
        gemv_fused(cuda.to_device(h), cuda.to_device(f32_weights(rng, (4, 64))),
                   RMSNormPrologue(cuda.to_device(np.ones(64, np.uint16)), EPS))
