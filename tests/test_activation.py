import numpy as np
import pytest

import ml_dtypes

from kernels_numba.activation import (residual_add, residual_add_ref, silu_mul, silu_mul_bf16, silu_mul_ref,
                                 silu_ref)
from kernels_numba.common import cuda
from tests.helpers import poisoned

EXTREME_GATES = np.array([-1000, -100, -88.8, -30, -1e-30, 0, 1e-30, 30, 88.8, 100, 1000], dtype=np.float32)


def test_silu_ref_matches_float64_formula(rng):
    g = np.concatenate([rng.standard_normal(500) * 6, EXTREME_GATES]).astype(np.float32)
    with np.errstate(over="ignore"):  # exp(1000) is inf even in float64; g / inf is the right limit, 0
        want = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64)))
    # a few float32 roundings (exp, add, divide): well under 1e-6 relative; atol covers denormal results
    np.testing.assert_allclose(silu_ref(g), want, rtol=1e-6, atol=1e-38)


@pytest.mark.parametrize("shape", [(5, 67), (1, 3), (2, 130)])
def test_silu_mul_matches_ref(rng, shape):
    gate = (rng.standard_normal(shape) * 4).astype(np.float32)
    gate.flat[:min(gate.size, len(EXTREME_GATES))] = EXTREME_GATES[:gate.size]
    up = rng.standard_normal(shape).astype(np.float32)
    out = poisoned(shape, np.float32)
    got = silu_mul(cuda.to_device(gate), cuda.to_device(up), out=out).copy_to_host()
    assert np.isfinite(got).all(), "silu must not overflow for large |gate|"
    # exp may differ by an ulp between the device and numpy; after the divide and multiply that stays
    # below 1e-6 relative. atol only matters for denormal results (gate around -100).
    np.testing.assert_allclose(got, silu_mul_ref(gate, up), rtol=1e-6, atol=1e-38)


def test_silu_mul_bf16_is_silu_mul_rounded_to_nearest_even(rng):
    # Strided gate / up views, as the MLP passes them (the halves of gate|up). The device's silu_mul agrees with
    # numpy to 1e-6 relative (above), so compare with the device's own float32 result rounded by ml_dtypes:
    # then every bit must match.
    gate_up = (rng.standard_normal((5, 2 * 40)) * 4).astype(np.float32)
    gate_up[0, :len(EXTREME_GATES)] = EXTREME_GATES
    d = cuda.to_device(gate_up)
    out = poisoned((5, 40), np.uint16)
    got = silu_mul_bf16(d[:, :40], d[:, 40:], out=out)
    assert got is out
    want = silu_mul(d[:, :40], d[:, 40:]).copy_to_host().astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got.copy_to_host(), want)


def test_silu_limits():
    gate = np.array([[-1000.0, 1000.0, 0.0]], dtype=np.float32)
    up = np.ones_like(gate)
    got = silu_mul(cuda.to_device(gate), cuda.to_device(up)).copy_to_host()
    np.testing.assert_array_equal(got, [[0.0, 1000.0, 0.0]])


@pytest.mark.parametrize("shape", [(3, 67), (1, 5)])
def test_residual_add_bit_exact(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    residual = (rng.standard_normal(shape) * 100).astype(np.float32)
    out = poisoned(shape, np.float32)
    got = residual_add(cuda.to_device(x), cuda.to_device(residual), out=out).copy_to_host()
    # one IEEE float32 add per element: exact match
    np.testing.assert_array_equal(got, residual_add_ref(x, residual))


def test_residual_add_in_place(rng):
    x = rng.standard_normal((4, 67)).astype(np.float32)
    residual = rng.standard_normal((4, 67)).astype(np.float32)
    d_x = cuda.to_device(x)
    returned = residual_add(d_x, cuda.to_device(residual), out=d_x)
    assert returned is d_x
    np.testing.assert_array_equal(d_x.copy_to_host(), x + residual)


def test_shape_mismatch_is_rejected(rng):
    a = cuda.to_device(np.ones((2, 3), np.float32))
    b = cuda.to_device(np.ones((3, 2), np.float32))
    with pytest.raises(AssertionError):
        silu_mul(a, b)
