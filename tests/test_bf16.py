import ml_dtypes
import numpy as np

from kernels_numba.bf16 import bf16_to_f32_device, f32_to_bf16_device, bf16_to_f32_ref, f32_to_bf16_ref
from kernels_numba.common import cuda
from tests.helpers import poisoned

EDGE_CASES = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0,
     np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1e-40, -1e-40,  # max, smallest normal, denormals
     float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 3.3895314e38],       # bf16 max, rounds up to inf
    dtype=np.float32)


def _ties():
    """float32 values exactly half-way between two bf16 values: even and odd low bits both."""
    base = np.array([0x3F800000, 0x3F810000, 0x40490000, 0xC0490000], dtype=np.uint32)
    return (base | np.uint32(0x8000)).view(np.float32)


def test_encode_bit_exact_against_ml_dtypes(rng):
    x = np.concatenate([rng.standard_normal(3000).astype(np.float32) * 100,
                        rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        EDGE_CASES, _ties()])
    out = poisoned(x.shape, np.uint16)
    got = f32_to_bf16_device(cuda.to_device(x), out=out).copy_to_host()
    want = f32_to_bf16_ref(x)
    nan = np.isnan(x)
    # NaN payloads differ between implementations; what matters is that NaN stays NaN.
    assert np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])


def test_decode_bit_exact_against_ml_dtypes(rng):
    bits = np.concatenate([rng.integers(0, 2**16, 5000, dtype=np.uint32).astype(np.uint16),
                           f32_to_bf16_ref(EDGE_CASES)])
    out = poisoned(bits.shape, np.float32)
    got = bf16_to_f32_device(cuda.to_device(bits), out=out).copy_to_host()
    np.testing.assert_array_equal(got.view(np.uint32), bf16_to_f32_ref(bits).view(np.uint32))
