"""LLMEngine: requests in, tokens out, one scheduler step at a time (vLLM's shape, nano-vllm's size).

    add_request(prompt, params) -> request_id        step() -> [RequestOutput, ...]

Each step: the Scheduler picks which sequences run and how many tokens each computes (decodes and
prefill chunks together, within a token budget, preempting when KV blocks run out); the engine turns
that into a ForwardBatch (token ids, positions, slot mapping, block tables); the ModelRunner runs the
forward pass; the sampling kernel picks one token per finished prefill or decode; the engine applies
stop rules and reports what changed. `step_stages()` is the same step as a generator that yields after
every stage of the forward pass: the debugger and the golden checker drive it.
"""
from __future__ import annotations

import functools
import itertools
import operator
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kernels_numba.common import SIMULATOR, cdiv, cuda
from kernels_numba.embedding import FED_BACK, take_rows
from kernels_numba.sampling import argmax, sample, suppress_tokens

from tinyvllm.engine.block_manager import BlockManager
from tinyvllm.runner.cuda_graphs import DecodeGraphs, PendingTokens
from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.choices import check_kv_cache_dtype, check_precision
from tinyvllm.runner.kernel_plan import resolve_precision
from tinyvllm.runner.kv_pool import KVPool, default_num_blocks, resolve_kv_cache_dtype
from tinyvllm.runner.logprobs import LogitsPlan, TokenLogprobs, record_logprobs
from tinyvllm.engine.metrics import MetricsCollector, RequestMetrics
from tinyvllm.log import log_to_stderr
from tinyvllm.model.loader import LoadedModel, load_model
from tinyvllm.runner.model_runner import ForwardBatch, ModelRunner
from tinyvllm.runner.stages import Stage, drain
from tinyvllm.runner.prefill_graphs import PrefillGraphs, activation_bytes_per_token
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from tinyvllm.engine.sequence import Sequence

DEFAULT_MAX_MODEL_LEN = 4096


class InvalidPrompt(TinyVLLMError, ValueError):
    """A prompt the engine cannot run; the message says why."""


@dataclass
class EngineConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512     # token budget of one step
    block_size: int = 16
    num_blocks: int | None = None         # None: what max_num_seqs x max_model_len can use, capped by
    #                                       gpu_memory_fraction of the free GPU memory (kv_pool.default_num_blocks)
    gpu_memory_fraction: float = 0.5
    max_model_len: int | None = None      # None: min(max_position_embeddings, 4096)
    chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    batching: str = "continuous"          # or "static": a batch runs to completion before the next
    cuda_graphs: bool | None = None       # replay decode steps from CUDA graphs; None: on a GPU only
    prefill_graphs: bool | None = None    # replay steps with prefill chunks from CUDA graphs (prefill_graphs.py);
    #                                       None: as cuda_graphs (so on a GPU only, unless that is set)
    pipeline_decode: bool = True          # with graphs: launch an all-greedy decode step before reading the
    #                                       previous one's tokens back (see _InFlight)
    kv_cache_dtype: str = "auto"          # "float32", "bfloat16" (kv_pool.KVPool), or "auto": bfloat16 with the
    #                                       fast precision, float32 with fp32 (kv_pool.resolve_kv_cache_dtype)
    precision: str = "auto"               # "fp32" (the reference), "fast" (bf16 activations into tensor cores),
    #                                       "auto": fast on a GPU with bf16 weights (kernel_plan.resolve_precision)

    def __post_init__(self):
        def check(ok, message):
            if not ok:
                raise TinyVLLMError(f"invalid engine setting: {message}")
        check(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        check(self.max_num_batched_tokens >= 1, f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.num_blocks is None or self.num_blocks >= 1, f"num_blocks must be >= 1, got {self.num_blocks}")
        check(0 < self.gpu_memory_fraction <= 1, f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        check(self.max_model_len is None or self.max_model_len >= 2, f"max_model_len must be >= 2, got {self.max_model_len}")
        check(self.batching in ("continuous", "static"), f"batching must be continuous or static, got {self.batching!r}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        check_precision(self.precision)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    _token_ids: list[int] | Callable[[], list[int]] = field(repr=False)  # every output token so far
    new_token_ids: list[int] = field(default_factory=list)   # what this step added (streaming)
    finished: bool = False
    finish_reason: str | None = None      # "stop" | "length" | "error" | "abort"
    error: str | None = None
    _text: str | None = field(default=None, repr=False)
    _detokenize: Callable[[list[int]], str] | None = field(default=None, repr=False, compare=False)
    _metrics: Callable[[], RequestMetrics] | RequestMetrics | None = field(default=None, repr=False, compare=False)
    _logprobs: Callable[[], list[TokenLogprobs]] | list[TokenLogprobs] | None = field(default=None, repr=False)
    _prompt_logprobs: Callable[[], list] | list | None = field(default=None, repr=False)

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        """With SamplingParams.logprobs: one {token id: logprob} per output token (aligned with token_ids):
        the token's own, then the top-n, then logprob_token_ids'. None when not asked for."""
        if callable(self._logprobs):
            self._logprobs = self._logprobs()
        return self._logprobs

    @property
    def prompt_logprobs(self) -> list[TokenLogprobs | None] | None:
        """With SamplingParams.prompt_logprobs: one entry per prompt token (None for the first, and for
        positions not computed yet), each the token's own logprob then the top-n."""
        if callable(self._prompt_logprobs):
            self._prompt_logprobs = self._prompt_logprobs()
        return self._prompt_logprobs

    @property
    def token_ids(self) -> list[int]:
        """Every output token as of this output's step; copied when first asked for (copying each growing
        output of a large batch at every step is O(output length) each)."""
        if callable(self._token_ids):
            self._token_ids = self._token_ids()
        return self._token_ids

    @property
    def metrics(self) -> RequestMetrics | None:
        """Timings as of this output's step; computed when first asked for (a step of a large batch would
        otherwise rebuild every request's inter-token latencies, O(output length) each)."""
        if callable(self._metrics):
            self._metrics = self._metrics()
        return self._metrics

    @property
    def text(self) -> str:
        """The decoded output, special tokens and stop strings removed; decoded when first asked for, so
        serving many requests does not re-decode every growing output at every step."""
        if self._text is None:
            self._text = self._detokenize(self.token_ids) if self._detokenize and self.token_ids else ""
        return self._text


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    seq: Sequence | None = None
    text: str | None = None               # set once stop strings cut it; else decoded on demand
    reported_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprobs] | None = None          # see RequestOutput.logprobs
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    def __post_init__(self):
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)


@dataclass
class _InFlight:
    """A decode step replayed from a CUDA graph whose tokens the host has not read yet.

    While the GPU runs it, the engine does the host work of the next step: when that step is the same
    sequences decoding again (all greedy, nothing waiting, no stop by length, KV blocks to spare), it appends
    a FED_BACK placeholder for each sequence's token, schedules, and launches the next step, whose graph takes
    the real tokens from the device; only then does it read this step's tokens, replace the placeholders
    and apply the stop rules. A sequence that stopped (a stop token) had one token too many computed in the
    step behind it: that token is dropped. Outputs are the same as without pipelining, one step() later."""
    schedule: SchedulerOutput
    seqs: list[Sequence]
    pending: PendingTokens


class LLMEngine:
    def __init__(self, model: str | Path | LoadedModel | None = None, config: EngineConfig | None = None,
                 log=log_to_stderr):
        self.config = config = config or EngineConfig()
        self.model = model if isinstance(model, LoadedModel) else load_model(model, log=log)
        c = self.model.config
        self.max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, c.max_position_embeddings)
        self.precision = resolve_precision(config.precision, self.model.weights.embed_tokens.dtype)
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.precision)
        use_graphs = (not SIMULATOR) if config.cuda_graphs is None else config.cuda_graphs
        use_prefill_graphs = use_graphs if config.prefill_graphs is None else config.prefill_graphs
        # the prefill graphs' activations stay allocated: the KV pool leaves room for them
        graph_bytes = activation_bytes_per_token(c) * config.max_num_batched_tokens if use_prefill_graphs else 0
        num_blocks, why = config.num_blocks, "as configured"
        if num_blocks is None:
            num_blocks, why = default_num_blocks(c, config.block_size, config.max_num_seqs, self.max_model_len,
                                                 config.enable_prefix_caching, config.gpu_memory_fraction,
                                                 self.kv_cache_dtype, reserved_bytes=graph_bytes)
        if num_blocks < 1:
            raise TinyVLLMError("no GPU memory left for even one KV block: lower --block-size or free memory")
        self.kv_pool = KVPool(c, num_blocks, config.block_size, self.kv_cache_dtype)
        self.runner = ModelRunner(c, self.model.weights, self.kv_pool, self.model.inv_freq, precision=self.precision)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                                   config.chunked_prefill, config.batching), self.block_manager)
        max_blocks_per_seq = cdiv(self.max_model_len, config.block_size)
        self.decode_graphs = (DecodeGraphs(self.runner, config.max_num_seqs, max_blocks_per_seq, log=log)
                              if use_graphs else None)
        self.prefill_graphs = (PrefillGraphs(self.runner, config.max_num_batched_tokens, config.max_num_seqs,
                                             max_blocks_per_seq, log=log) if use_prefill_graphs else None)
        self.metrics = MetricsCollector()
        self.tokenizer = self.model.tokenizer
        # generation_config.json's eos_token_id, when present, overrides config.json's (as in transformers)
        self.eos_token_ids = frozenset(self.model.generation_defaults.eos_token_ids or c.eos_token_ids)
        self.default_params = SamplingParams.from_generation_defaults(self.model.generation_defaults)
        self._requests: dict[str, _Request] = {}
        self._by_seq_id: dict[int, _Request] = {}
        self._rejected: list[_Request] = []
        self._request_ids = itertools.count()   # "0", "1", ... for requests given no id
        self._seq_ids = itertools.count()       # the scheduler's sequences, a count of their own
        self._seed_rng = np.random.default_rng()
        self.last_schedule: SchedulerOutput | None = None
        self.last_batch: ForwardBatch | None = None
        self.num_steps = 0
        self._in_flight: _InFlight | None = None
        log(f"KV pool: {num_blocks} blocks x {config.block_size} tokens, {self.kv_cache_dtype} "
            f"({self.kv_pool.bytes / 2**20:.1f} MiB: "
            f"{why}), max model len {self.max_model_len}, precision {self.precision}")

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int] | list[dict], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a prompt (text, token ids, or a chat conversation). Invalid sampling parameters raise at
        once; a prompt that cannot run (empty, unknown ids, too long) finishes with an error in the next
        step's outputs, and the other requests are unaffected. Without params: the model's
        generation_config.json settings (as vLLM does)."""
        params = params or self.default_params
        if request_id is None:  # the next free number
            request_id = next(i for i in map(str, self._request_ids) if i not in self._requests)
        request_id = str(request_id)
        if request_id in self._requests:
            raise TinyVLLMError(f"request id {request_id!r} is already in use")
        text, ids, error = self._tokenize(prompt)
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(0, 2**63))
        request = _Request(request_id, text, ids, params, seed)
        self._requests[request_id] = request
        self.metrics.on_arrival(request_id, time.perf_counter(), len(ids))
        error = error or self._prompt_error(ids, params)
        if error is None:
            request.seq = Sequence(next(self._seq_ids), ids, max_tokens=self._max_tokens(ids, params), data=request,
                                   skip_prefix_cache=params.prompt_logprobs is not None)
            try:
                self.scheduler.add(request.seq)
            except ValueError as e:
                error = str(e)
        if error is not None:
            request.error, request.finish_reason = error, "error"
            self._rejected.append(request)
        else:
            self._by_seq_id[request.seq.seq_id] = request
        return request_id

    def abort_request(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is not None and request.finish_reason is None and request.seq is not None:
            self.scheduler.finish(request.seq)
            request.finish_reason = "abort"
            self._rejected.append(request)

    def release_request(self, request_id: str) -> None:
        """Forget a finished request whose final output has been read: a long-lived server calls this so its
        tables stay flat over any number of requests; generate() keeps them (engine.request(id) afterwards)."""
        request = self._requests.get(request_id)
        if request is None:
            return
        assert request.finish_reason is not None and request not in self._rejected, \
            f"request {request_id!r} is released before its final output"
        del self._requests[request_id]
        if request.seq is not None:
            self._by_seq_id.pop(request.seq.seq_id, None)
            request.seq.data = None  # request <-> sequence: without the cycle, reference counting frees both
        self.metrics.forget(request_id)

    def prepare_prompt(self, prompt: str | list[int] | list[dict],
                       params: SamplingParams | None = None) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt as add_request would queue it; raises InvalidPrompt naming what is
        wrong (empty, unknown ids, longer than the context), for callers that reject a prompt up front."""
        text, ids, error = self._tokenize(prompt)
        error = error or self._prompt_error(ids, params or self.default_params)
        if error is not None:
            raise InvalidPrompt(error)
        return text, ids

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished or bool(self._rejected)

    def capture_graphs(self, log=None) -> None:
        """Capture every decode and prefill CUDA-graph bucket now (as vLLM does at start), not on first use:
        for a measurement whose timed part must not include captures (and first compiles of tile shapes).
        Without CUDA graphs, nothing."""
        log = log or (lambda message: None)
        for name, graphs in (("decode", self.decode_graphs), ("prefill", self.prefill_graphs)):
            if graphs is not None:
                start = time.perf_counter()
                graphs.capture_all()
                what = "sequences" if name == "decode" else f"tokens (activations {graphs.storage.bytes / 2**20:.0f} MiB)"
                log(f"captured {name} CUDA graphs for {graphs.captured_buckets} {what} in "
                    f"{time.perf_counter() - start:.1f} s")

    def request(self, request_id: str) -> _Request:
        return self._requests[request_id]

    # ---- one step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step, launches left asynchronous; decode-only steps replay a CUDA graph when
        the engine has them (EngineConfig.cuda_graphs), all-greedy ones pipelined (see _InFlight): such a
        step reports the tokens of the step before it; other steps replay one up to final_norm
        (EngineConfig.prefill_graphs)."""
        if self._in_flight is not None:
            return self._step_in_flight()
        return drain(self.step_stages(synchronize=False, graphs=True))

    def step_stages(self, all_logits: bool = False, synchronize: bool = True,
                    graphs: bool = False) -> Iterator[Stage]:
        """One scheduler step as a generator of forward-pass stages; returns the step's RequestOutputs.
        `synchronize`: wait for each stage's kernels (see ModelRunner.forward_stages). `graphs`: a step
        replays its captured graph instead (decode-only: DecodeGraphs; others: PrefillGraphs), yielding no stages."""
        # a pipelined step's tokens first: this step builds on them
        outputs = self._step_in_flight(follow=False) if self._in_flight is not None else []
        outputs += self._rejected_outputs()
        schedule = self.scheduler.schedule()
        self.last_schedule = schedule
        now = time.perf_counter()
        for s in schedule.scheduled:
            self.metrics.on_scheduled(s.seq.data.request_id, now)
        if not schedule.is_empty:
            batch, plan = self._build_batch(schedule)
            self.last_batch = batch
            greedy_ids = None  # each row's argmax, when the step computed it already (a graph replay)
            graphed = graphs and not all_logits and self.decode_graphs and self.decode_graphs.can_run(batch)
            if graphed and self._pipelines(schedule):
                self._in_flight = _InFlight(schedule, [s.seq for s in schedule.scheduled],
                                            self.decode_graphs.launch(batch))
                self._end_step(schedule)
                return outputs  # this step's tokens come with the next step
            if graphed:
                logits, greedy_ids = self.decode_graphs.run(batch)
            elif graphs and not all_logits and self.prefill_graphs and self.prefill_graphs.can_run(batch):
                logits = self.prefill_graphs.run(batch)
            else:
                logits = yield from self.runner.forward_stages(batch, all_logits=all_logits, synchronize=synchronize)
            if all_logits:
                logits = take_rows(logits, cuda.to_device(batch.logits_rows))
            sampling = [s.seq for s in schedule.scheduled if s.samples]
            wants_logprobs = any(s.seq.data.params.wants_logprobs for s in schedule.scheduled)
            sampler_logits = plan.sampler_logits(logits, wants_logprobs) if sampling else None
            new_tokens = self._sample(sampler_logits, sampling, greedy_ids) if sampling else []
            if wants_logprobs:
                record_logprobs(logits, plan, [(seq.data, t) for seq, t in zip(sampling, new_tokens)])
            self.scheduler.update(schedule, {seq.seq_id: t for seq, t in zip(sampling, new_tokens)})
            now = time.perf_counter()
            for seq in sampling:
                self.metrics.on_token(seq.data.request_id, now)
                self._check_stop(seq.data)
            outputs += [self._output(seq.data) for seq in sampling]
        self._end_step(schedule)
        return outputs

    def _end_step(self, schedule: SchedulerOutput) -> None:
        self.num_steps += 1
        self.metrics.on_step(time.perf_counter(), self.scheduler.num_running, self.scheduler.num_waiting,
                             self.block_manager.usage, schedule.num_batched_tokens,
                             self.block_manager.prefix_hit_rate)

    def _rejected_outputs(self) -> list[RequestOutput]:
        outputs = [self._output(r) for r in self._rejected]
        for r in self._rejected:
            self.metrics.on_finished(r.request_id, time.perf_counter(), r.finish_reason)
        self._rejected.clear()
        return outputs

    # ---- pipelined decode (see _InFlight) ----------------------------------------------------------
    def _pipelines(self, schedule: SchedulerOutput) -> bool:
        """Whether a graph-replayed decode step may run pipelined: every row greedy and sure to be argmax
        (no stop token suppressed by min_tokens)."""
        if not self.config.pipeline_decode:
            return False
        return all(s.samples and s.seq.data.params.temperature == 0 and not s.seq.data.params.wants_logprobs
                   and s.seq.num_output_tokens >= s.seq.data.params.min_tokens for s in schedule.scheduled)

    def _can_follow(self, in_flight: _InFlight) -> bool:
        """Whether the next step is sure to be the in-flight sequences decoding once more, in the same rows:
        nothing waits to be admitted, each sequence is still running and not at its length limit, its next
        token keeps argmax (min_tokens reached), and the KV pool has the blocks they need."""
        seqs, bm = in_flight.seqs, self.block_manager
        if (self.decode_graphs is None or self._rejected or self.scheduler.num_waiting
                or self.scheduler.running != seqs):
            return False
        if any(seq.num_output_tokens + 1 >= seq.max_tokens or seq.num_output_tokens + 1 < seq.data.params.min_tokens
               for seq in seqs):
            return False
        # A sequence of N tokens (the in-flight step computes position N - 1) starts a block at position N.
        return sum(seq.num_tokens % bm.block_size == 0 for seq in seqs) <= bm.num_free_blocks

    def _step_in_flight(self, follow: bool = True) -> list[RequestOutput]:
        """Report the in-flight step's tokens; first, when it can (`follow` and _can_follow), launch the next
        step of the same sequences, which becomes the step in flight."""
        in_flight, self._in_flight = self._in_flight, None
        rows = [row for row, seq in enumerate(in_flight.seqs) if not seq.is_finished]  # aborted meanwhile: dropped
        if len(rows) < len(in_flight.seqs):
            live = [in_flight.schedule.scheduled[row] for row in rows]
            in_flight = _InFlight(SchedulerOutput(live, [], len(live)), [s.seq for s in live], in_flight.pending)
            follow = False
        outputs = self._rejected_outputs()
        follow = follow and self._can_follow(in_flight)
        seqs = in_flight.seqs
        if follow:
            self.scheduler.update(in_flight.schedule, {seq.seq_id: FED_BACK for seq in seqs})
            schedule = self.scheduler.schedule()
            assert [s.seq for s in schedule.scheduled] == seqs and not schedule.preempted, "pipelined step changed"
            self.last_schedule, self.last_batch = schedule, self._build_batch(schedule)[0]
            now = time.perf_counter()
            for seq in seqs:
                self.metrics.on_scheduled(seq.data.request_id, now)
            self._in_flight = _InFlight(schedule, seqs, self.decode_graphs.launch(self.last_batch))
            tokens = in_flight.pending.tokens()
            for seq, token in zip(seqs, tokens):
                assert seq.token_ids[-1] == FED_BACK
                seq.token_ids[-1] = token
        else:
            tokens = in_flight.pending.tokens()
            tokens = [tokens[row] for row in rows]
            self.scheduler.update(in_flight.schedule, {seq.seq_id: t for seq, t in zip(seqs, tokens)})
        now = time.perf_counter()
        for seq in seqs:
            self.metrics.on_token(seq.data.request_id, now)
            self._check_stop(seq.data)
        outputs += [self._output(seq.data) for seq in seqs]
        if follow:
            self._end_step(self.last_schedule)
        return outputs

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 on_output=None) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. `on_output` sees every streamed output."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise TinyVLLMError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if on_output:
                    on_output(out)
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    # ---- internals ------------------------------------------------------------------------------
    def _tokenize(self, prompt) -> tuple[str | None, list[int], str | None]:
        try:
            if isinstance(prompt, str):  # "" is an empty prompt, not a lone <|begin_of_text|>
                return prompt, self.tokenizer.encode(prompt) if prompt else [], None
            if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
                text = self.tokenizer.apply_chat_template(list(prompt))
                return text, self.tokenizer.encode(text, add_special_tokens=False), None
            if isinstance(prompt, list) and all(type(t) is int for t in prompt):
                return None, list(prompt), None  # plain ids (an eval submits ~14k): no numpy round trip
            ids = [int(t) for t in np.asarray(prompt, dtype=np.int64).reshape(-1)]
            return None, ids, None
        except TinyVLLMError as e:
            return None, [], str(e)
        except (TypeError, ValueError) as e:
            return None, [], f"a prompt must be text, token ids or a list of chat messages ({e})"

    def _prompt_error(self, ids: list[int], params: SamplingParams) -> str | None:
        vocab = self.model.config.vocab_size
        if not ids:
            return "empty prompt"
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            return f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}"
        bad = [t for t in params.logprob_token_ids if t >= vocab]
        if bad:
            return f"logprob_token_ids outside the vocabulary [0, {vocab}): {bad[:5]}"
        if len(ids) >= self.max_model_len:
            return (f"prompt has {len(ids)} tokens but the model's context holds {self.max_model_len} "
                    f"(prompt + at least one new token); raise --max-model-len or shorten it")
        return None

    def _max_tokens(self, ids: list[int], params: SamplingParams) -> int:
        return max(1, min(params.max_tokens, self.max_model_len - len(ids)))

    def _build_batch(self, schedule: SchedulerOutput) -> tuple[ForwardBatch, LogitsPlan]:
        token_ids, starts, counts = [], [], []
        plan = LogitsPlan()
        for s in schedule.scheduled:
            plan.add_chunk(s.seq.data, len(token_ids), s.start, s.end, s.seq.num_prompt_tokens, s.samples)
            token_ids += s.token_ids
            starts.append(s.start)
            counts.append(s.num_new_tokens)
        tables = [s.seq.block_table for s in schedule.scheduled]
        width = max(map(len, tables))
        block_tables = np.array([t + [-1] * (width - len(t)) for t in tables], np.int32)
        # positions, rows and slots of every token at once (numpy: a prefill step has thousands of tokens):
        # token i of row r sits at position start_r + (i - first token of r), slot = table[p // bs] * bs + p % bs
        counts = np.array(counts, np.int64)
        query_seq = np.repeat(np.arange(len(counts)), counts)
        first = np.cumsum(counts) - counts
        positions = np.arange(len(token_ids)) + np.repeat(np.array(starts, np.int64) - first, counts)
        bs = self.block_manager.block_size
        slots = block_tables[query_seq, positions // bs].astype(np.int64) * bs + positions % bs
        assert slots.min() >= 0, "a scheduled token has no KV block"
        return ForwardBatch(token_ids, positions, query_seq, slots, block_tables, plan.rows), plan

    def _sample(self, logits, seqs: list[Sequence], greedy_ids=None) -> list[int]:
        """The next token of each row; `greedy_ids`: the rows' argmax if already computed (valid only while
        no token is suppressed)."""
        params = [seq.data.params for seq in seqs]
        suppressed_rows, suppressed_ids = [], []
        for row, (seq, p) in enumerate(zip(seqs, params)):
            if seq.num_output_tokens < p.min_tokens:  # stop tokens may not end it yet
                stop_ids = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_token_ids)
                suppressed_rows += [row] * len(stop_ids)
                suppressed_ids += sorted(stop_ids)
        if suppressed_rows:
            suppress_tokens(logits, cuda.to_device(np.array(suppressed_rows, np.int32)),
                            cuda.to_device(np.array(suppressed_ids, np.int32)))
            greedy_ids = None  # computed before the suppression
        if all(p.temperature == 0 for p in params):  # sample's T = 0 rows are argmax's answer: skip its inputs
            return (argmax(logits) if greedy_ids is None else greedy_ids).copy_to_host().tolist()
        ids = sample(logits,
                     cuda.to_device(np.array([p.temperature for p in params], np.float32)),
                     cuda.to_device(np.array([p.top_k for p in params], np.int32)),
                     cuda.to_device(np.array([p.top_p for p in params], np.float32)),
                     cuda.to_device(np.array([seq.data.seed for seq in seqs], np.uint64)),
                     cuda.to_device(np.array([seq.num_output_tokens for seq in seqs], np.int32)))
        return ids.copy_to_host().tolist()

    def _check_stop(self, request: _Request) -> None:
        seq, p = request.seq, request.params
        token = seq.token_ids[-1]
        n_out = seq.num_output_tokens
        reason = None
        if n_out >= p.min_tokens:
            if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
                reason = "stop"
            elif p.stop:  # only stop strings need the text while running
                text = self.tokenizer.decode(seq.output_token_ids)
                cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
                if cut >= 0:
                    request.text, reason = text[:cut], "stop"
        if reason is None and n_out >= seq.max_tokens:
            reason = "length"
        if reason is not None:
            request.finish_reason = reason
            self.scheduler.finish(seq)
            self.metrics.on_finished(request.request_id, time.perf_counter(), reason)

    def _output(self, request: _Request) -> RequestOutput:
        seq = request.seq
        all_ids, start, n_out = (seq.token_ids, seq.num_prompt_tokens, seq.num_output_tokens) if seq else ([], 0, 0)
        new = all_ids[start + request.reported_tokens:start + n_out]
        request.reported_tokens = n_out
        return RequestOutput(
            request.request_id, request.prompt, request.prompt_token_ids,
            # a sequence's token list only ever grows (preemption keeps it): sliced later, this step's snapshot
            functools.partial(operator.getitem, all_ids, slice(start, start + n_out)),
            new_token_ids=new, finished=request.finish_reason is not None,
            finish_reason=request.finish_reason, error=request.error,
            _text=request.text, _detokenize=self.tokenizer.decode,
            _metrics=functools.partial(self.metrics.request_metrics, request.request_id,
                                       (n_out, request.finish_reason is not None)),
            _logprobs=None if request.logprobs is None else request.logprobs[:n_out],
            _prompt_logprobs=None if request.prompt_logprobs is None else list(request.prompt_logprobs))
