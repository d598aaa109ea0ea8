"""Elementwise MLP pieces: the SwiGLU gate and the residual add, all float32.

    silu_mul:  out = silu(gate) * up,  silu(g) = g / (1 + exp(-g))        residual_add:  out = x + residual

`silu_mul_bf16` is silu_mul with its output rounded to bf16 (uint16 bits, nearest even): the fast path's
down_proj reads bf16 on tensor cores, and writing bf16 here saves gemm_tc a conversion launch and 6 bytes a
value (the gate's output is the widest activation of a layer, T x intermediate). Where the fast plan runs gate|up
on tensor cores in one pass, gemm_tc's SwiGLU epilogue computes the same bits with this module's `silu` instead
(kernel_plan.KernelPlan.gate), and silu_mul_gate_up(bf16=True) is the fallback.

Launch layout: a block row per matrix row (grid y, strided past 65,535 rows), consecutive threads on consecutive
columns (grid x), both grid-strided so the simulator can run a small grid. No flat index: the gate and up halves
are column slices of one gate|up output, and a flat i // n_cols, i % n_cols per element (a 64-bit division and
modulo) would dominate a long prefill's silu_mul (scripts/time_mlp_fast.py; measured: docs/bench-h200.md).
silu is evaluated so exp never overflows: for g < 0 it uses the equal form g * e / (1 + e), e = exp(g).
"""
import math

import numpy as np

from .bf16 import f32_to_bf16
from .common import cuda, jit, launch_stream, device_empty, rows_launch

THREADS = 256


@jit(device=True)
def silu(g):
    if g >= np.float32(0.0):
        return g / (np.float32(1.0) + np.float32(math.exp(-g)))
    e = np.float32(math.exp(g))  # math.exp of a float32 gives float64 in the simulator: cast back
    return g * e / (np.float32(1.0) + e)


@jit
def silu_mul_kernel(gate, up, up_col, out):
    n_rows, n_cols = out.shape
    for row in range(cuda.blockIdx.y, n_rows, cuda.gridDim.y):
        for col in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, n_cols, cuda.gridDim.x * cuda.blockDim.x):
            out[row, col] = silu(gate[row, col]) * up[row, up_col + col]


@jit
def silu_mul_bf16_kernel(gate, up, up_col, out):
    n_rows, n_cols = out.shape
    for row in range(cuda.blockIdx.y, n_rows, cuda.gridDim.y):
        for col in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, n_cols, cuda.gridDim.x * cuda.blockDim.x):
            out[row, col] = f32_to_bf16(silu(gate[row, col]) * up[row, up_col + col])


@jit
def residual_add_kernel(x, residual, out):
    n_rows, n_cols = out.shape
    for row in range(cuda.blockIdx.y, n_rows, cuda.gridDim.y):
        for col in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, n_cols, cuda.gridDim.x * cuda.blockDim.x):
            out[row, col] = x[row, col] + residual[row, col]


def _launch(kernel, a, b, out, dtype=np.float32, b_col=None, width=None):
    """out [rows, width] = f(a, b) elementwise over a's first `width` columns (default all) and, with b_col, b's
    columns from b_col on (the kernel then takes b_col as an argument)."""
    shape = (a.shape[0], a.shape[1] if width is None else width)
    assert a.ndim == 2 and b.shape[0] == a.shape[0] and b.shape[1] >= (b_col or 0) + shape[1], (a.shape, b.shape)
    out = device_empty(shape, dtype) if out is None else out
    assert out.shape == shape and out.dtype == dtype, (out.shape, shape, out.dtype)
    if out.size:
        blocks, threads = rows_launch(*shape, THREADS)
        args = (a, b, out) if b_col is None else (a, b, np.int64(b_col), out)
        kernel[blocks, threads, launch_stream()](*args)
    return out


def silu_mul(gate, up, out=None):
    """gate, up float32 [T, I] -> silu(gate) * up, float32 [T, I] (device arrays)."""
    assert gate.shape == up.shape, (gate.shape, up.shape)
    return _launch(silu_mul_kernel, gate, up, out, b_col=0)


def silu_mul_gate_up(gate_up, out=None, bf16: bool = False):
    """gate_up float32 [T, 2 I] (the gate|up projection's output: gate, then up) -> silu(gate) * up [T, I], float32
    or (bf16) uint16 bf16 bits. Reads the two halves in place: launching on column slices of a device array costs
    numba's host side milliseconds at prefill sizes (scripts/time_mlp_fast.py)."""
    assert gate_up.shape[1] % 2 == 0, gate_up.shape
    half = gate_up.shape[1] // 2
    if bf16:
        return _launch(silu_mul_bf16_kernel, gate_up, gate_up, out, np.uint16, b_col=half, width=half)
    return _launch(silu_mul_kernel, gate_up, gate_up, out, b_col=half, width=half)


def silu_mul_bf16(gate, up, out=None):
    """gate, up float32 [T, I] -> bf16(silu(gate) * up) as uint16 bits [T, I] (device arrays)."""
    assert gate.shape == up.shape, (gate.shape, up.shape)
    return _launch(silu_mul_bf16_kernel, gate, up, out, np.uint16, b_col=0)


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
