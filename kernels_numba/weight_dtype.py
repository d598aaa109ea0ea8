"""Weights as the kernels read them: bf16 bit patterns (uint16) for a BF16 checkpoint, float32 for an F32 one
(and F16, widened exactly), so a model computes with exactly the values its checkpoint holds.

    weight_to_f32(w) = bf16_to_f32(w) for a uint16 element,  w itself for a float32 one

Every weight-reading kernel calls weight_to_f32 on the elements it reads. numba compiles a kernel once per
argument dtype, and on the GPU an overload picks the body from the element's type, so each compiled kernel
holds only one of the two (no branch at run time). Packed reads (gemv_coalesced loads 8-byte words holding
several weights) cut `weight_bits(dtype)` bits per weight and decode them with bf16_to_f32 or f32_from_bits.
"""
import numpy as np

from .bf16 import bf16_to_f32, bf16_to_f32_ref
from .common import SIMULATOR, host_version, jit

WEIGHT_DTYPES = (np.dtype(np.uint16), np.dtype(np.float32))


def weight_to_f32(w):
    """One weight element as float32 (plain Python: the simulator's and the numpy twins' version; on a GPU the
    overload below stands in for it inside kernels, and this body runs on the host only)."""
    return host_version(bf16_to_f32)(w) if type(w) is np.uint16 else np.float32(w)


if not SIMULATOR:
    from numba.cuda import types as _types
    from numba.cuda.extending import overload

    @overload(weight_to_f32, target="cuda")
    def _weight_to_f32_on_gpu(w):
        if w == _types.uint16:
            return lambda w: bf16_to_f32(w)
        if w == _types.float32:
            return lambda w: w
        return None  # any other type: a typing error that names weight_to_f32


@jit(device=True)
def f32_from_bits(bits):
    """A float32 from its 32-bit pattern (a weight cut out of a packed word)."""
    return np.uint32(bits).view(np.float32)


def weight_bits(dtype) -> int:
    """Bits per weight: 16 (bf16 bit patterns) or 32 (float32); anything else is refused."""
    dtype = np.dtype(dtype)
    assert dtype in WEIGHT_DTYPES, f"weights are uint16 bf16 bit patterns or float32, got {dtype}"
    return 8 * dtype.itemsize


def weights_ref(w: np.ndarray) -> np.ndarray:
    """numpy twin: a weight array as float32 values (bf16 bits decoded, float32 as it is)."""
    weight_bits(w.dtype)
    return bf16_to_f32_ref(w) if w.dtype == np.uint16 else w.astype(np.float32)
