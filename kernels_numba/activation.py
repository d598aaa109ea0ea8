"""Elementwise MLP pieces: the SwiGLU gate and the residual add, all float32.

    silu_mul:  out = silu(gate) * up,  silu(g) = g / (1 + exp(-g))        residual_add:  out = x + residual

`silu_mul_bf16` is silu_mul with its output rounded to bf16 (uint16 bits, nearest even): the fast path's
down_proj reads bf16 on tensor cores, and writing bf16 here saves gemm_tc a conversion launch and 6 bytes a
value (the gate's output is the widest activation of a layer, T x intermediate).

Launch layout: one thread per element on the GPU, grid-stride so the simulator can run a small grid;
item i is (row i // n_cols, column i % n_cols), so consecutive threads touch consecutive columns.
silu is evaluated so exp never overflows: for g < 0 it uses the equal form g * e / (1 + e), e = exp(g).
"""
import math

import numpy as np

from .bf16 import f32_to_bf16
from .common import cuda, jit, grid_stride_launch, launch_stream, device_empty

THREADS = 256


@jit(device=True)
def silu(g):
    if g >= np.float32(0.0):
        return g / (np.float32(1.0) + np.float32(math.exp(-g)))
    e = np.float32(math.exp(g))  # math.exp of a float32 gives float64 in the simulator: cast back
    return g * e / (np.float32(1.0) + e)


@jit
def silu_mul_kernel(gate, up, out):
    n_cols = out.shape[1]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        row = i // n_cols
        col = i % n_cols
        out[row, col] = silu(gate[row, col]) * up[row, col]


@jit
def silu_mul_bf16_kernel(gate, up, out):
    n_cols = out.shape[1]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        row = i // n_cols
        col = i % n_cols
        out[row, col] = f32_to_bf16(silu(gate[row, col]) * up[row, col])


@jit
def residual_add_kernel(x, residual, out):
    n_cols = out.shape[1]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        row = i // n_cols
        col = i % n_cols
        out[row, col] = x[row, col] + residual[row, col]


def _launch(kernel, a, b, out, dtype=np.float32):
    assert a.ndim == 2 and a.shape == b.shape, (a.shape, b.shape)
    out = device_empty(a.shape, dtype) if out is None else out
    assert out.shape == a.shape and out.dtype == dtype, (out.shape, a.shape, out.dtype)
    if a.size:
        blocks, threads = grid_stride_launch(a.size, THREADS)
        kernel[blocks, threads, launch_stream()](a, b, out)
    return out


def silu_mul(gate, up, out=None):
    """gate, up float32 [T, I] -> silu(gate) * up, float32 [T, I] (device arrays)."""
    return _launch(silu_mul_kernel, gate, up, out)


def silu_mul_bf16(gate, up, out=None):
    """gate, up float32 [T, I] -> bf16(silu(gate) * up) as uint16 bits [T, I] (device arrays)."""
    return _launch(silu_mul_bf16_kernel, gate, up, out, np.uint16)


def residual_add(x, residual, out=None):
    """x, residual float32 [T, H] -> x + residual (device arrays); out may be x or residual."""
    return _launch(residual_add_kernel, x, residual, out)


def silu_ref(g: np.ndarray) -> np.ndarray:
    g = g.astype(np.float32)
    e = np.exp(-np.abs(g))  # exp of a non-positive number: never overflows
    return np.where(g >= 0, g / (np.float32(1) + e), g * e / (np.float32(1) + e)).astype(np.float32)


def silu_mul_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu_ref(gate) * up.astype(np.float32)


def residual_add_ref(x: np.ndarray, residual: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) + residual.astype(np.float32)
