"""Row gathers: token embeddings from a bf16 table, and picking rows out of a float32 matrix.

    embedding:  out[t, :] = decode_bf16(table[ids[t], :])        take_rows:  out[b, :] = x[rows[b], :]

Launch layout: a 2-D grid, one thread per output element; x (fastest) runs along the row, y over rows.
The engine validates ids on the host; the kernels only guard against reading out of bounds and write
NaN for a row whose index is outside the table, so a bad id shows up instead of reading a neighbour.
"""
import math

import numpy as np

from .bf16 import bf16_to_f32, bf16_to_f32_ref
from .common import cuda, jit, cdiv

THREADS_X = 64
THREADS_Y = 4


@jit
def embedding_kernel(ids, table, out):
    col, t = cuda.grid(2)
    if t < out.shape[0] and col < out.shape[1]:
        row = ids[t]
        if 0 <= row < table.shape[0]:
            out[t, col] = bf16_to_f32(table[row, col])
        else:
            out[t, col] = np.float32(math.nan)


@jit
def take_rows_kernel(x, rows, out):
    col, b = cuda.grid(2)
    if b < out.shape[0] and col < out.shape[1]:
        row = rows[b]
        if 0 <= row < x.shape[0]:
            out[b, col] = x[row, col]
        else:
            out[b, col] = np.float32(math.nan)


def _grid(n_rows: int, n_cols: int):
    return (cdiv(n_cols, THREADS_X), cdiv(n_rows, THREADS_Y)), (THREADS_X, THREADS_Y)


def embedding(ids, table_bits, out=None):
    """ids int32 [T], table_bits uint16 bf16 [V, H] -> float32 [T, H] (device arrays)."""
    n_tokens, hidden = ids.shape[0], table_bits.shape[1]
    out = cuda.device_array((n_tokens, hidden), np.float32) if out is None else out
    assert out.shape == (n_tokens, hidden), (out.shape, n_tokens, hidden)
    if n_tokens:
        grid, block = _grid(n_tokens, hidden)
        embedding_kernel[grid, block](ids, table_bits, out)
    return out


def take_rows(x, rows, out=None):
    """x float32 [T, H], rows int32 [B] -> float32 [B, H] (device arrays)."""
    n_rows, hidden = rows.shape[0], x.shape[1]
    out = cuda.device_array((n_rows, hidden), np.float32) if out is None else out
    assert out.shape == (n_rows, hidden), (out.shape, n_rows, hidden)
    if n_rows:
        grid, block = _grid(n_rows, hidden)
        take_rows_kernel[grid, block](x, rows, out)
    return out


def _gather_rows_ref(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.full((len(rows), values.shape[1]), np.nan, dtype=np.float32)
    valid = (rows >= 0) & (rows < values.shape[0])
    out[valid] = values[rows[valid]]
    return out


def embedding_ref(ids: np.ndarray, table_bits: np.ndarray) -> np.ndarray:
    return _gather_rows_ref(bf16_to_f32_ref(table_bits), ids)


def take_rows_ref(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return _gather_rows_ref(x.astype(np.float32), rows)
