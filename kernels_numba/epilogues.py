"""What a projection y = x @ W.T can do in front of and behind its dot products, one small object each.

The fused launchers (matmul.gemv_fused; the tensor-core GEMM takes the same objects) get at most one
prologue and one epilogue:

    RMSNormPrologue(weight, eps)   x -> rmsnorm(x) = g * x * rsqrt(mean(x^2) + eps) in front (and writes
                                   normed = rmsnorm(x), the stage output)
    SwiGLUEpilogue(bf16=False)     W = [Wg; Wu] stacked: out [T, I] = silu(x Wg) * (x Wu), float32 (the GEMV's),
                                   or with bf16 rounded to bf16 bits (uint16: the tensor-core GEMM's, for down_proj)
    ResidualEpilogue(residual)     behind: residual_out = out + residual
    RopeKVEpilogue(positions, inv_freq, n_heads, n_kv_heads, head_dim, kv_pools, slot_mapping)
                                   W = [Wq; Wk; Wv]: RoPE on q and k, then q, k, v stored and k, v written at each
                                   token's slot of the paged pools (rope.rope_qkv's work); out is not stored

Output arrays left as None are allocated (device_empty). `fused_outputs` checks every shape once and returns
the `FusedOutputs` the launcher fills and hands back.
"""
from dataclasses import dataclass

import numpy as np

from .common import device_empty
from .kv_dtype import check_kv_pool_dtype
from .weight_dtype import WEIGHT_DTYPES


@dataclass
class RMSNormPrologue:
    weight: object        # [K] gains, stored as W is (uint16 bf16 bits or float32)
    eps: float
    normed: object = None  # float32 [T, K]: rmsnorm(x), written by the launch (allocated if None)


@dataclass
class SwiGLUEpilogue:
    """W is [Wg; Wu] ([2 I, K]); out [T, I] = silu(x Wg) * (x Wu): float32, or (bf16) rounded to bf16 bits, uint16,
    as activation.silu_mul_gate_up(bf16=True) writes it. gemv_fused writes float32, gemm_tc bf16."""
    bf16: bool = False


@dataclass
class ResidualEpilogue:
    residual: object            # float32 [T, N]
    residual_out: object = None  # float32 [T, N]: out + residual (allocated if None)


@dataclass
class RopeKVEpilogue:
    """W is [Wq; Wk; Wv] ([(n_heads + 2 n_kv_heads) head_dim, K]); the outputs are rope.rope_qkv's: q, k rotated
    by position, v as is, and k, v also stored at slot_mapping[t] of kv_pools = (k_pool, v_pool) ([num_blocks,
    block_size, n_kv_heads, head_dim], float32 or bf16 bits; slot -1: nothing). out itself is never stored."""
    positions: object     # int32 [T]
    inv_freq: object      # float32 [head_dim / 2]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    kv_pools: tuple
    slot_mapping: object  # int32 [T]
    q: object = None      # float32 [T, n_heads, head_dim] (allocated if None); k, v [T, n_kv_heads, head_dim]
    k: object = None
    v: object = None

    def operands(self, q, k, v) -> tuple:
        """What the kernels take (one tuple argument): positions, inv_freq, q, k, v, k_pool, v_pool, slot_mapping."""
        k_pool, v_pool = self.kv_pools
        return (self.positions, self.inv_freq, q, k, v, k_pool, v_pool, self.slot_mapping)


EPILOGUES = (SwiGLUEpilogue, ResidualEpilogue, RopeKVEpilogue)


@dataclass
class FusedOutputs:
    """What a fused launch wrote. out: [T, N] (SwiGLU: [T, N / 2], uint16 bf16 bits with its bf16; None with RoPE,
    which stores q, k, v)."""
    out: object = None
    normed: object = None        # with RMSNormPrologue
    residual_out: object = None  # with ResidualEpilogue
    q: object = None             # with RopeKVEpilogue
    k: object = None
    v: object = None


def pairs_rows(epilogue) -> bool:
    """Whether each output of the epilogue is a pair of weight rows (gate and up, or a RoPE pair)."""
    return isinstance(epilogue, (SwiGLUEpilogue, RopeKVEpilogue))


def fused_outputs(x, w_bits, prologue: RMSNormPrologue | None, epilogue, out=None) -> FusedOutputs:
    """Check x [T, K] (float32, or uint16 bf16 bits), W [N, K] (uint16 bf16 bits or float32), the prologue's and
    epilogue's operands; allocate every output left None. Each launcher asserts what its own kernel reads."""
    assert x.ndim == 2 and w_bits.ndim == 2, (x.shape, w_bits.shape)
    assert x.shape[1] == w_bits.shape[1], f"in_features differ: x {x.shape}, w {w_bits.shape}"
    assert w_bits.dtype in WEIGHT_DTYPES and x.dtype in (np.float32, np.uint16), (x.dtype, w_bits.dtype)
    assert prologue is None or isinstance(prologue, RMSNormPrologue), f"unknown prologue {prologue!r}"
    assert epilogue is None or isinstance(epilogue, EPILOGUES), f"unknown epilogue {epilogue!r}"
    num_tokens, in_features = x.shape
    weight_rows = w_bits.shape[0]
    result = FusedOutputs()
    if prologue is not None:
        # one kernel cuts the gains and W from words of the same type: they are stored alike
        assert prologue.weight.shape == (in_features,) and prologue.weight.dtype == w_bits.dtype, (
            f"norm weight {prologue.weight.shape} {prologue.weight.dtype}, W {w_bits.dtype}")
        result.normed = device_empty(x.shape, np.float32) if prologue.normed is None else prologue.normed
        assert result.normed.shape == x.shape and result.normed.dtype == np.float32, result.normed.shape
    if isinstance(epilogue, RopeKVEpilogue):
        e = epilogue
        width = (e.n_heads + 2 * e.n_kv_heads) * e.head_dim
        assert weight_rows == width, f"W {w_bits.shape}: want [{width}, {in_features}] for q|k|v"
        assert e.head_dim % 2 == 0 and e.inv_freq.shape == (e.head_dim // 2,) and e.inv_freq.dtype == np.float32, (
            e.inv_freq.shape)
        assert e.positions.shape == e.slot_mapping.shape == (num_tokens,), (e.positions.shape, e.slot_mapping.shape)
        assert e.positions.dtype == e.slot_mapping.dtype == np.int32, (e.positions.dtype, e.slot_mapping.dtype)
        k_pool, v_pool = e.kv_pools
        assert k_pool.shape == v_pool.shape and k_pool.shape[2:] == (e.n_kv_heads, e.head_dim), (k_pool.shape,
                                                                                                 v_pool.shape)
        check_kv_pool_dtype(k_pool, v_pool)
        q_shape, kv_shape = (num_tokens, e.n_heads, e.head_dim), (num_tokens, e.n_kv_heads, e.head_dim)
        result.q = device_empty(q_shape, np.float32) if e.q is None else e.q
        result.k = device_empty(kv_shape, np.float32) if e.k is None else e.k
        result.v = device_empty(kv_shape, np.float32) if e.v is None else e.v
        assert result.q.shape == q_shape and result.k.shape == kv_shape and result.v.shape == kv_shape, (
            result.q.shape, result.k.shape, result.v.shape)
        assert out is None, "RopeKVEpilogue stores q, k and v, not out"
        return result
    if isinstance(epilogue, SwiGLUEpilogue):
        assert weight_rows % 2 == 0, f"SwiGLU needs [Wg; Wu] stacked, got {weight_rows} rows"
    out_shape = (num_tokens, weight_rows // 2 if isinstance(epilogue, SwiGLUEpilogue) else weight_rows)
    out_dtype = np.uint16 if isinstance(epilogue, SwiGLUEpilogue) and epilogue.bf16 else np.float32
    result.out = device_empty(out_shape, out_dtype) if out is None else out
    assert result.out.shape == out_shape and result.out.dtype == out_dtype, (result.out.shape, result.out.dtype)
    if isinstance(epilogue, ResidualEpilogue):
        e = epilogue
        result.residual_out = device_empty(out_shape, np.float32) if e.residual_out is None else e.residual_out
        assert e.residual.shape == out_shape == result.residual_out.shape, (e.residual.shape, out_shape,
                                                                            result.residual_out.shape)
    return result
