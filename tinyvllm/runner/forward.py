"""The one forward pass of a Llama model, as a sequence of kernel launches that can be stepped.

`ForwardPass.hidden_stages(batch)` is a generator: it launches the kernels of one stage, yields a `Stage` (its name,
the kernel that ran, its output device array), and goes on when asked for the next. `generate`, `check-goldens`, the
debugger and the CUDA graphs' captures all drive this same generator (through ModelRunner).

Per layer (HF LlamaDecoderLayer):
    x = rmsnorm(h) ; q, k, v = rope(x Wq), rope(x Wk), x Wv ; a = attention(q, KV cache) ;
    h = h + a Wo ; x = rmsnorm(h) ; h = h + (silu(x Wg) * (x Wu)) Wd

One loop walks the layers and their stages (LAYER_STAGES, docs/architecture.md "Stage names"); what each stage
launches comes from one of two layer kinds, their kernels from the KernelPlan (tinyvllm/runner/kernel_plan.py):

AddRMSNormLayer, 9 kernels a layer (prefill, and everything in the simulator): q|k|v as one projection then one
rope kernel that splits it and writes K/V into the paged pool, attention, o_proj, a residual add fused with the next
RMSNorm, gate|up as one projection, silu_mul, down_proj (and the next add_rmsnorm); 8 where the fast plan computes
silu_mul inside gate|up's tensor-core GEMM (KernelPlan.gate), whose norms also write the bf16 copy q|k|v and gate|up
read (KernelPlan.norm_bits; else gemm_tc rounds x to bf16 in a launch of its own).

FusedGemvLayer, 5 kernels a layer, for steps whose projections gemv_coalesced serves (decode on a GPU,
KernelPlan.fused_gemv_layer): gemv_fused with kernels_numba/epilogues.py's objects: each RMSNorm inside the GEMV that
reads it, RoPE and the K/V write behind q|k|v, the SwiGLU gate behind gate|up, each residual add inside the GEMV that
feeds it. At a handful of tokens a kernel that only moves activations costs about what a projection does (measured:
docs/bench-h200.md), so the layer launches none.

Every stage keeps its name and output in both; a stage whose output a fused kernel already produced launches nothing
and says which stage computed it (stages.computed_by).

Between a stage's yield and the next stage's launch the generator is paused, so a caller may write into the yielded
output (the debugger's value edits): the stages after it read the written values, except where a kernel has already
read that output or keeps its own copy of it; `ForwardPass.edit_blocker` names those stages and why. Nothing here
checks or pays for edits: generate and serve never stop between stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from kernels_numba.common import begin_layer
from kernels_numba.embedding import embedding, take_rows
from kernels_numba.epilogues import RMSNormPrologue, ResidualEpilogue, RopeKVEpilogue, SwiGLUEpilogue
from kernels_numba.matmul import gemv_fused
from kernels_numba.rmsnorm import add_rmsnorm, rmsnorm
from kernels_numba.rope import rope_qkv

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.device_weights import DeviceWeights
from tinyvllm.runner.inputs import DeviceBatch
from tinyvllm.runner.kernel_plan import Kernel, KernelPlan
from tinyvllm.runner.kv_pool import KVPool
from tinyvllm.runner.stages import Stage, computed_by, drain, run_stage


LAYER_STAGES = ("input_norm", "q", "k", "v", "attn", "o_proj", "attn_residual", "post_norm", "mlp", "output")


def stage_names(num_layers: int) -> list[str]:
    """Every stage of one forward pass, in the order they run (docs/architecture.md)."""
    return (["embedding"] + [f"layers.{i}.{s}" for i in range(num_layers) for s in LAYER_STAGES]
            + ["final_norm", "logits"])


@dataclass(frozen=True)
class Step:
    """What one stage does: the kernel string its Stage records, its launches, and which of several outputs it
    shows (run_stage's `show`)."""
    kernel: str
    launch: Callable[[], object]
    show: int | str | None = None


def already(stage: str, output) -> Step:
    """A stage that launches nothing: `stage`'s fused kernel produced its output."""
    return Step(computed_by(stage), lambda: output)


@dataclass
class ForwardPass:
    """The forward pass over one model's device weights and KV pool, with the kernels its plan picks."""
    config: ModelConfig
    weights: DeviceWeights
    kv_pool: KVPool
    inv_freq: object       # device float32 [head_dim / 2]
    plan: KernelPlan
    fuse_norms: bool | None = None  # force the fused-GEMV layer on or off; None: where the plan says (fuses_norms)

    def __post_init__(self):
        self.attention_scale = np.float32(self.config.head_dim ** -0.5)

    def projection_inputs(self) -> tuple[int, int, int]:
        """The in_features of the layer's projections: q|k|v and gate|up, o_proj, down_proj."""
        c = self.config
        return c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size

    def fuses_norms(self, num_tokens: int) -> bool:
        """Whether a step of num_tokens runs the fused-GEMV layer: where the plan says
        (KernelPlan.fused_gemv_layer), unless `fuse_norms` says otherwise."""
        if self.fuse_norms is not None:
            return self.fuse_norms
        return self.plan.fused_gemv_layer(num_tokens, self.projection_inputs())

    def edit_blocker(self, stage: str, num_tokens: int) -> str | None:
        """Why a value written into `stage`'s output (between its yield and the next launch, in a step of num_tokens)
        would not reach every stage after it, or None when it would (the module docstring)."""
        kind = stage.rsplit(".", 1)[-1]
        layer = FusedGemvLayer if self.fuses_norms(num_tokens) else AddRMSNormLayer
        why = layer.edit_blockers.get(kind)
        if why is None and layer is AddRMSNormLayer and kind in ("input_norm", "post_norm") and \
                self.plan.norm_bits_shape(num_tokens, self.config.hidden_size) is not None:
            why = ("in the fast precision the projections after it read the bf16 copy the norm wrote beside it "
                   "(norm_bits), not this float32 output")
        return why

    def device_forward(self, batch: DeviceBatch):
        """The whole forward pass over device index arrays, launches left asynchronous; the logits."""
        return drain(self.device_forward_stages(batch, synchronize=False))

    def device_forward_stages(self, batch: DeviceBatch, synchronize: bool = True,
                              logits: bool = True) -> Iterator[Stage]:
        """Every stage, embedding to logits (what a decode CUDA-graph capture records); returns the logits, or None
        without `logits`."""
        x = yield from self.device_hidden_stages(batch, synchronize)
        if not logits:
            return None
        out = yield from self.logits_stage(x, batch.logits_rows, synchronize)
        return out

    def device_hidden_stages(self, batch: DeviceBatch, synchronize: bool = True) -> Iterator[Stage]:
        """The stages from embedding to final_norm (what a prefill CUDA-graph capture records); returns final_norm's
        output."""
        x = yield from self.hidden_stages(batch, self.fuses_norms(batch.num_tokens), synchronize)
        return x

    def logits(self, x, rows=None):
        """The LM head over the final normed hidden states x [T, hidden]: of rows `rows` (device int32), or of every
        row."""
        return self._logits_step(x, rows).launch()

    def logits_stage(self, x, rows=None, synchronize: bool = True) -> Iterator[Stage]:
        """The `logits` stage: the LM head as `logits` computes it; returns the logits."""
        step = self._logits_step(x, rows)
        logits = yield from run_stage("logits", step.kernel, step.launch, synchronize=synchronize)
        return logits

    def _logits_step(self, x, rows) -> Step:
        head = self.plan.projection(x.shape[0] if rows is None else rows.shape[0], self.config.hidden_size)
        return Step(head.name, lambda: head(x if rows is None else take_rows(x, rows), self.weights.lm_head))

    def hidden_stages(self, batch: DeviceBatch, fused_gemv: bool, synchronize: bool = True) -> Iterator[Stage]:
        """The stages from embedding to final_norm, each layer's from `fused_gemv`'s kind; returns final_norm's
        output. Each layer's buffers begin with a common.begin_layer(i), for an arena that reuses them by layer
        (common.LayerArena): at the layer kind's first_buffered_stage, where every layer's launches start alike."""
        def run(name: str, step: Step, layer: int | None = None):
            return run_stage(name, step.kernel, step.launch, layer, synchronize, step.show)

        c = self.config
        attention = self.plan.attention(batch, c.num_key_value_heads, self.attention_scale)
        h = yield from run("embedding", Step("embedding.embedding", lambda: embedding(
            batch.token_ids, self.weights.embed_tokens, fed_back=batch.fed_back)))
        layer = (FusedGemvLayer if fused_gemv else AddRMSNormLayer)(self, batch, attention, h)
        for i, w in enumerate(self.weights.layers):
            layer.start(i, w)
            for stage in LAYER_STAGES:
                if stage == layer.first_buffered_stage:
                    begin_layer(i)
                layer.outputs[stage] = yield from run(layer.name(stage), getattr(layer, stage)(), i)
        x = yield from run("final_norm", layer.final_norm())
        return x


class _Layer:
    """What both layer kinds share: the step's shapes and launch arguments, the residual stream h carried from
    layer to layer, and this layer's stage outputs (as launched: a fused kernel's whole result)."""
    first_buffered_stage: str

    def __init__(self, forward: ForwardPass, batch: DeviceBatch, attention: Kernel, h):
        c = forward.config
        self.forward, self.plan, self.batch, self.attention = forward, forward.plan, batch, attention
        self.T, self.H, self.I = batch.num_tokens, c.hidden_size, c.intermediate_size
        self.heads, self.kv_heads, self.head_dim, self.eps = (c.num_attention_heads, c.num_key_value_heads,
                                                              c.head_dim, c.rms_norm_eps)
        self.h = h
        self.i, self.w, self.outputs = None, None, {}

    def start(self, i: int, w) -> None:
        self.i, self.w, self.outputs = i, w, {}
        self.k_pool, self.v_pool = self.forward.kv_pool.layer(i)

    def name(self, stage: str) -> str:
        return f"layers.{self.i}.{stage}"

    def attend(self, q) -> Step:
        T, width = self.T, self.heads * self.head_dim
        return Step(self.attention.name, lambda: self.attention(q, self.k_pool, self.v_pool).reshape(T, width))

    def next_norm_weight(self):
        """The RMSNorm weight that follows this layer: the next layer's input norm, or the final norm."""
        layers = self.forward.weights.layers
        return layers[self.i + 1].input_norm if self.i + 1 < len(layers) else self.forward.weights.norm


class AddRMSNormLayer(_Layer):
    """Projections (gemv, gemm_blocked or gemm_tc), rope_qkv, and each residual add fused with the RMSNorm after
    it (add_rmsnorm); the normed x reaches the next layer's input_norm that way."""
    first_buffered_stage = "q"  # layer 0's rmsnorm runs before: the other layers' x comes from add_rmsnorm
    edit_blockers = {   # ForwardPass.edit_blocker: the outputs a kernel has read already, or copied
        "k": "rope_qkv has written K into the paged KV cache, which attention reads: edit q or attn instead",
        "v": "rope_qkv has written V into the paged KV cache, which attention reads: edit q or attn instead",
        "attn_residual": "its add_rmsnorm has normed this residual into post_norm in the same kernel: edit "
                         "post_norm or mlp instead",
        "output": "its add_rmsnorm has normed this residual into the next input_norm in the same kernel: edit that "
                  "input_norm (or final_norm) instead",
    }

    def __init__(self, *args):
        super().__init__(*args)
        self.x = None     # the next normed input, once an add_rmsnorm has computed it with the residual
        self.x_in = None  # x as q|k|v and gate|up read it: its bf16 copy where the plan gives one, else x
        self.bits_note = " (+ its bf16 copy)" if self.plan.norm_bits_shape(self.T, self.H) else ""

    def norm(self, x, residual, weight):
        """rmsnorm (residual None) or add_rmsnorm, writing x_in beside its float32 output."""
        bits = self.plan.norm_bits(self.T, self.H)
        if residual is None:
            out = rmsnorm(x, weight, self.eps, out_bits=bits)
        else:
            out = add_rmsnorm(x, residual, weight, self.eps, out_bits=bits)
        self.x_in = (out if residual is None else out[1]) if bits is None else bits
        return out

    def input_norm(self) -> Step:
        if self.x is None:
            return Step("rmsnorm.rmsnorm" + self.bits_note, lambda: self.norm(self.h, None, self.w.input_norm))
        return already(f"layers.{self.i - 1}.output", self.x)

    def q(self) -> Step:
        qkv = self.plan.projection(self.T, self.H)
        batch, w = self.batch, self.w
        return Step(qkv.name + " (q|k|v in one) + rope.rope_qkv (+ the K/V write)", lambda: rope_qkv(
            qkv(self.x_in, w.qkv_proj), batch.positions, self.forward.inv_freq, self.heads, self.kv_heads,
            self.head_dim, kv_pools=(self.k_pool, self.v_pool), slot_mapping=batch.slot_mapping), show=0)

    def k(self) -> Step:
        return already(self.name("q"), self.outputs["q"][1])

    def v(self) -> Step:
        return already(self.name("q"), self.outputs["q"][2])

    def attn(self) -> Step:
        return self.attend(self.outputs["q"][0])

    def o_proj(self) -> Step:
        o_proj = self.plan.projection(self.T, self.heads * self.head_dim)
        return Step(o_proj.name, lambda: o_proj(self.outputs["attn"], self.w.o_proj))

    def attn_residual(self) -> Step:
        return Step("rmsnorm.add_rmsnorm" + self.bits_note, self._add_norm("o_proj", self.w.post_norm), show=0)

    def post_norm(self) -> Step:
        return already(self.name("attn_residual"), self.x)

    def mlp(self) -> Step:
        gate, down = self.plan.gate(self.T, self.H, self.I), self.plan.projection(self.T, self.I)
        w = self.w
        return Step(f"{gate.name} + {down.name}", lambda: down(gate(self.x_in, w.gate_up_proj), w.down_proj))

    def output(self) -> Step:
        return Step("rmsnorm.add_rmsnorm" + self.bits_note, self._add_norm("mlp", self.next_norm_weight()), show=0)

    def final_norm(self) -> Step:
        return already(f"layers.{self.i}.output", self.x)

    def _add_norm(self, stage: str, weight):
        """h, x = h + (stage's output), rmsnorm of it: the launch of an add_rmsnorm stage."""
        def launch():
            self.h, self.x = self.norm(self.outputs[stage], self.h, weight)
            return self.h, self.x
        return launch


class FusedGemvLayer(_Layer):
    """Every RMSNorm fused in front of the projection that reads it (RMSNormPrologue), RoPE and the K/V write behind
    q|k|v (RopeKVEpilogue), the SwiGLU gate behind gate|up (SwiGLUEpilogue), and every residual add behind the
    projection that feeds it (ResidualEpilogue), all gemv_fused launches: no kernel that only moves activations. Same
    stages, same outputs (up to float32 rounding: the norm's scale multiplies the dot products instead of the
    inputs)."""
    first_buffered_stage = "input_norm"
    edit_blockers = {   # ForwardPass.edit_blocker: what gemv_fused has consumed inside the kernel that made it
        "input_norm": "gemv_fused normed it inside q|k|v's projection; nothing reads it afterwards: edit q instead",
        "k": "gemv_fused has written K into the paged KV cache, which attention reads: edit q or attn instead",
        "v": "gemv_fused has written V into the paged KV cache, which attention reads: edit q or attn instead",
        "o_proj": "gemv_fused has added it into the residual (attn_residual) in the same kernel: edit "
                  "attn_residual instead",
        "post_norm": "gemv_fused normed it inside gate|up's projection; nothing reads it afterwards: edit "
                     "attn_residual instead",
        "mlp": "gemv_fused has added it into the residual (output) in the same kernel: edit output instead",
    }

    def input_norm(self) -> Step:
        b, f, w = self.batch, self.forward, self.w
        rope_kv = RopeKVEpilogue(b.positions, f.inv_freq, self.heads, self.kv_heads, self.head_dim,
                                 (self.k_pool, self.v_pool), b.slot_mapping)
        return Step("matmul.gemv_fused (input_norm fused in front of q|k|v in one, RoPE and the K/V write behind)",
                    lambda: gemv_fused(self.h, w.qkv_proj, RMSNormPrologue(w.input_norm, self.eps), rope_kv),
                    show="normed")

    def q(self) -> Step:
        return already(self.name("input_norm"), self.outputs["input_norm"].q)

    def k(self) -> Step:
        return already(self.name("input_norm"), self.outputs["input_norm"].k)

    def v(self) -> Step:
        return already(self.name("input_norm"), self.outputs["input_norm"].v)

    def attn(self) -> Step:
        return self.attend(self.outputs["q"])

    def o_proj(self) -> Step:
        h = self.h
        return Step("matmul.gemv_fused (+ the residual add)", lambda: gemv_fused(
            self.outputs["attn"], self.w.o_proj, epilogue=ResidualEpilogue(h)), show="out")

    def attn_residual(self) -> Step:
        self.h = self.outputs["o_proj"].residual_out
        return already(self.name("o_proj"), self.h)

    def post_norm(self) -> Step:
        h, w = self.h, self.w
        return Step("matmul.gemv_fused (post_norm fused in front of gate|up in one, silu(gate) * up behind)",
                    lambda: gemv_fused(h, w.gate_up_proj, RMSNormPrologue(w.post_norm, self.eps), SwiGLUEpilogue()),
                    show="normed")

    def mlp(self) -> Step:
        h = self.h
        return Step(f"matmul.gemv_fused (+ the residual add; silu(gate) * up from {self.name('post_norm')})",
                    lambda: gemv_fused(self.outputs["post_norm"].out, self.w.down_proj,
                                       epilogue=ResidualEpilogue(h)), show="out")

    def output(self) -> Step:
        self.h = self.outputs["mlp"].residual_out
        return already(self.name("mlp"), self.h)

    def final_norm(self) -> Step:
        return Step("rmsnorm.rmsnorm", lambda: rmsnorm(self.h, self.forward.weights.norm, self.eps))
