"""Which kernel runs each step of the forward pass, per precision (EngineConfig.precision).

    fp32   float32 activations on CUDA cores: the reference path (goldens, check-goldens, the debugger's default;
           every stage within 1e-4 of HF float32)
    fast   activations rounded to bf16 into tensor-core mma (kernels_numba/gemm_tc.py, attention/prefill_tc.py),
           float32 accumulation, float32 stage outputs; weights are bf16 already
    auto   fast on a GPU with bf16 weights, else fp32 (the simulator; a float32 or float16 checkpoint)

ModelRunner.forward_stages is the same generator with the same stages either way; only these choices differ:

| step / stage                                 | fp32                             | fast                           |
|----------------------------------------------|----------------------------------|--------------------------------|
| decode steps of <= 32 tokens (GPU)           | fused-GEMV layer (gemv_fused)    | the same up to                 |
|                                              |                                  | FAST_GEMV_MAX_TOKENS (2),      |
|                                              |                                  | gemm_tc past it                |
| q|k|v, o_proj, gate|up, the LM head's rows   | linear: gemm_blocked             | gemm_tc (x rounded to bf16 by  |
| (projections of >= tc_min_rows() rows)       | (simulator: gemv)                | gemm_tc's to_bf16_rows)        |
| silu(gate) * up, then down_proj              | silu_mul_gate_up, linear         | in gate|up's gemm_tc (Swi-     |
|                                              |                                  | GLUEpilogue, bf16 out: fuses_  |
|                                              |                                  | swiglu; else silu_mul_gate_up  |
|                                              |                                  | (bf16)), then gemm_tc          |
| RMSNorms, residual adds, RoPE + K/V write    | rmsnorm, add_rmsnorm, rope_qkv   | the same kernels               |
|                                              |                                  | (each norm also writing its    |
|                                              |                                  | output as bf16: norm_bits)     |
| attention, steps with prefill chunks         | prefill_gqa (simulator: per_query) | prefill_tc                   |
| attention, decode-only steps                 | decode_warps (batch >= 64), decode_gqa, flash_decode (simulator: |
|                                              | per_query): both precisions                                      |

At decode batches (up to a few hundred rows) gemm_tc splits K where its blocks would not fill the SMs (tc_splits:
o_proj and down_proj of the 1B model at 64-256 rows); prefill GEMMs run in one pass.
tc_min_rows() is the GEMV crossover: the fused GEMVs serve decode steps up to FAST_GEMV_MAX_TOKENS rows on a GPU
(at most matmul.MAX_COALESCED_TOKENS, where fp32 hands over to gemm_blocked), the tensor cores the rest; in the
simulator every projection of 2 or more rows takes them (so the demo model's prefill runs the fast kernels there,
with small tiles: tc_tile).

Why no ResidualEpilogue behind o_proj and down_proj: an RMSNorm reads the sum right after, over whole rows, so
it is a launch either way; gemm_tc + epilogue + rmsnorm moves the same 20 bytes a value as gemm_tc + add_rmsnorm
(out written; o and h read, h and x written). It would pay once a norm could follow inside the next GEMM.
The GEMMs' bf16 inputs: the normed x and the attention output are stage outputs the debugger and the golden check
read in float32, so a float32 copy exists anyway. The normed x reaches q|k|v and gate|up as a bf16 copy the norm
writes beside it (rmsnorm / add_rmsnorm's out_bits, norm_bits: 2 bytes a value, no launch); the attention output
goes through gemm_tc's to_bf16_rows (6 bytes a value and a launch: at K 2048, 12 kB a token, 3 ns at 4.3 TB/s,
against 8 MFLOP, 28 ns at ~300 TFLOP/s: an estimate, not measured). The bits are the same either way (the same
f32_to_bf16 of the same float32 values). The widest input, the gate's output (T x I), is written
as bf16 directly: it is no stage output. Where gate|up runs on gemm_tc in one pass (fuses_swiglu: every prefill, and
decode batches whose gate|up tile takes no split-K) the gate|up GEMM computes it in its epilogue (gemm_tc's
SwiGLUEpilogue(bf16=True), bit for bit the pair below), so the float32 gate|up [T, 2 I] is never written nor read
back (at 4,096 tokens of Llama-3.2-1B ~470 MB a layer); else gemm_tc writes gate|up and silu_mul_gate_up(bf16=True)
reads it. The fused-GEMV decode layer keeps its own float32 gate (gemv_fused's SwiGLUEpilogue).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kernels_numba import gemm_tc as _gemm_tc
from kernels_numba import matmul as _matmul
from kernels_numba.activation import silu_mul_gate_up
from kernels_numba.attention import build_prefill_tiles, gqa_shape
from kernels_numba.attention import prefill_tc as _prefill_tc
from kernels_numba.attention.prefill_tc import paged_attention_prefill_tc, tc_queries_per_tile
from kernels_numba.common import SIMULATOR, device_empty
from kernels_numba.epilogues import SwiGLUEpilogue
from kernels_numba.gemm_tc import CHUNK, TileShape, gemm_tc, gemm_tc_fused

from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.choices import check_precision

# The simulator's gemm_tc tile: one warp of 16 x 32 (a simulated lane is a Python thread; on the demo model's
# layer 1.8 s against 4.1 s for gemm_tc's test tile TileShape(32, 32, 32, 1, 2)).
SIMULATOR_TILE = TileShape(16, 32, 32, 1, 1)
SIMULATOR_ATTENTION_KEYS = 16  # prefill_tc's key tile in the simulator (16 keys: one mma k step of P @ V)


def resolve_precision(requested: str, weight_dtype) -> str:
    """"fp32" or "fast" for a requested precision and the model's device weight dtype; a one-line error for a
    precision that cannot run."""
    check_precision(requested)
    bf16_weights = np.dtype(weight_dtype) == np.uint16
    if requested == "auto":
        return "fast" if bf16_weights and not SIMULATOR else "fp32"
    if requested == "fast" and not bf16_weights:
        raise TinyVLLMError("--precision fast needs bf16 weights (the tensor cores read them as stored); this "
                            "checkpoint's are float32 (F32 or F16 tensors): use --precision fp32")
    return requested


def tc_tile(rows: int, out_features: int) -> TileShape:
    """gemm_tc's tile for an output of rows x out_features: gemm_tc.tile_for's choice on a GPU (from the H200 sweep),
    SIMULATOR_TILE in the simulator."""
    return SIMULATOR_TILE if SIMULATOR else _gemm_tc.tile_for(rows, out_features)


# The fast plan's GEMV crossover: decode steps of up to this many tokens keep the fused-GEMV layer (it reads each
# weight once and is memory-bound at a handful of tokens), larger ones go to gemm_tc. The float32 crossover
# (matmul.MAX_COALESCED_TOKENS, 32) was set against gemm_blocked on CUDA cores; gemm_tc overtakes the GEMV far
# sooner: decode-step CUDA graphs on the H200 (scripts/profile_decode.py, 512-token contexts, Llama-3.2-1B shape;
# docs/bench/h200-round8-profile-decode-gemv-crossover*.log), GPU ms per step, GEMVs vs gemm_tc:
#   batch 2: 1.32 vs 3.36 | 4: 3.84 vs 3.43 | 8: 6.17 vs 3.75 | 16: 10.15 vs 3.81 | 32: 18.61 vs 4.12
# (a graph runs its bucket's rows: batches 1 and 2 stay on the GEMVs). TINYVLLM_FAST_GEMV_MAX_TOKENS overrides it.
FAST_GEMV_MAX_TOKENS = int(os.environ.get("TINYVLLM_FAST_GEMV_MAX_TOKENS", 2))


def tc_splits(rows: int, out_features: int, in_features: int, tile: TileShape) -> int:
    """gemm_tc's split-K for that GEMM: gemm_tc.split_for's choice on a GPU (decode batches whose blocks do not fill
    the SMs), 1 in the simulator (one block at a time: splitting only adds a launch)."""
    return 1 if SIMULATOR else _gemm_tc.split_for(rows, out_features, in_features, tile)


def tc_min_rows() -> int:
    """The fewest rows a projection takes to the tensor cores: past the fast plan's GEMV crossover on a GPU."""
    return 2 if SIMULATOR else min(FAST_GEMV_MAX_TOKENS, _matmul.MAX_COALESCED_TOKENS) + 1


def tc_attention_shape() -> tuple[int, int]:
    """(warps, keys per tile) of prefill_tc: its defaults on a GPU (read at each call, as the sweeps set them), the
    narrowest block in the simulator."""
    return (1, SIMULATOR_ATTENTION_KEYS) if SIMULATOR else (_prefill_tc.TC_WARPS, _prefill_tc.TC_KEY_TILE)


@dataclass(frozen=True)
class KernelPlan:
    """The per-precision kernel choices of one model (see the module's table)."""
    precision: str        # "fp32" or "fast" (resolved)
    head_dim: int
    group: int            # n_heads // n_kv_heads

    def __post_init__(self):
        assert self.precision in ("fp32", "fast"), self.precision

    @property
    def fast(self) -> bool:
        return self.precision == "fast"

    # ---- projections ----
    def uses_tensor_cores(self, rows: int, in_features: int) -> bool:
        return self.fast and rows >= tc_min_rows() and in_features % CHUNK == 0

    def norm_bits_shape(self, rows: int, hidden: int) -> tuple[int, int] | None:
        """The shape of the bf16 copy an RMSNorm writes beside its output where the projections that read it (q|k|v,
        gate|up) run on tensor cores (rmsnorm's out_bits: gemm_tc then reads it as it is), else None."""
        return (rows, hidden) if self.uses_tensor_cores(rows, hidden) else None

    def norm_bits(self, rows: int, hidden: int):
        """A uint16 buffer of norm_bits_shape for that copy, or None."""
        shape = self.norm_bits_shape(rows, hidden)
        return None if shape is None else device_empty(shape, np.uint16)

    def projection_name(self, rows: int, in_features: int) -> str:
        if self.uses_tensor_cores(rows, in_features):
            return "gemm_tc.gemm_tc"
        return "matmul." + _matmul.linear_kernel_name(rows, in_features)

    def project(self, x, w):
        """y = x @ W.T with the kernel projection_name names (x float32 or, for gemm_tc, uint16 bf16 bits)."""
        if self.uses_tensor_cores(x.shape[0], x.shape[1]):
            tile = tc_tile(x.shape[0], w.shape[0])
            return gemm_tc(x, w, tile=tile, splits=tc_splits(x.shape[0], w.shape[0], x.shape[1], tile))
        return _matmul.linear(x, w)

    def fuses_swiglu(self, rows: int, hidden: int, intermediate: int) -> bool:
        """Whether the gate runs inside the gate|up GEMM (gemm_tc with SwiGLUEpilogue(bf16=True), no float32 gate|up):
        when gate|up goes to gemm_tc in one pass (the gate needs whole sums, not split-K's partials) and down_proj
        reads bf16 on tensor cores."""
        if not (self.uses_tensor_cores(rows, hidden) and self.uses_tensor_cores(rows, intermediate)):
            return False
        width = 2 * intermediate
        return tc_splits(rows, width, hidden, tc_tile(rows, width)) == 1

    def gate_name(self, rows: int, hidden: int, intermediate: int) -> str:
        """The kernels `gate` runs, for the record."""
        if self.fuses_swiglu(rows, hidden, intermediate):
            return "gemm_tc.gemm_tc (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)"
        return f"{self.projection_name(rows, hidden)} (gate|up in one) + {self.swiglu_name(rows, intermediate)}"

    def gate(self, x, w_gate_up):
        """silu(x Wg) * (x Wu) for down_proj, W = [Wg; Wu]: one gemm_tc launch writing bf16 where fuses_swiglu, else
        the gate|up projection then swiglu."""
        rows, hidden, intermediate = x.shape[0], x.shape[1], w_gate_up.shape[0] // 2
        if self.fuses_swiglu(rows, hidden, intermediate):
            tile = tc_tile(rows, w_gate_up.shape[0])
            return gemm_tc_fused(x, w_gate_up, SwiGLUEpilogue(bf16=True), tile=tile).out
        return self.swiglu(self.project(x, w_gate_up))

    def swiglu_name(self, rows: int, intermediate: int) -> str:
        return ("activation.silu_mul_gate_up (bf16)" if self.uses_tensor_cores(rows, intermediate)
                else "activation.silu_mul_gate_up")

    def swiglu(self, gate_up):
        """silu(gate) * up of the gate|up projection's output, for down_proj: bf16 bits when down_proj runs on tensor
        cores, else float32."""
        rows, intermediate = gate_up.shape[0], gate_up.shape[1] // 2
        return silu_mul_gate_up(gate_up, bf16=self.uses_tensor_cores(rows, intermediate))

    # ---- prefill attention ----
    @property
    def tc_attention(self) -> bool:
        return self.fast and self.head_dim % 16 == 0 and self.group <= 16 * tc_attention_shape()[0]

    def prefill_tile_queries(self) -> int | None:
        """Queries per tile of the prefill attention (prefill_tc's or prefill_gqa's); None when it takes no tiles (the
        simulator's per_query)."""
        if self.tc_attention:
            return tc_queries_per_tile(self.group, tc_attention_shape()[0])
        return None if SIMULATOR else gqa_shape(self.head_dim, self.group)[0]

    def prefill_tiles(self, query_seq, positions):
        """The query tiles a step with prefill chunks needs (built once, host side, for all layers); None when its
        attention builds none."""
        queries = self.prefill_tile_queries()
        return None if queries is None else build_prefill_tiles(query_seq, positions, queries)

    def prefill_attention(self, block_tables, query_seq, positions, scale, tiles):
        """(q, k_pool, v_pool) -> out on tensor cores, and its name; None when this plan has none."""
        if not self.tc_attention:
            return None
        warps, keys = tc_attention_shape()

        def tc(q, k_pool, v_pool):
            return paged_attention_prefill_tc(q, k_pool, v_pool, block_tables, query_seq, positions, scale,
                                              tiles=tiles, warps=warps, keys_per_tile=keys)
        return tc, "attention.prefill_tc.paged_attention_prefill_tc"
