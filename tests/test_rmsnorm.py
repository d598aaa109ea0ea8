import numpy as np
import pytest

from kernels_numba.bf16 import bf16_to_f32_ref, f32_to_bf16_ref
from kernels_numba.common import cuda
from kernels_numba.activation import residual_add
from kernels_numba.rmsnorm import SIMULATOR_BLOCKS, add_rmsnorm, add_rmsnorm_ref, rmsnorm, rmsnorm_ref
from tests.helpers import poisoned

EPS = 1e-5
ROW_SCALES = np.array([1e-3, 1.0, 3.0, 1e6, 1e15], dtype=np.float32)  # 1e-3: eps matters; 1e15: x^2 ~ 1e30


def _inputs(rng, hidden):
    x = (rng.standard_normal((len(ROW_SCALES), hidden)) * ROW_SCALES[:, None]).astype(np.float32)
    weight_bits = f32_to_bf16_ref((1 + 0.5 * rng.standard_normal(hidden)).astype(np.float32))
    return x, weight_bits


def test_ref_matches_float64_formula(rng):
    x, weight_bits = _inputs(rng, 67)
    x64 = x.astype(np.float64)
    want = bf16_to_f32_ref(weight_bits) * x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + EPS)
    # float32 sum of 67 squares, sqrt, divide, two products: a few ulp, far below 1e-5
    np.testing.assert_allclose(rmsnorm_ref(x, weight_bits, EPS), want, rtol=1e-5)


@pytest.mark.parametrize("hidden, threads", [(67, None), (64, 4), (5, 32), (130, 1)])
def test_rmsnorm_matches_ref(rng, hidden, threads):
    x, weight_bits = _inputs(rng, hidden)
    out = poisoned(x.shape, np.float32)
    got = rmsnorm(cuda.to_device(x), cuda.to_device(weight_bits), EPS, out=out, threads=threads).copy_to_host()
    # Only the row scale can differ (tree vs numpy pairwise sum order, 1/sqrt vs rsqrt): a few ulp of a
    # shared factor, so the error is relative per element and atol is not needed. 1e-5 is ~80 ulp.
    np.testing.assert_allclose(got, rmsnorm_ref(x, weight_bits, EPS), rtol=1e-5, atol=0)


def test_rmsnorm_in_place(rng):
    x, weight_bits = _inputs(rng, 67)
    d_x = cuda.to_device(x)
    returned = rmsnorm(d_x, cuda.to_device(weight_bits), EPS, out=d_x)
    assert returned is d_x
    np.testing.assert_allclose(d_x.copy_to_host(), rmsnorm_ref(x, weight_bits, EPS), rtol=1e-5, atol=0)


def test_rmsnorm_rejects_non_power_of_two_block(rng):
    x, weight_bits = _inputs(rng, 8)
    with pytest.raises(AssertionError, match="power of two"):
        rmsnorm(cuda.to_device(x), cuda.to_device(weight_bits), EPS, threads=24)


def _add_inputs(rng, n_rows, hidden):
    """Random x, residual (no zeros) with the row scales of ROW_SCALES, cycled over n_rows."""
    scales = np.resize(ROW_SCALES, n_rows)[:, None]
    x = (rng.standard_normal((n_rows, hidden)) * scales).astype(np.float32)
    residual = (rng.standard_normal((n_rows, hidden)) * scales).astype(np.float32)
    weight_bits = f32_to_bf16_ref((1 + 0.5 * rng.standard_normal(hidden)).astype(np.float32))
    assert (x != 0).all() and (residual != 0).all() and (x + residual != 0).all()
    return x, residual, weight_bits


# 1 and 2 rows: fewer / as many as the simulated grid's blocks; more: blocks stride over rows. 40 rows make
# the bit-for-bit check bite: a changed summation order flips last bits in many rows, but one changed
# rounding (say an fma where the unfused kernel rounds v * v first) in only ~1 row in 15.
@pytest.mark.parametrize("n_rows, hidden, threads", [(1, 67, None), (2, 64, 4), (5, 67, None), (7, 5, 8),
                                                     (5, 130, 1), (40, 67, None)])
def test_add_rmsnorm_matches_ref_and_unfused_bit_for_bit(rng, n_rows, hidden, threads):
    assert SIMULATOR_BLOCKS < 5
    x, residual, weight_bits = _add_inputs(rng, n_rows, hidden)
    d_x, d_residual, d_w = cuda.to_device(x), cuda.to_device(residual), cuda.to_device(weight_bits)
    h_out, out = poisoned(x.shape, np.float32), poisoned(x.shape, np.float32)
    h, y = add_rmsnorm(d_x, d_residual, d_w, EPS, out=out, h_out=h_out, threads=threads)
    assert h is h_out and y is out
    h, y = h.copy_to_host(), y.copy_to_host()

    want_h, want_y = add_rmsnorm_ref(x, residual, weight_bits, EPS)
    np.testing.assert_array_equal(h, want_h)  # one float32 add on both sides
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=0)  # as test_rmsnorm_matches_ref

    # the unfused pair, with the same block size: every bit the same
    unfused_h = residual_add(d_x, d_residual, out=poisoned(x.shape, np.float32))
    unfused_y = rmsnorm(unfused_h, d_w, EPS, out=poisoned(x.shape, np.float32), threads=threads).copy_to_host()
    np.testing.assert_array_equal(h.view(np.uint32), unfused_h.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(y.view(np.uint32), unfused_y.view(np.uint32))

    np.testing.assert_array_equal(d_x.copy_to_host(), x)  # inputs untouched
    np.testing.assert_array_equal(d_residual.copy_to_host(), residual)


def test_add_rmsnorm_allocates_and_may_write_h_over_residual(rng):
    x, residual, weight_bits = _add_inputs(rng, 3, 16)
    d_x, d_w = cuda.to_device(x), cuda.to_device(weight_bits)
    h, y = add_rmsnorm(d_x, cuda.to_device(residual), d_w, EPS)  # fresh outputs
    d_residual = cuda.to_device(residual)
    h_in_place, y2 = add_rmsnorm(d_x, d_residual, d_w, EPS, h_out=d_residual)
    assert h_in_place is d_residual
    want_h, want_y = add_rmsnorm_ref(x, residual, weight_bits, EPS)
    for got_h, got_y in ((h, y), (h_in_place, y2)):
        np.testing.assert_array_equal(got_h.copy_to_host(), want_h)
        np.testing.assert_allclose(got_y.copy_to_host(), want_y, rtol=1e-5, atol=0)


# out_bits: the normed rows also as bf16 bits (what a tensor-core projection reads next). Exact: the copy is
# f32_to_bf16 (nearest even) of the very float32 values written to out, and out itself must not change.
@pytest.mark.parametrize("fused_add", [False, True])
@pytest.mark.parametrize("n_rows, hidden, threads", [(2, 64, 4), (5, 67, None), (7, 5, 8), (40, 67, None)])
def test_norms_write_the_bf16_copy_of_their_output(rng, fused_add, n_rows, hidden, threads):
    x, residual, weight_bits = _add_inputs(rng, n_rows, hidden)
    d_x, d_residual, d_w = cuda.to_device(x), cuda.to_device(residual), cuda.to_device(weight_bits)
    out, bits = poisoned(x.shape, np.float32), poisoned(x.shape, np.uint16)
    plain_out = poisoned(x.shape, np.float32)
    if fused_add:
        add_rmsnorm(d_x, d_residual, d_w, EPS, out=out, threads=threads, out_bits=bits)
        add_rmsnorm(d_x, d_residual, d_w, EPS, out=plain_out, threads=threads)
    else:
        rmsnorm(d_x, d_w, EPS, out=out, threads=threads, out_bits=bits)
        rmsnorm(d_x, d_w, EPS, out=plain_out, threads=threads)
    y = out.copy_to_host()
    np.testing.assert_array_equal(y.view(np.uint32), plain_out.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(bits.copy_to_host(), f32_to_bf16_ref(y))


def test_norms_reject_bits_of_the_wrong_dtype_or_shape(rng):
    x, residual, weight_bits = _add_inputs(rng, 3, 16)
    d_x, d_w = cuda.to_device(x), cuda.to_device(weight_bits)
    with pytest.raises(AssertionError, match="out_bits must be uint16"):
        rmsnorm(d_x, d_w, EPS, out_bits=cuda.device_array(x.shape, np.float32))
    with pytest.raises(AssertionError, match="out_bits must be uint16"):
        add_rmsnorm(d_x, cuda.to_device(residual), d_w, EPS, out_bits=cuda.device_array((3, 8), np.uint16))
