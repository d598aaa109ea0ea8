"""The one forward pass of a Llama model, as a sequence of kernel launches that can be stepped.

`ModelRunner.forward_stages(batch)` is a generator: it launches the kernels of one stage, yields a
`Stage` (its name, the kernel that ran, its output device array), and goes on when asked for the next.
`generate`, `check-goldens` and the debugger all drive this same generator; `forward` just drains it.

Per layer (HF LlamaDecoderLayer):
    x = rmsnorm(h) ; q, k, v = rope(x Wq), rope(x Wk), x Wv ; a = attention(q, KV cache) ;
    h = h + a Wo ; x = rmsnorm(h) ; h = h + (silu(x Wg) * (x Wu)) Wd

Launched as 9 kernels per layer (prefill, and everything in the simulator): q|k|v as one projection then
one rope kernel that splits it and writes K/V into the paged pool, attention, o_proj, a residual add fused
with the next RMSNorm, gate|up as one projection, silu_mul, down_proj (and the next add_rmsnorm); 8 where the fast
plan computes silu_mul inside gate|up's tensor-core GEMM (KernelPlan.gate), whose norms also write the bf16 copy
q|k|v and gate|up read (KernelPlan.norm_bits; else gemm_tc rounds x to bf16 in a launch of its own). Steps whose
projections gemv_coalesced serves (decode on a GPU) run the fused-GEMV layer instead (`_fused_layers`, 5
kernels, gemv_fused with kernels_numba/epilogues.py's objects): each RMSNorm inside the GEMV that reads it,
RoPE and the K/V write behind q|k|v, the SwiGLU gate behind gate|up, each residual add inside the GEMV that
feeds it; at batch 1 the two add_rmsnorm launches cost ~9 us each, as much as a 12 MB projection.
Every stage keeps its name and output in both; a stage whose output a fused kernel already produced
launches nothing and says which stage computed it. CUDA graphs (tinyvllm/runner/cuda_graphs.py) record this same
generator for decode steps, and up to final_norm for the others (tinyvllm/runner/prefill_graphs.py). Two precisions
run through it (`ModelRunner.precision`): fp32, the reference, and fast, bf16 activations into tensor-core GEMMs
and prefill attention; tinyvllm/runner/kernel_plan.py's table says which kernel each takes where.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from kernels_numba.common import SIMULATOR, begin_layer, cuda
from kernels_numba.embedding import embedding, take_rows
from kernels_numba.epilogues import RMSNormPrologue, ResidualEpilogue, RopeKVEpilogue, SwiGLUEpilogue
from kernels_numba.matmul import gemv_fused, linear_kernel_name
from kernels_numba.attention import (DECODE_GQA_MIN_BLOCKS, DECODE_WARPS_MIN_BLOCKS, paged_attention_decode_gqa,
                                     paged_attention_decode_warps, paged_attention_flash_decode,
                                     paged_attention_per_query, paged_attention_prefill_gqa)
from kernels_numba.rmsnorm import add_rmsnorm, rmsnorm
from kernels_numba.rope import rope_qkv

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.device_weights import DeviceWeights
from tinyvllm.engine.scheduler_output import SchedulerOutput
from tinyvllm.runner.inputs import ForwardBatch, build_inputs
from tinyvllm.runner.kernel_plan import KernelPlan
from tinyvllm.runner.kv_pool import KVPool
from tinyvllm.runner.logprobs import LogitsPlan
from tinyvllm.runner.sampler import always_argmax, sample_step
from tinyvllm.runner.step import InFlight, StepResult

if TYPE_CHECKING:  # they build on ModelRunner
    from tinyvllm.runner.cuda_graphs import DecodeGraphs
    from tinyvllm.runner.prefill_graphs import PrefillGraphs

FUSED = "computed by"  # what a stage's kernel says when an earlier stage's fused kernel produced its output


@dataclass
class DeviceBatch:
    """A ForwardBatch's index arrays on the device (views into one upload), plus what the host needs to
    pick kernels. The CUDA-graph decode path builds one over its own static buffers."""
    token_ids: object
    positions: object
    query_seq: object
    slot_mapping: object
    block_tables: object
    decode_only: bool
    prefill_tiles: object = None   # kernels_numba.attention.PrefillTiles, for steps with prefill chunks
    logits_rows: object = None     # device int32 [R]: which tokens get logits; None: every token
    fed_back: object = None        # device int32 [>= T]: the ids that token ids FED_BACK stand for (see embedding)

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]


def pack_int32(arrays: list[np.ndarray], out: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple]]:
    """Lay int32 arrays end to end in one host array (one host-to-device copy instead of one each);
    returns it and each array's (offset, shape) to cut views from the device copy with `unpack`."""
    sizes = [a.size for a in arrays]
    out = np.empty(sum(sizes), np.int32) if out is None else out
    layout, offset = [], 0
    for a, size in zip(arrays, sizes):
        out[offset:offset + size] = a.reshape(-1)
        layout.append((offset, a.shape))
        offset += size
    return out, layout


def unpack(device_flat, layout: list[tuple]) -> list:
    views = []
    for offset, shape in layout:
        size = int(np.prod(shape))
        views.append(device_flat[offset:offset + size].reshape(shape))
    return views


@dataclass
class Stage:
    """One step of the forward pass: what ran and what it produced (a device array)."""
    name: str              # e.g. "layers.3.q", see docs/architecture.md
    kernel: str            # the launcher that produced it, e.g. "matmul.gemv + rope.rope"
    output: object         # device array
    layer: int | None = None
    seconds: float = 0.0   # host wall time of the launches (synchronised)

    def to_host(self) -> np.ndarray:
        return self.output.copy_to_host()

    @property
    def launched(self) -> bool:
        """False when a fused kernel of an earlier stage already produced this stage's output."""
        return not self.kernel.startswith(f"({FUSED}")


@dataclass
class ModelRunner:
    """Owns the device side of one model: its weights, its paged KV pool and the RoPE frequencies."""
    config: ModelConfig
    weights: DeviceWeights
    kv_pool: KVPool
    inv_freq: np.ndarray  # float32 [head_dim / 2], from kernels_numba.rope.rope_inv_freq
    fuse_norms: bool | None = None  # the fused-GEMV layer: None = where gemv_coalesced serves (fuses_norms)
    precision: str = "fp32"         # "fp32" or "fast" (kernel_plan.resolve_precision)
    # How execute_stages runs a step (the engine sets them): decode-only steps replayed from CUDA graphs, the others
    # up to final_norm; None: eagerly. pipeline_decode: an all-greedy decode step stays in flight (step.InFlight).
    decode_graphs: DecodeGraphs | None = field(default=None, repr=False)
    prefill_graphs: PrefillGraphs | None = field(default=None, repr=False)
    pipeline_decode: bool = False
    last_batch: ForwardBatch | None = field(default=None, init=False, repr=False)  # the latest step's inputs
    _in_flight: InFlight | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.inv_freq = cuda.to_device(self.inv_freq)
        self.attention_scale = np.float32(self.config.head_dim ** -0.5)
        c = self.config
        self.plan = KernelPlan(self.precision, c.head_dim, c.num_attention_heads // c.num_key_value_heads)

    # ---- one scheduled step: inputs, forward pass (eager or a graph replay), sampler ---------------------------
    def execute_stages(self, schedule: SchedulerOutput, all_logits: bool = False, synchronize: bool = True,
                       graphs: bool = False) -> Iterator[Stage]:
        """Run one scheduled step: build its inputs, run the forward pass, sample a token for each sequence that
        samples; a generator of the stages it runs (forward_stages says what `all_logits` and `synchronize` do).

        With `graphs` (and not `all_logits`), a step that a captured graph can run replays it instead, yielding no
        stage: decode-only steps from decode_graphs, the others up to final_norm from prefill_graphs. An all-greedy
        decode step replayed with pipeline_decode stays in flight: it returns the StepResult of the step in flight
        before it (None when there was none), its own tokens come with the next such step or `settle`. Any other
        step returns its own StepResult; a step in flight is settled before it."""
        batch, plan = build_inputs(schedule, self.kv_pool.block_size)
        self.last_batch = batch
        graphs = graphs and not all_logits  # a replay computes only the sampled rows' logits
        decode_graph = graphs and self.decode_graphs is not None and self.decode_graphs.can_run(batch)
        if decode_graph and self.pipeline_decode and always_argmax(schedule):
            earlier, self._in_flight = self._in_flight, InFlight(schedule, self.decode_graphs.launch(batch))
            return None if earlier is None else earlier.result()
        assert self._in_flight is None, "a step in flight is followed only by a pipelined decode step"
        greedy_ids = None  # each row's argmax, when the step computed it already (a decode graph)
        if decode_graph:
            logits, greedy_ids = self.decode_graphs.run(batch)
        elif graphs and self.prefill_graphs is not None and self.prefill_graphs.can_run(batch):
            logits = self.prefill_graphs.run(batch)
        else:
            logits = yield from self.forward_stages(batch, all_logits=all_logits, synchronize=synchronize)
        if all_logits:  # the sampler and logprobs read the logits rows only
            logits = take_rows(logits, cuda.to_device(batch.logits_rows))
        return StepResult(schedule, self.sample(logits, plan, schedule, greedy_ids))

    def sample(self, logits, plan: LogitsPlan, schedule: SchedulerOutput, greedy_ids=None) -> dict[int, int]:
        """seq_id -> new token of each sequence that samples (sampler.sample_step)."""
        return sample_step(logits, plan, schedule, greedy_ids)

    @property
    def in_flight(self) -> SchedulerOutput | None:
        """The schedule of the decode step launched and not read yet (see execute_stages), or None."""
        return None if self._in_flight is None else self._in_flight.schedule

    def settle(self) -> StepResult:
        """Wait for the step in flight and return its tokens; nothing is in flight afterwards."""
        in_flight, self._in_flight = self._in_flight, None
        return in_flight.result()

    def capture_graphs(self, log=None) -> None:
        """Capture every decode and prefill CUDA-graph bucket now (as vLLM does at start), not on first use."""
        log = log or (lambda message: None)
        for name, graphs in (("decode", self.decode_graphs), ("prefill", self.prefill_graphs)):
            if graphs is not None:
                start = time.perf_counter()
                graphs.capture_all()
                what = ("sequences" if name == "decode"
                        else f"tokens (activations {graphs.storage.bytes / 2**20:.0f} MiB)")
                log(f"captured {name} CUDA graphs for {graphs.captured_buckets} {what} in "
                    f"{time.perf_counter() - start:.1f} s")

    # ---- the forward pass ------------------------------------------------------------------------------------
    def forward(self, batch: ForwardBatch):
        """Run the whole forward pass; return the logits device array [len(logits_rows), vocab]."""
        return drain(self.forward_stages(batch, synchronize=False))

    def device_forward(self, batch: DeviceBatch):
        """The whole forward pass over device index arrays, launches left asynchronous; the logits."""
        return drain(self.device_forward_stages(batch, synchronize=False))

    def upload(self, batch: ForwardBatch, all_logits: bool = False) -> DeviceBatch:
        """Copy a batch's index arrays to the device in one transfer."""
        arrays = [batch.token_ids, batch.positions, batch.query_seq, batch.slot_mapping, batch.block_tables]
        every_row = all_logits or batch.samples_every_token
        if not every_row:
            arrays.append(batch.logits_rows)
        flat, layout = pack_int32(arrays)
        views = unpack(cuda.to_device(flat), layout)
        decode_only = batch.is_decode_only
        tiles = None if decode_only else self.plan.prefill_tiles(batch.query_seq, batch.positions)
        return DeviceBatch(*views[:5], decode_only=decode_only, prefill_tiles=tiles,
                           logits_rows=None if every_row else views[5])

    def forward_stages(self, batch: ForwardBatch, all_logits: bool = False,
                       synchronize: bool = True) -> Iterator[Stage]:
        """Yield each stage in order; the generator's return value is the logits device array.

        With `all_logits`, logits are computed for every token (golden checks), else only for
        `batch.logits_rows` (and not at all, returning None, when there are none). With `synchronize`,
        each stage waits for its kernels, so its output is ready and `seconds` is its real time; without,
        launches stay asynchronous (the engine's plain step) and `seconds` is only the launch time.
        """
        wants_logits = all_logits or len(batch.logits_rows) > 0  # chunks ending mid-prompt sample nothing
        logits = yield from self.device_forward_stages(self.upload(batch, all_logits), synchronize, wants_logits)
        return logits

    def device_forward_stages(self, batch: DeviceBatch, synchronize: bool = True,
                              logits: bool = True) -> Iterator[Stage]:
        """forward_stages over index arrays already on the device (what a decode CUDA-graph capture records)."""
        x = yield from self.device_hidden_stages(batch, synchronize)
        if not logits:
            return None
        out = yield from _run_stage("logits", self.plan.projection_name(
            batch.num_tokens if batch.logits_rows is None else batch.logits_rows.shape[0], self.config.hidden_size),
            lambda: self.logits(x, batch.logits_rows), synchronize=synchronize)
        return out

    def logits(self, x, rows=None):
        """The LM head over the final normed hidden states x [T, hidden]: of rows `rows` (device int32), or of every
        row. (A prefill CUDA graph ends at x; this runs eagerly after it, on the step's own rows.)"""
        if rows is not None:
            x = take_rows(x, rows)
        return self.plan.project(x, self.weights.lm_head)

    def device_hidden_stages(self, batch: DeviceBatch, synchronize: bool = True) -> Iterator[Stage]:
        """The stages from embedding to final_norm; returns final_norm's output (what a prefill CUDA-graph
        capture records). Each layer's launches follow a common.begin_layer(i), for an arena that reuses buffers
        by layer (common.LayerArena)."""
        c, w_all = self.config, self.weights
        T, nh, nkv, hd = batch.num_tokens, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = c.rms_norm_eps
        token_ids, positions, slot_mapping = batch.token_ids, batch.positions, batch.slot_mapping
        attend, attention_kernel = self._attention_for(batch)

        def _stage(name, kernel, launch, layer=None, show=None):
            return _run_stage(name, kernel, launch, layer, synchronize, show)

        plan = self.plan
        linear = plan.project  # linear or, in the fast plan, gemm_tc

        def matmul(in_features: int, rows: int = T) -> str:  # which kernel `linear` runs, for the record
            return plan.projection_name(rows, in_features)
        H, I = c.hidden_size, c.intermediate_size

        h = yield from _stage("embedding", "embedding.embedding", lambda: embedding(token_ids, w_all.embed_tokens,
                                                                                  fed_back=batch.fed_back))
        if self.fuses_norms(T):
            x = yield from self._fused_layers(batch, h, attend, attention_kernel, _stage)
            return x
        x = None  # the next normed input, once a fused add_rmsnorm has computed it with the residual
        # x rounded to bf16 by the norm that wrote it, where q|k|v and gate|up read bf16 (plan.norm_bits), else x
        x_in = None
        bits_note = " (+ its bf16 copy)" if plan.norm_bits_shape(T, H) else ""

        def norm(x_, residual, weight):
            """rmsnorm (residual None) or add_rmsnorm, writing x_in beside its float32 output."""
            nonlocal x_in
            bits = plan.norm_bits(T, H)
            if residual is None:
                out = rmsnorm(x_, weight, eps, out_bits=bits)
            else:
                out = add_rmsnorm(x_, residual, weight, eps, out_bits=bits)
            x_in = (out if residual is None else out[1]) if bits is None else bits
            return out
        layers = w_all.layers
        for i, w in enumerate(layers):
            k_pool, v_pool = self.kv_pool.layer(i)
            name = f"layers.{i}.".__add__
            if x is None:
                x = yield from _stage(name("input_norm"), "rmsnorm.rmsnorm" + bits_note,
                                      lambda: norm(h, None, w.input_norm), i)
            else:
                x = yield from _stage(name("input_norm"), f"({FUSED} layers.{i - 1}.output)", lambda: x, i)
            begin_layer(i)  # after layer 0's norm: every layer then takes the same buffers in the same order
            q, k, v = yield from _stage(name("q"), matmul(H) + " (q|k|v in one) + rope.rope_qkv (+ the K/V write)",
                                        lambda: rope_qkv(linear(x_in, w.qkv_proj), positions, self.inv_freq, nh, nkv,
                                                         hd, kv_pools=(k_pool, v_pool), slot_mapping=slot_mapping),
                                        i, show=0)
            k = yield from _stage(name("k"), f"({FUSED} {name('q')})", lambda: k, i)
            v = yield from _stage(name("v"), f"({FUSED} {name('q')})", lambda: v, i)
            a = yield from _stage(name("attn"), attention_kernel,
                                  lambda: attend(q, k_pool, v_pool).reshape(T, nh * hd), i)
            o = yield from _stage(name("o_proj"), matmul(nh * hd), lambda: linear(a, w.o_proj), i)
            h, x = yield from _stage(name("attn_residual"), "rmsnorm.add_rmsnorm" + bits_note, lambda: norm(
                o, h, w.post_norm), i, show=0)
            x = yield from _stage(name("post_norm"), f"({FUSED} {name('attn_residual')})", lambda: x, i)

            m = yield from _stage(name("mlp"), f"{plan.gate_name(T, H, I)} + {matmul(I)}",
                                  lambda: linear(plan.gate(x_in, w.gate_up_proj), w.down_proj), i)
            next_norm = layers[i + 1].input_norm if i + 1 < len(layers) else w_all.norm
            h, x = yield from _stage(name("output"), "rmsnorm.add_rmsnorm" + bits_note, lambda: norm(
                m, h, next_norm), i, show=0)
        x = yield from _stage("final_norm", f"({FUSED} layers.{len(layers) - 1}.output)", lambda: x)
        return x

    def fuses_norms(self, num_tokens: int) -> bool:
        """Whether a step of num_tokens runs the fused-GEMV layer (_fused_layers): when gemv_coalesced serves
        its projections (decode on a GPU) and the fast plan does not send them to the tensor cores, unless
        `fuse_norms` says otherwise."""
        if self.fuse_norms is not None:
            return self.fuse_norms
        c = self.config
        if self.plan.uses_tensor_cores(num_tokens, c.hidden_size):  # past the fast plan's GEMV crossover
            return False
        return all(linear_kernel_name(num_tokens, n_in) == "gemv_coalesced"
                   for n_in in (c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size))

    def _fused_layers(self, batch: DeviceBatch, h, attend, attention_kernel: str, _stage):
        """The layers with every RMSNorm fused in front of the projection that reads it (RMSNormPrologue), RoPE
        and the K/V write behind q|k|v (RopeKVEpilogue), the SwiGLU gate behind gate|up (SwiGLUEpilogue), and
        every residual add behind the projection that feeds it (ResidualEpilogue), all gemv_fused launches:
        5 launches a layer, four fewer than
        the add_rmsnorm path, and no kernel that only moves activations. Same stages, same outputs (up to
        float32 rounding: the norm's scale multiplies the dot products instead of the inputs)."""
        c, w_all = self.config, self.weights
        T, nh, nkv, hd = batch.num_tokens, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = c.rms_norm_eps
        positions, slot_mapping = batch.positions, batch.slot_mapping
        for i, w in enumerate(w_all.layers):
            begin_layer(i)
            k_pool, v_pool = self.kv_pool.layer(i)
            name = f"layers.{i}.".__add__
            rope_kv = RopeKVEpilogue(positions, self.inv_freq, nh, nkv, hd, (k_pool, v_pool), slot_mapping)
            qkv = yield from _stage(name("input_norm"), "matmul.gemv_fused (input_norm fused in front of q|k|v in "
                                    "one, RoPE and the K/V write behind)", lambda: gemv_fused(
                                        h, w.qkv_proj, RMSNormPrologue(w.input_norm, eps), rope_kv), i, show="normed")
            q = yield from _stage(name("q"), f"({FUSED} {name('input_norm')})", lambda: qkv.q, i)
            k = yield from _stage(name("k"), f"({FUSED} {name('input_norm')})", lambda: qkv.k, i)
            v = yield from _stage(name("v"), f"({FUSED} {name('input_norm')})", lambda: qkv.v, i)
            a = yield from _stage(name("attn"), attention_kernel,
                                  lambda: attend(q, k_pool, v_pool).reshape(T, nh * hd), i)
            o = yield from _stage(name("o_proj"), "matmul.gemv_fused (+ the residual add)",
                                  lambda: gemv_fused(a, w.o_proj, epilogue=ResidualEpilogue(h)), i, show="out")
            h = yield from _stage(name("attn_residual"), f"({FUSED} {name('o_proj')})", lambda: o.residual_out, i)
            gate_up = yield from _stage(name("post_norm"), "matmul.gemv_fused (post_norm fused in front of gate|up "
                                        "in one, silu(gate) * up behind)", lambda: gemv_fused(
                                            h, w.gate_up_proj, RMSNormPrologue(w.post_norm, eps), SwiGLUEpilogue()),
                                        i, show="normed")
            mlp = yield from _stage(name("mlp"), f"matmul.gemv_fused (+ the residual add; silu(gate) * up from "
                                    f"{name('post_norm')})", lambda: gemv_fused(
                                        gate_up.out, w.down_proj, epilogue=ResidualEpilogue(h)), i, show="out")
            h = mlp.residual_out
            h = yield from _stage(name("output"), f"({FUSED} {name('mlp')})", lambda: h, i)
        x = yield from _stage("final_norm", "rmsnorm.rmsnorm", lambda: rmsnorm(h, w_all.norm, eps))
        return x

    def _attention_for(self, batch: DeviceBatch):
        """Pick the attention kernel for this step: (q, k_pool, v_pool) -> out, and its name.

        In the simulator (where syncthreads are slow) one thread per (query, head) serves every step. On a
        GPU, decode-only steps get a block per (query, KV head) pair that serves the group's query heads from
        one shared copy of each K/V chunk; the smallest ones (under DECODE_GQA_MIN_BLOCKS pairs: batches up
        to 7 on Llama-3.2-1B) also a block per key partition (flash_decode), merged by the pair's last block
        to finish, so that a batch-1 step keeps more than 8 blocks busy; the largest ones (from DECODE_WARPS_MIN_BLOCKS
        pairs: batch 64) run decode_warps, whose warps each keep their own softmax over their own keys (no block-wide
        barrier per chunk: twice decode_gqa's speed on the H200). Steps with prefill chunks use the kernel
        where a block owns a query tile for all query heads of one KV head and walks key tiles through
        shared memory; its query tiles are built once for all layers (DeviceBatch.prefill_tiles). The fast
        plan runs such steps on tensor cores (prefill_tc), in the simulator too.
        """
        scale = self.attention_scale
        block_tables, query_seq, positions = batch.block_tables, batch.query_seq, batch.positions
        if not batch.decode_only:
            tc = self.plan.prefill_attention(block_tables, query_seq, positions, scale, batch.prefill_tiles)
            if tc is not None:
                return tc
        if SIMULATOR:
            def per_query(q, k_pool, v_pool):
                return paged_attention_per_query(q, k_pool, v_pool, block_tables, query_seq, positions, scale)
            return per_query, "attention.per_query.paged_attention_per_query"
        pairs = query_seq.shape[0] * self.config.num_key_value_heads
        if batch.decode_only and pairs >= DECODE_WARPS_MIN_BLOCKS:
            def decode_warps(q, k_pool, v_pool):
                return paged_attention_decode_warps(q, k_pool, v_pool, block_tables, query_seq, positions, scale)
            return decode_warps, "attention.decode_warps.paged_attention_decode_warps"
        if batch.decode_only and pairs >= DECODE_GQA_MIN_BLOCKS:
            def decode_gqa(q, k_pool, v_pool):
                return paged_attention_decode_gqa(q, k_pool, v_pool, block_tables, query_seq, positions, scale)
            return decode_gqa, "attention.decode_gqa.paged_attention_decode_gqa"
        if batch.decode_only:
            def flash_decode(q, k_pool, v_pool):
                return paged_attention_flash_decode(q, k_pool, v_pool, block_tables, query_seq, positions, scale)
            return flash_decode, "attention.decode_gqa.paged_attention_flash_decode"
        tiles = batch.prefill_tiles

        def tiled(q, k_pool, v_pool):
            return paged_attention_prefill_gqa(q, k_pool, v_pool, block_tables, query_seq, positions, scale,
                                               tiles=tiles)
        return tiled, "attention.prefill_gqa.paged_attention_prefill_gqa"


def drain(stages: Iterator):
    """Run a stage generator to the end; its return value."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value


def _run_stage(name: str, kernel: str, launch: Callable[[], object], layer: int | None = None,
               synchronize: bool = True, show: int | None = None):
    """Run one stage's launches (and wait for them), yield the Stage, hand its output back to the caller.
    A launch that returns several arrays (a fused kernel) shows its `show`-th (a tuple's index, or a field of
    epilogues.FusedOutputs) as the stage's output."""
    start = time.perf_counter()
    output = launch()
    if synchronize:
        cuda.synchronize()
    shown = output if show is None else getattr(output, show) if isinstance(show, str) else output[show]
    yield Stage(name, kernel, shown, layer, time.perf_counter() - start)
    return output
