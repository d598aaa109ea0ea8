"""Every kernel choice of a forward step, in one place: per precision, per device or simulator, per batch shape.

    fp32   float32 activations on CUDA cores: the reference path (goldens, check-goldens, the debugger's default;
           every stage within 1e-4 of HF float32)
    fast   activations rounded to bf16 into tensor-core mma (kernels_numba/gemm_tc.py, attention/prefill_tc.py),
           float32 accumulation, float32 stage outputs; weights are bf16 already
    auto   fast on a GPU with bf16 weights, else fp32 (the simulator; a float32 or float16 checkpoint)

A KernelPlan answers each choice with a `Kernel`: the name a Stage records and the launch itself, one object, so
what the record says is what ran. tinyvllm/runner/forward.py walks the layers once and asks the plan per stage;
only these choices differ (the batch-dependent plans', --no-batch-invariant; the invariant plans below the table):

| step / stage                                 | fp32                             | fast                           |
|----------------------------------------------|----------------------------------|--------------------------------|
| decode steps of <= 32 tokens (GPU)           | fused-GEMV layer (gemv_fused)    | the same up to                 |
| (fused_gemv_layer)                           |                                  | FAST_GEMV_MAX_TOKENS (2),      |
|                                              |                                  | gemm_tc past it                |
| q|k|v, o_proj, gate|up, the LM head's rows   | gemv (<= 8 rows, odd K),         | gemm_tc (x rounded to bf16 by  |
| (projection)                                 | gemv_coalesced (<= 32 rows),     | gemm_tc's to_bf16_rows) from   |
|                                              | gemm_blocked beyond              | tc_min_rows(); below: as fp32; |
|                                              |                                  | on Hopper gemm_wgmma from      |
|                                              |                                  | WGMMA_MIN_ROWS (same bits)     |
| silu(gate) * up, then down_proj (gate)       | silu_mul_gate_up, projection     | in gate|up's gemm_tc (Swi-     |
|                                              |                                  | GLUEpilogue, bf16 out: fuses_  |
|                                              |                                  | swiglu; else silu_mul_gate_up  |
|                                              |                                  | (bf16)), then gemm_tc          |
| RMSNorms, residual adds, RoPE + K/V write    | rmsnorm, add_rmsnorm, rope_qkv   | the same kernels               |
|                                              |                                  | (each norm also writing its    |
|                                              |                                  | output as bf16: norm_bits)     |
| attention, steps with prefill chunks         | prefill_gqa                      | prefill_tc; on Hopper over a   |
|                                              |                                  | bf16 pool prefill_wgmma (same  |
|                                              |                                  | tiles and bits)                |
| attention, decode-only steps                 | decode_warps (batch >= 64), decode_gqa, flash_decode_warps: both |

In the simulator (KernelPlan.simulator; a simulated lane is a Python thread and every syncthreads costs
milliseconds a block): the CUDA-core projections are all gemv (prefill in chunks of matmul.MAX_GEMV_TOKENS), so
the fused-GEMV layer never runs; the fp32 plan's attention is per_query for every step; the fast plan takes the
tensor cores from 1 row (2 without batch invariance, below) with one narrow tile (SIMULATOR_TILE, no split-K) and
prefill_tc's narrowest block, for every step (decode-only steps: per_query without batch invariance).

Batch invariance (KernelPlan.batch_invariant; EngineConfig.batch_invariant, --batch-invariant / --no-batch-invariant):
a request's tokens and logprobs must not depend on what else shares its steps (docs/batch-invariance.md lists every
choice above that breaks it, and why). An invariant plan sends every row of every step to the same kernels, each
reducing in an order fixed by the row and the model's shapes, never by the step's row count or mix:
- projections: fast, gemm_tc from 1 row (not the GEMVs: x unrounded) in one pass (no split-K: split_for decides by
  rows); fp32 on a GPU, gemm_blocked in one pass for every row count (each output sums K from 0 up in one thread;
  not gemv_coalesced's strided K and tree); no fused-GEMV layer (its norm and residual round otherwise);
- attention: decode-only steps run the prefill kernel (prefill_tc, or prefill_gqa in fp32 on a GPU), each query a
  tile of its own; both walk a query's keys from position 0 in fixed key tiles (a tile past a query's position only
  masks: the max stays, the rescale is exactly 1, the sums add exact zeros), so chunk boundaries, tiles and
  neighbours change nothing. gemm_tc's tile may follow the rows: each output walks K in ascending 16-wide mma steps
  whatever the tile. In the simulator gemv and per_query already reduce per row in a fixed order.
EngineConfig's default is invariant everywhere but the fast precision on a GPU, where the GEMVs, split-K and
flash-decoding it gives up cost decode speed (measured: docs/batch-invariance.md);
check-goldens, eval, debug and trace turn it on there too (engine_config_from_args' `reference`).

Without batch invariance, at decode batches (up to a few hundred rows) gemm_tc splits K where its blocks would not
fill the SMs (tc_splits: o_proj and down_proj of the 1B model at 64-256 rows); prefill GEMMs run in one pass.
tc_min_rows() is the GEMV crossover: the fused GEMVs serve decode steps up to FAST_GEMV_MAX_TOKENS rows on a GPU (at most
matmul.MAX_COALESCED_TOKENS, where fp32 hands over to gemm_blocked), the tensor cores the rest.

Why no ResidualEpilogue behind o_proj and down_proj: an RMSNorm reads the sum right after, over whole rows, so
it is a launch either way; gemm_tc + epilogue + rmsnorm moves the same 20 bytes a value as gemm_tc + add_rmsnorm
(out written; o and h read, h and x written). It would pay once a norm could follow inside the next GEMM.
The GEMMs' bf16 inputs: the normed x and the attention output are stage outputs the debugger and the golden check
read in float32, so a float32 copy exists anyway. The normed x reaches q|k|v and gate|up as a bf16 copy the norm
writes beside it (rmsnorm / add_rmsnorm's out_bits, norm_bits: 2 bytes a value, no launch); the attention output
goes through gemm_tc's to_bf16_rows (6 bytes a value and a launch, small against the GEMM's FLOPs). The bits are
the same either way (the same f32_to_bf16 of the same float32 values). The widest input, the gate's output
(T x I), is written as bf16 directly: it is no stage output. Where gate|up runs on gemm_tc in one pass
(fuses_swiglu: every prefill, and decode batches whose gate|up tile takes no split-K) the gate|up GEMM computes it
in its epilogue (gemm_tc's SwiGLUEpilogue(bf16=True), bit for bit the pair below), so the float32 gate|up
[T, 2 I] is never written nor read back; else gemm_tc writes gate|up and silu_mul_gate_up(bf16=True) reads it.
The fused-GEMV decode layer keeps its own float32 gate (gemv_fused's SwiGLUEpilogue).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kernels_numba import gemm_tc as _gemm_tc
from kernels_numba import matmul as _matmul
from kernels_numba.activation import silu_mul_gate_up
from kernels_numba.attention import (DECODE_GQA_MIN_BLOCKS, DECODE_WARPS_MIN_BLOCKS, build_prefill_tiles, gqa_shape,
                                     paged_attention_decode_gqa, paged_attention_decode_warps,
                                     paged_attention_flash_decode_warps, paged_attention_per_query,
                                     paged_attention_prefill_gqa)
from kernels_numba.attention import prefill_tc as _prefill_tc
from kernels_numba.attention.prefill_tc import paged_attention_prefill_tc, tc_queries_per_tile
from kernels_numba.attention.prefill_wgmma import paged_attention_prefill_wgmma, wgmma_attention_supported
from kernels_numba.common import SIMULATOR, device_empty
from kernels_numba.epilogues import SwiGLUEpilogue
from kernels_numba.gemm_tc import CHUNK, TileShape, gemm_tc, gemm_tc_fused
from kernels_numba.gemm_wgmma import SIMULATOR_TILE as SIMULATOR_WGMMA_TILE
from kernels_numba.gemm_wgmma import WgmmaTile, gemm_wgmma_fused
from kernels_numba.gemm_wgmma import tile_for as wgmma_tile_for

from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.choices import PRECISIONS, check_precision

# The simulator's gemm_tc tile: one warp of 16 x 32 (a simulated lane is a Python thread: the fewer, the faster).
SIMULATOR_TILE = TileShape(16, 32, 32, 1, 1)
SIMULATOR_ATTENTION_KEYS = 16  # prefill_tc's key tile in the simulator (16 keys: one mma k step of P @ V)
# An invariant plan's gemm_tc tile for steps of up to 16 rows (decode): without split-K the output's columns are a
# small step's only parallelism, so one warp a block and 16 features each (o_proj and down_proj of the 1B model: 128
# blocks), K in slices of 128 over 8 stages (32 KB of weights in flight a block). Two W rows a copy round, as the
# SwiGLU epilogue needs.
INVARIANT_DECODE_TILE = TileShape(16, 16, 128, 1, 1, 8)

# The fast plan's GEMV crossover: decode steps of up to this many tokens keep the fused-GEMV layer (it reads each
# weight once and is memory-bound at a handful of tokens), larger ones go to gemm_tc, which overtakes the GEMVs far
# sooner than gemm_blocked does (fp32's crossover, matmul.MAX_COALESCED_TOKENS). A decode graph runs its bucket's
# rows: batches 1 and 2 stay on the GEMVs. Measured: docs/bench-h200.md. TINYVLLM_FAST_GEMV_MAX_TOKENS overrides it.
FAST_GEMV_MAX_TOKENS = int(os.environ.get("TINYVLLM_FAST_GEMV_MAX_TOKENS", 2))

# Steps of at least this many rows take their tensor-core projections to wgmma (gemm_wgmma) where the GPU has it
# (KernelPlan.wgmma: Hopper), below to gemm_tc's mma.sync: both add each k16 step's products in K order, so a row
# gets the same bits from either and the switch keeps batch invariance (tests/test_wgmma.py). Measured:
# docs/wgmma.md.
WGMMA_MIN_ROWS = 128


def resolve_precision(requested: str, weight_dtype, simulator: bool = SIMULATOR) -> str:
    """"fp32" or "fast" for a requested precision (one of PRECISIONS) and the model's device weight dtype; a
    one-line error for a precision that cannot run."""
    check_precision(requested)
    bf16_weights = np.dtype(weight_dtype) == np.uint16
    if requested == "auto":
        return "fast" if bf16_weights and not simulator else "fp32"
    if requested == "fast" and not bf16_weights:
        raise TinyVLLMError("--precision fast needs bf16 weights (the tensor cores read them as stored); this "
                            "checkpoint's are float32 (F32 or F16 tensors): use --precision fp32")
    return requested


def _gemm_blocked_one_pass(x, w):
    """gemm_blocked without split-K, for every row count: each output sums K from 0 up in one thread, whatever the
    step's rows (gemm_splits decides the split by rows; a split fixed per weight shape would cost prefill a
    workspace of splits x its output)."""
    return _matmul.gemm_blocked(x, w, splits=1)


@dataclass(frozen=True)
class Kernel:
    """One choice of the plan: the name a Stage records (module.launcher, with what it fuses) and its launch."""
    name: str
    launch: Callable

    def __call__(self, *args):
        return self.launch(*args)


@dataclass(frozen=True)
class KernelPlan:
    """The kernel choices of one model at one precision, on a GPU or in the simulator (see the module's table).
    Asking for a choice launches nothing: `simulator=False` asks the GPU's choices anywhere."""
    precision: str        # "fp32" or "fast" (resolved)
    head_dim: int
    group: int            # n_heads // n_kv_heads
    simulator: bool = SIMULATOR
    batch_invariant: bool = True  # the same kernels, reducing in the same order, for every row count and mix
    wgmma: bool = False   # the GPU runs wgmma (kernels_numba.wgmma.wgmma_available): large steps' GEMMs on it
    bf16_kv: bool = False  # the KV pool holds bf16 bits (prefill_wgmma copies its rows as they are)

    def __post_init__(self):
        assert self.precision in PRECISIONS and self.precision != "auto", self.precision

    @property
    def fast(self) -> bool:
        return self.precision == "fast"

    # ---- the tensor cores' shapes: the simulator's are the narrowest ----
    def tc_tile(self, rows: int, out_features: int) -> TileShape:
        """gemm_tc's tile for an output of rows x out_features: gemm_tc.tile_for's choice on a GPU, or where invariant
        INVARIANT_DECODE_TILE up to its rows (a tile may follow the rows: each output walks K in ascending 16-wide mma
        steps whatever the tile)."""
        if self.simulator:
            return SIMULATOR_TILE
        if self.batch_invariant and rows <= INVARIANT_DECODE_TILE.block_m:
            return INVARIANT_DECODE_TILE
        return _gemm_tc.tile_for(rows, out_features)

    def tc_splits(self, rows: int, out_features: int, in_features: int, tile: TileShape) -> int:
        """gemm_tc's split-K: gemm_tc.split_for's choice on a GPU (decode batches whose blocks do not fill the SMs),
        1 in the simulator (one block at a time: splitting only adds a launch) and where invariant (split_for
        decides by rows: a decode row would sum its K in other partials than the same row in a prefill)."""
        if self.simulator or self.batch_invariant:
            return 1
        return _gemm_tc.split_for(rows, out_features, in_features, tile)

    def uses_wgmma(self, rows: int) -> bool:
        """Whether a tensor-core projection of `rows` rows runs on gemm_wgmma: from WGMMA_MIN_ROWS where the plan has
        wgmma."""
        return self.wgmma and rows >= WGMMA_MIN_ROWS

    def wgmma_tile(self, rows: int, out_features: int) -> WgmmaTile | None:
        """gemm_wgmma's tile for a tensor-core projection of rows x out_features, or None for gemm_tc: wgmma from
        WGMMA_MIN_ROWS where the plan has it, its tile gemm_wgmma.tile_for's (the tile may follow the rows: every
        tile adds an output's k16 steps in K order)."""
        if not self.uses_wgmma(rows):
            return None
        return SIMULATOR_WGMMA_TILE if self.simulator else wgmma_tile_for(rows, out_features)

    def tc_min_rows(self) -> int:
        """The fewest rows a projection takes to the tensor cores: 1 where invariant (a lone row rounded to bf16 as in
        any batch); else 2 in the simulator and past the fast plan's GEMV crossover on a GPU."""
        if self.batch_invariant:
            return 1
        if self.simulator:
            return 2
        return min(FAST_GEMV_MAX_TOKENS, _matmul.MAX_COALESCED_TOKENS) + 1

    def tc_attention_shape(self) -> tuple[int, int]:
        """(warps, keys per tile) of prefill_tc: its defaults on a GPU (read at each call, as the sweeps set them)."""
        return (1, SIMULATOR_ATTENTION_KEYS) if self.simulator else (_prefill_tc.TC_WARPS, _prefill_tc.TC_KEY_TILE)

    # ---- projections ----
    def uses_tensor_cores(self, rows: int, in_features: int) -> bool:
        return self.fast and rows >= self.tc_min_rows() and in_features % CHUNK == 0

    def projection(self, rows: int, in_features: int) -> Kernel:
        """y = x @ W.T for x [rows, in_features]: gemm_tc (x float32 or uint16 bf16 bits) where the tensor cores take
        it, else matmul.linear_kernel's choice (gemv, gemv_coalesced or gemm_blocked)."""
        if self.uses_tensor_cores(rows, in_features):
            if self.uses_wgmma(rows):
                return Kernel("gemm_wgmma.gemm_wgmma", lambda x, w: gemm_wgmma_fused(
                    x, w, tile=self.wgmma_tile(x.shape[0], w.shape[0])).out)

            def tensor_cores(x, w):
                tile = self.tc_tile(x.shape[0], w.shape[0])
                return gemm_tc(x, w, tile=tile, splits=self.tc_splits(x.shape[0], w.shape[0], x.shape[1], tile))
            return Kernel("gemm_tc.gemm_tc", tensor_cores)
        if self.batch_invariant and not self.simulator:
            return Kernel("matmul.gemm_blocked (one pass)", _gemm_blocked_one_pass)
        name, launch = _matmul.linear_kernel(rows, in_features, self.simulator)
        return Kernel("matmul." + name, lambda x, w: launch(x, w))

    def project(self, x, w):
        """y = x @ W.T with the projection kernel for x's shape."""
        return self.projection(x.shape[0], x.shape[1])(x, w)

    def norm_bits_shape(self, rows: int, hidden: int) -> tuple[int, int] | None:
        """The shape of the bf16 copy an RMSNorm writes beside its output where the projections that read it (q|k|v,
        gate|up) run on tensor cores (rmsnorm's out_bits: gemm_tc then reads it as it is), else None."""
        return (rows, hidden) if self.uses_tensor_cores(rows, hidden) else None

    def norm_bits(self, rows: int, hidden: int):
        """A uint16 buffer of norm_bits_shape for that copy, or None."""
        shape = self.norm_bits_shape(rows, hidden)
        return None if shape is None else device_empty(shape, np.uint16)

    # ---- the MLP's gate: silu(x Wg) * (x Wu) ----
    def fuses_swiglu(self, rows: int, hidden: int, intermediate: int) -> bool:
        """Whether the gate runs inside the gate|up GEMM (gemm_tc with SwiGLUEpilogue(bf16=True), no float32 gate|up):
        when gate|up goes to gemm_tc in one pass (the gate needs whole sums, not split-K's partials) and down_proj
        reads bf16 on tensor cores."""
        if not (self.uses_tensor_cores(rows, hidden) and self.uses_tensor_cores(rows, intermediate)):
            return False
        width = 2 * intermediate
        return self.uses_wgmma(rows) or self.tc_splits(rows, width, hidden, self.tc_tile(rows, width)) == 1

    def swiglu(self, rows: int, intermediate: int) -> Kernel:
        """silu(gate) * up of the gate|up projection's output, for down_proj: bf16 bits when down_proj runs on tensor
        cores, else float32."""
        bf16 = self.uses_tensor_cores(rows, intermediate)
        return Kernel("activation.silu_mul_gate_up" + (" (bf16)" if bf16 else ""),
                      lambda gate_up: silu_mul_gate_up(gate_up, bf16=bf16))

    def gate(self, rows: int, hidden: int, intermediate: int) -> Kernel:
        """(x, W = [Wg; Wu]) -> silu(x Wg) * (x Wu) for down_proj: one gemm_tc launch writing bf16 where fuses_swiglu,
        else the gate|up projection then swiglu."""
        if self.fuses_swiglu(rows, hidden, intermediate):
            if self.uses_wgmma(rows):
                def fused_wgmma(x, w_gate_up):
                    return gemm_wgmma_fused(x, w_gate_up, SwiGLUEpilogue(bf16=True),
                                            tile=self.wgmma_tile(x.shape[0], w_gate_up.shape[0])).out
                return Kernel("gemm_wgmma.gemm_wgmma (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)",
                              fused_wgmma)

            def fused(x, w_gate_up):
                tile = self.tc_tile(x.shape[0], w_gate_up.shape[0])
                return gemm_tc_fused(x, w_gate_up, SwiGLUEpilogue(bf16=True), tile=tile).out
            return Kernel("gemm_tc.gemm_tc (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)", fused)
        gate_up, swiglu = self.projection(rows, hidden), self.swiglu(rows, intermediate)
        return Kernel(f"{gate_up.name} (gate|up in one) + {swiglu.name}", lambda x, w: swiglu(gate_up(x, w)))

    # ---- which layer ----
    def fused_gemv_layer(self, rows: int, in_features: tuple[int, ...]) -> bool:
        """Whether a step of `rows` tokens runs the fused-GEMV layer (forward.FusedGemvLayer): when gemv_coalesced
        serves every projection of the layer (inputs of in_features: hidden, n_heads * head_dim, intermediate),
        which the fast plan has not sent to the tensor cores."""
        if self.batch_invariant or self.uses_tensor_cores(rows, in_features[0]):  # invariant: projection's kernels only
            return False
        return all(_matmul.linear_kernel(rows, k, self.simulator)[0] == "gemv_coalesced" for k in in_features)

    # ---- attention ----
    @property
    def tc_attention(self) -> bool:
        return self.fast and self.head_dim % 16 == 0 and self.group <= 16 * self.tc_attention_shape()[0]

    @property
    def wgmma_attention(self) -> bool:
        """Whether the tiled attention runs on wgmma (prefill_wgmma) rather than mma.sync (prefill_tc): on Hopper,
        over a bf16 pool, at a shape it takes. The same query tiles, arithmetic and bits, for every step: the choice
        depends on neither rows nor mix."""
        warps = self.tc_attention_shape()[0]
        return (self.tc_attention and self.wgmma and self.bf16_kv and warps % 4 == 0
                and wgmma_attention_supported(self.head_dim, self.group, warps // 4))

    def prefill_tile_queries(self) -> int | None:
        """Queries per tile of the prefill attention (prefill_tc's or prefill_gqa's); None when it takes no tiles (the
        simulator's per_query)."""
        if self.tc_attention:
            return tc_queries_per_tile(self.group, self.tc_attention_shape()[0])
        return None if self.simulator else gqa_shape(self.head_dim, self.group)[0]

    @property
    def tiled_decode(self) -> bool:
        """Whether decode-only steps run the prefill attention (prefill_tc, or prefill_gqa on a GPU in fp32), each
        query a tile of its own: where invariant, so that a query takes one kernel whatever its neighbours."""
        return self.batch_invariant and self.prefill_tile_queries() is not None

    def tiled_attention(self, decode_only: bool) -> bool:
        """Whether a step's attention is prefill_tc: every step with prefill chunks in the fast plan, and its
        decode-only steps too where tiled_decode."""
        return self.tc_attention and (not decode_only or self.tiled_decode)

    def prefill_tiles(self, query_seq, positions):
        """The query tiles a step with prefill chunks needs (built once, host side, for all layers); None when its
        attention builds none."""
        queries = self.prefill_tile_queries()
        return None if queries is None else build_prefill_tiles(query_seq, positions, queries)

    def step_tiles(self, decode_only: bool, query_seq, positions):
        """The query tiles a step's attention reads (prefill_tiles), or None for a decode-only step whose kernel
        takes none."""
        if decode_only and not self.tiled_decode:
            return None
        return self.prefill_tiles(query_seq, positions)

    def attention(self, batch, kv_heads: int, scale) -> Kernel:
        """The attention of a step (a DeviceBatch): (q, k_pool, v_pool) -> out.

        Steps with prefill chunks: prefill_tc in the fast plan (prefill_wgmma where wgmma_attention); else a block
        owns a query tile for all query heads of one KV head and walks key tiles through shared memory (prefill_gqa),
        its query tiles built once for all layers (DeviceBatch.prefill_tiles). Decode-only steps: a block per (query, KV head) pair serves the group's
        query heads from one shared copy of each K/V chunk (decode_gqa); the smallest ones (under
        DECODE_GQA_MIN_BLOCKS pairs: batches up to 7 on Llama-3.2-1B) decode_warps' blocks split further, a block per
        key partition (flash_decode_warps), so that a batch-1 step keeps more than 8 blocks busy; the largest (from
        DECODE_WARPS_MIN_BLOCKS pairs: batch 64) decode_warps, whose warps each keep their own softmax over their
        own keys (no block-wide barrier per chunk). In the simulator, where syncthreads are slow, one thread per
        (query, head) serves every step the tensor cores do not (per_query); where invariant the fast plan's
        decode-only steps run prefill_tc as its prefill steps do (a query tile of one query)."""
        indices = (batch.block_tables, batch.query_seq, batch.positions, scale)

        def kernel(name: str, launcher, **options) -> Kernel:
            return Kernel("attention." + name,
                          lambda q, k_pool, v_pool: launcher(q, k_pool, v_pool, *indices, **options))
        if self.tiled_attention(batch.decode_only):
            warps, keys = self.tc_attention_shape()
            if self.wgmma_attention:
                return kernel("prefill_wgmma.paged_attention_prefill_wgmma", paged_attention_prefill_wgmma,
                              tiles=batch.prefill_tiles, warpgroups=warps // 4, keys_per_tile=keys)
            return kernel("prefill_tc.paged_attention_prefill_tc", paged_attention_prefill_tc,
                          tiles=batch.prefill_tiles, warps=warps, keys_per_tile=keys)
        if self.simulator:
            return kernel("per_query.paged_attention_per_query", paged_attention_per_query)
        if not batch.decode_only or self.tiled_decode:
            return kernel("prefill_gqa.paged_attention_prefill_gqa", paged_attention_prefill_gqa,
                          tiles=batch.prefill_tiles)
        pairs = batch.query_seq.shape[0] * kv_heads
        if pairs >= DECODE_WARPS_MIN_BLOCKS:
            return kernel("decode_warps.paged_attention_decode_warps", paged_attention_decode_warps)
        if pairs >= DECODE_GQA_MIN_BLOCKS:
            return kernel("decode_gqa.paged_attention_decode_gqa", paged_attention_decode_gqa)
        return kernel("decode_warps.paged_attention_flash_decode_warps", paged_attention_flash_decode_warps)
