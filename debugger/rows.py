"""How the debugger lays a stage output out in rows (the tensor inspector, trace, the precision comparison)."""
import numpy as np


def as_rows(array: np.ndarray) -> np.ndarray:
    """A stage output as a 2-D [tokens, features] view ([T, heads, hd] -> [T, heads * hd])."""
    array = np.asarray(array)
    return array.reshape(1, -1) if array.ndim < 2 else array.reshape(array.shape[0], -1)
