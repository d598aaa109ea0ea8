"""ModelRunner: the device side of one model, and the runner of one scheduled step.

    result = runner.execute_stages(schedule)   # a generator of Stages; returns the StepResult

A step: build its inputs from the SchedulerOutput (inputs.py), run the forward pass over the weights and the paged
KV pool (forward.py, with the kernels kernel_plan.py picks), or replay a captured CUDA graph of it (cuda_graphs.py,
prefill_graphs.py), then sample each sampling row's next token (sampler.py). `generate`, `check-goldens` and the
debugger all run this same path; the debugger and the golden check stop after every stage.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from kernels_numba.common import SIMULATOR, cuda
from kernels_numba.embedding import take_rows
from kernels_numba.wgmma import wgmma_available

from tinyvllm.engine.config import EngineConfig
from tinyvllm.engine.scheduler_output import SchedulerOutput
from tinyvllm.errors import TinyVLLMError
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.device_weights import DeviceWeights
from tinyvllm.model.loader import LoadedModel
from tinyvllm.runner.cuda_graphs import DecodeGraphs, graphs_enabled
from tinyvllm.runner.forward import ForwardPass
from tinyvllm.runner.inputs import ForwardBatch, build_inputs, upload
from tinyvllm.runner.kernel_plan import KernelPlan, resolve_precision
from tinyvllm.runner.kv_pool import KVPool, default_num_blocks, resolve_kv_cache_dtype
from tinyvllm.runner.logprobs import LogitsPlan
from tinyvllm.runner.prefill_graphs import PrefillGraphs, activation_bytes_per_token
from tinyvllm.runner.sampler import always_argmax, sample_step
from tinyvllm.runner.stages import Stage, drain
from tinyvllm.runner.step import InFlight, StepResult


@dataclass
class ModelRunner:
    """Owns the device side of one model (its weights, its paged KV pool, the RoPE frequencies, the forward pass and
    its CUDA graphs) and runs the steps the scheduler hands it."""
    config: ModelConfig
    weights: DeviceWeights
    kv_pool: KVPool
    inv_freq: np.ndarray  # float32 [head_dim / 2], from kernels_numba.rope.rope_inv_freq
    precision: str = "fp32"         # "fp32" or "fast" (kernel_plan.resolve_precision)
    batch_invariant: bool = True    # KernelPlan.batch_invariant
    # How execute_stages runs a step (use_graphs sets them): decode-only steps replayed from CUDA graphs, the others
    # up to final_norm; None: eagerly. pipeline_decode: an all-greedy decode step stays in flight (step.InFlight).
    decode_graphs: DecodeGraphs | None = field(default=None, repr=False)
    prefill_graphs: PrefillGraphs | None = field(default=None, repr=False)
    pipeline_decode: bool = False
    last_batch: ForwardBatch | None = field(default=None, init=False, repr=False)  # the latest step's inputs
    _in_flight: InFlight | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.inv_freq = cuda.to_device(self.inv_freq)
        c = self.config
        plan = KernelPlan(self.precision, c.head_dim, c.num_attention_heads // c.num_key_value_heads,
                          batch_invariant=self.batch_invariant, wgmma=wgmma_available(),
                          bf16_kv=self.kv_pool.dtype == "bfloat16")
        self.forward_pass = ForwardPass(c, self.weights, self.kv_pool, self.inv_freq, plan)

    @classmethod
    def for_engine(cls, model: LoadedModel, config: EngineConfig, max_model_len: int, log=None) -> "ModelRunner":
        """The runner of an engine: the precision and KV cache dtype resolved for the model's weights, a KV pool of
        config.num_blocks (default: what the configuration can use, within gpu_memory_fraction of the free memory,
        minus what the prefill graphs keep allocated), and the CUDA graphs the config asks for."""
        log = log or (lambda message: None)
        c = model.config
        precision = resolve_precision(config.precision, model.weights.embed_tokens.dtype)
        kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, precision)
        decode_graphs, prefill_graphs = graphs_enabled(config.cuda_graphs, config.prefill_graphs)
        graph_bytes = activation_bytes_per_token(c) * config.max_num_batched_tokens if prefill_graphs else 0
        num_blocks, why = config.num_blocks, "as configured"
        if num_blocks is None:
            num_blocks, why = default_num_blocks(c, config.block_size, config.max_num_seqs, max_model_len,
                                                 config.enable_prefix_caching, config.gpu_memory_fraction,
                                                 kv_cache_dtype, reserved_bytes=graph_bytes)
        if num_blocks < 1:
            raise TinyVLLMError("no GPU memory left for even one KV block: lower --block-size or free memory")
        kv_pool = KVPool(c, num_blocks, config.block_size, kv_cache_dtype)
        runner = cls(c, model.weights, kv_pool, model.inv_freq, precision=precision,
                     batch_invariant=config.invariant_for(precision, SIMULATOR))
        runner.use_graphs(decode_graphs, prefill_graphs, config.max_num_seqs, config.max_num_batched_tokens,
                          math.ceil(max_model_len / config.block_size), config.pipeline_decode, log=log)
        log(f"KV pool: {num_blocks} blocks x {config.block_size} tokens, {kv_cache_dtype} "
            f"({kv_pool.bytes / 2**20:.1f} MiB: {why}), max model len {max_model_len}, precision {precision}, "
            f"batch-invariant {'on' if runner.forward_pass.plan.batch_invariant else 'off'}")
        return runner

    def use_graphs(self, decode: bool, prefill: bool, max_num_seqs: int, max_num_batched_tokens: int,
                   max_blocks_per_seq: int, pipeline_decode: bool, log=None) -> None:
        """Replay decode-only steps (decode) and steps with prefill chunks (prefill) from CUDA graphs, one per batch
        bucket, captured on first use (capture_graphs: all at once)."""
        if decode:
            self.decode_graphs = DecodeGraphs(self.forward_pass, max_num_seqs, max_blocks_per_seq, log=log)
            self.pipeline_decode = pipeline_decode
        if prefill:
            self.prefill_graphs = PrefillGraphs(self.forward_pass, max_num_batched_tokens, max_num_seqs,
                                                max_blocks_per_seq, log=log)

    @property
    def plan(self) -> KernelPlan:
        """Which kernel runs each stage (the forward pass's)."""
        return self.forward_pass.plan

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
            logits, greedy_ids = self.prefill_graphs.run(batch)
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

    def forward_stages(self, batch: ForwardBatch, all_logits: bool = False,
                       synchronize: bool = True) -> Iterator[Stage]:
        """Yield each stage in order; the generator's return value is the logits device array.

        With `all_logits`, logits are computed for every token (golden checks), else only for
        `batch.logits_rows` (and not at all, returning None, when there are none). With `synchronize`,
        each stage waits for its kernels, so its output is ready and `seconds` is its real time; without,
        launches stay asynchronous (the engine's plain step) and `seconds` is only the launch time.
        """
        wants_logits = all_logits or len(batch.logits_rows) > 0  # chunks ending mid-prompt sample nothing
        device_batch = upload(batch, self.plan, all_logits)
        logits = yield from self.forward_pass.device_forward_stages(device_batch, synchronize, wants_logits)
        return logits
