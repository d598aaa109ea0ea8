"""bfloat16 <-> float32: a bf16 is the top 16 bits of a float32; encoding rounds to nearest even.

    decode(h) = float32 bits (h << 16)
    encode(x) = (u + 0x7FFF + ((u >> 16) & 1)) >> 16   with u = bits(x), and NaN -> 0x7FC0 (quiet NaN)

Weights live on the device as uint16 bf16 bit patterns; kernels decode them to float32 on load
(`bf16_to_f32` is the device function every weight-reading kernel calls). Layout: one thread per element
on the GPU, grid-stride so the simulator can run a small grid.
"""
import numpy as np
import ml_dtypes

from .common import cuda, jit, grid_stride_launch, launch_stream, device_empty

THREADS = 256


@jit(device=True)
def bf16_to_f32(h):
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


@jit(device=True)
def f32_to_bf16(x):
    u = np.float32(x).view(np.uint32)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: keep it a (quiet) NaN
        return np.uint16(0x7FC0)
    rounding_bias = np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return np.uint16((u + rounding_bias) >> np.uint32(16))


@jit
def bf16_to_f32_kernel(src, dst):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        dst[i] = bf16_to_f32(src[i])


@jit
def f32_to_bf16_kernel(src, dst):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        dst[i] = f32_to_bf16(src[i])


def bf16_to_f32_device(src_bits, out=None):
    """Decode a 1-D device array of uint16 bf16 bits into float32."""
    out = device_empty(src_bits.shape, np.float32) if out is None else out
    blocks, threads = grid_stride_launch(src_bits.size, THREADS)
    bf16_to_f32_kernel[blocks, threads, launch_stream()](src_bits, out)
    return out


def f32_to_bf16_device(src, out=None):
    """Encode a 1-D device array of float32 into uint16 bf16 bits (round to nearest even)."""
    out = device_empty(src.shape, np.uint16) if out is None else out
    blocks, threads = grid_stride_launch(src.size, THREADS)
    f32_to_bf16_kernel[blocks, threads, launch_stream()](src, out)
    return out


def bf16_to_f32_ref(bits: np.ndarray) -> np.ndarray:
    return bits.view(ml_dtypes.bfloat16).astype(np.float32)


def f32_to_bf16_ref(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
