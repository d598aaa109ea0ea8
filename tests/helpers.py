"""Shared test helpers: poisoned outputs, so elements a kernel forgot to write show up as NaN."""
import numpy as np

from kernels_numba.common import cuda

POISON_F32 = np.float32(np.nan)
POISON_U16 = np.uint16(0xFFFF)  # a bf16 NaN pattern no correct encode produces (encode gives 0x7FC0)
POISON_I32 = np.int32(-12345)


def poisoned(shape, dtype):
    """A device array filled with a value no correct kernel writes."""
    dtype = np.dtype(dtype)
    fill = {np.dtype(np.float32): POISON_F32, np.dtype(np.uint16): POISON_U16,
            np.dtype(np.int32): POISON_I32, np.dtype(np.int64): np.int64(-12345)}[dtype]
    return cuda.to_device(np.full(shape, fill, dtype=dtype))


def hf_log_softmax(golden) -> np.ndarray:
    """Row p: the log-distribution of the token after position p, from HF's logits in a golden file (float64)."""
    x = golden["logits"].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
