"""Row gathers: token embeddings from a bf16 (or float32) table, and picking rows out of a float32 matrix.

    embedding:  out[t, :] = weight_to_f32(table[ids[t], :])        take_rows:  out[b, :] = x[rows[b], :]

Launch layout: one thread per output element on the GPU, grid-stride so the simulator can run a small
grid; item i is (row i // H, column i % H), so consecutive threads read consecutive columns.
The engine validates ids on the host; the kernels only guard against reading out of bounds and write
NaN for a row whose index is outside the table, so a bad id shows up instead of reading a neighbour.
One exception: with `fed_back`, a negative id (FED_BACK) means "the token this row's sequence sampled in the
previous step, still on the device": ids[t] == FED_BACK reads fed_back[t] instead. A pipelined decode step (the
engine launches step n + 1 before reading step n's greedy tokens back) embeds its tokens this way.
"""
import math

import numpy as np

from .common import cuda, jit, grid_stride_launch, launch_stream, device_empty
from .weight_dtype import weight_to_f32, weights_ref

THREADS = 256
FED_BACK = -1  # a token id that stands for fed_back[t]


@jit
def embedding_kernel(ids, table, out, fed_back):
    hidden = out.shape[1]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        t = i // hidden
        col = i % hidden
        row = ids[t]
        if row == FED_BACK and fed_back.shape[0] > t:
            row = fed_back[t]
        if 0 <= row < table.shape[0]:
            out[t, col] = weight_to_f32(table[row, col])
        else:
            out[t, col] = np.float32(math.nan)


@jit
def take_rows_kernel(x, rows, out):
    hidden = out.shape[1]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        b = i // hidden
        col = i % hidden
        row = rows[b]
        if 0 <= row < x.shape[0]:
            out[b, col] = x[row, col]
        else:
            out[b, col] = np.float32(math.nan)


def embedding(ids, table_bits, out=None, fed_back=None):
    """ids int32 [T], table_bits [V, H] (uint16 bf16 bits, or float32) -> float32 [T, H] (device arrays).
    fed_back: int32 [>= T], the ids that rows with id FED_BACK stand for."""
    n_tokens, hidden = ids.shape[0], table_bits.shape[1]
    out = device_empty((n_tokens, hidden), np.float32) if out is None else out
    assert out.shape == (n_tokens, hidden), (out.shape, n_tokens, hidden)
    assert fed_back is None or (fed_back.shape[0] >= n_tokens and fed_back.dtype == np.int32), fed_back.shape
    if n_tokens:
        blocks, threads = grid_stride_launch(out.size, THREADS)
        embedding_kernel[blocks, threads, launch_stream()](ids, table_bits, out, ids[:0] if fed_back is None
                                                           else fed_back)
    return out


def take_rows(x, rows, out=None):
    """x float32 [T, H], rows int32 [B] -> float32 [B, H] (device arrays)."""
    n_rows, hidden = rows.shape[0], x.shape[1]
    out = device_empty((n_rows, hidden), np.float32) if out is None else out
    assert out.shape == (n_rows, hidden), (out.shape, n_rows, hidden)
    if n_rows:
        blocks, threads = grid_stride_launch(out.size, THREADS)
        take_rows_kernel[blocks, threads, launch_stream()](x, rows, out)
    return out


def _gather_rows_ref(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.full((len(rows), values.shape[1]), np.nan, dtype=np.float32)
    valid = (rows >= 0) & (rows < values.shape[0])
    out[valid] = values[rows[valid]]
    return out


def embedding_ref(ids: np.ndarray, table_bits: np.ndarray, fed_back: np.ndarray | None = None) -> np.ndarray:
    if fed_back is not None:
        ids = np.where(ids == FED_BACK, fed_back[:len(ids)], ids)
    return _gather_rows_ref(weights_ref(table_bits), ids)


def take_rows_ref(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return _gather_rows_ref(x.astype(np.float32), rows)
