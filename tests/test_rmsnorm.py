import numpy as np
import pytest

from kernels_numba.bf16 import bf16_to_f32_ref, f32_to_bf16_ref
from kernels_numba.common import cuda
from kernels_numba.rmsnorm import rmsnorm, rmsnorm_ref
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
