"""The KV pool's element type: float32 (the reference path), or bf16 bit patterns in uint16 (half the bytes).

    kv_to_f32(e)        = bf16_to_f32(e) for a uint16 element,  e itself for a float32 one
    kv_from_f32(x, pool) = f32_to_bf16(x) (round to nearest even) for a uint16 pool,  x for a float32 one

Every kernel that writes K/V into the pool stores kv_from_f32(value, pool), every kernel that reads the pool
computes with kv_to_f32(element): the attention math is then float32 on whatever the pool holds. numba compiles
a kernel once per argument dtype, and on the GPU overloads pick each body from the types (the pool array's
dtype, the element's), so a compiled kernel holds one of the two: no branch at run time. In the simulator (and
the numpy twins) they are plain Python that looks at the type.
"""
import numpy as np

from .bf16 import bf16_to_f32_ref, f32_to_bf16, f32_to_bf16_ref
from .common import SIMULATOR, host_version
from .weight_dtype import weight_to_f32

KV_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.uint16)}  # name -> storage dtype

kv_to_f32 = weight_to_f32  # the same decode: bf16 bits or float32, one element


def kv_from_f32(x, pool):
    """float32 x as `pool` stores it (plain Python: the simulator's version; a GPU overload below)."""
    return host_version(f32_to_bf16)(x) if pool.dtype == np.uint16 else np.float32(x)


if not SIMULATOR:
    from numba.cuda import types as _types
    from numba.cuda.extending import overload

    @overload(kv_from_f32, target="cuda")
    def _kv_from_f32_on_gpu(x, pool):
        if pool.dtype == _types.uint16:
            return lambda x, pool: f32_to_bf16(x)
        if pool.dtype == _types.float32:
            return lambda x, pool: np.float32(x)
        return None  # any other pool type: a typing error that names kv_from_f32


def kv_storage_dtype(name: str) -> np.dtype:
    """The pool's numpy dtype for a --kv-cache-dtype name (float32, or bfloat16 stored as uint16 bits)."""
    assert name in KV_DTYPES, f"kv cache dtype is one of {', '.join(KV_DTYPES)}, got {name!r}"
    return KV_DTYPES[name]


def check_kv_pool_dtype(*pools) -> None:
    """Pools are all float32 or all uint16 bf16 bits."""
    dtypes = {np.dtype(p.dtype) for p in pools}
    assert len(dtypes) == 1 and dtypes <= set(KV_DTYPES.values()), (
        f"KV pools are float32 or uint16 bf16 bits, all alike; got {sorted(map(str, dtypes))}")


def kv_encode_ref(x: np.ndarray, dtype) -> np.ndarray:
    """numpy twin of kv_from_f32 on whole arrays: x as a pool of `dtype` stores it."""
    x = np.asarray(x, np.float32)
    return f32_to_bf16_ref(x) if np.dtype(dtype) == np.uint16 else x.copy()


def kv_decode_ref(pool: np.ndarray) -> np.ndarray:
    """numpy twin of kv_to_f32 on a whole pool: its values as float32."""
    return bf16_to_f32_ref(pool) if pool.dtype == np.uint16 else pool.astype(np.float32)
