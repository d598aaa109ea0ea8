"""LLMEngine: requests in, tokens out, one scheduler step at a time (vLLM's shape, nano-vllm's size).

    add_request(prompt, params) -> request_id        step() -> [RequestOutput, ...]

Each step: the Scheduler picks which sequences run and how many tokens each computes (decodes and
prefill chunks together, within a token budget, preempting when KV blocks run out: a SchedulerOutput);
the ModelRunner executes it (builds the inputs, runs the forward pass or replays a CUDA graph, samples
one token per finished prefill or decode); the scheduler appends the tokens, the stop checks
(stop_checks.py) end what is done, and the engine reports what changed. `step_stages()` is the same step
as a generator that yields after every stage of the forward pass: the debugger and the golden checker
drive it. The engine is host-side only: it imports no kernel.
"""
from __future__ import annotations

import functools
import itertools
import operator
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from tinyvllm.engine.block_manager import BlockManager
from tinyvllm.engine.config import EngineConfig
from tinyvllm.engine.metrics import MetricsCollector
from tinyvllm.engine.outputs import RequestOutput
from tinyvllm.engine.request import Request, stop_token_ids
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.engine.scheduler import Scheduler, SchedulerConfig
from tinyvllm.engine.scheduler_output import SchedulerOutput
from tinyvllm.engine.sequence import Sequence
from tinyvllm.engine.stop_checks import check_stop
from tinyvllm.errors import TinyVLLMError
from tinyvllm.log import log_to_stderr
from tinyvllm.model.loader import LoadedModel, load_model
from tinyvllm.runner.inputs import ForwardBatch
from tinyvllm.runner.model_runner import ModelRunner
from tinyvllm.runner.stages import Stage, drain
from tinyvllm.runner.step import FED_BACK, StepResult

__all__ = ["EngineConfig", "InvalidPrompt", "LLMEngine", "RequestOutput"]


class InvalidPrompt(TinyVLLMError, ValueError):
    """A prompt the engine cannot run; the message says why."""


class LLMEngine:
    def __init__(self, model: str | Path | LoadedModel | None = None, config: EngineConfig | None = None,
                 log=log_to_stderr):
        self.config = config = config or EngineConfig()
        self.model = model if isinstance(model, LoadedModel) else load_model(model, log=log)
        c = self.model.config
        self.max_model_len = config.max_model_len_for(c.max_position_embeddings)
        self.runner = ModelRunner.for_engine(self.model, config, self.max_model_len, log=log)
        self.kv_pool, self.precision, self.kv_cache_dtype = self.runner.kv_pool, self.runner.precision, self.runner.kv_pool.dtype
        num_blocks = self.kv_pool.num_blocks
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                                   config.chunked_prefill, config.batching), self.block_manager)
        self.metrics = MetricsCollector()
        self.tokenizer = self.model.tokenizer
        # generation_config.json's eos_token_id, when present, overrides config.json's (as in transformers)
        self.eos_token_ids = frozenset(self.model.generation_defaults.eos_token_ids or c.eos_token_ids)
        self.default_params = SamplingParams.from_generation_defaults(self.model.generation_defaults)
        self._requests: dict[str, Request] = {}
        self._by_seq_id: dict[int, Request] = {}
        self._rejected: list[Request] = []  # ended outside a step (a prompt error, an abort): reported next step
        self._request_ids = itertools.count()   # "0", "1", ... for requests given no id
        self._seq_ids = itertools.count()       # the scheduler's sequences, a count of their own
        self._seed_rng = np.random.default_rng()
        self.last_schedule: SchedulerOutput | None = None
        self.num_steps = 0

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
        request = Request(request_id, text, ids, params, seed, stop_token_ids(params, self.eos_token_ids))
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
        Without CUDA graphs, nothing. A first start (kernels neither compiled nor in the disk cache) compiles them in
        parallel worker processes first (runner/compile_workers.py; EngineConfig.compile_workers)."""
        workers = self.config.compile_workers
        if workers is None or workers > 1:
            from tinyvllm.runner.compile_workers import compile_graph_kernels
            compile_graph_kernels(self.runner, log, workers)
        self.runner.capture_graphs(log)

    @property
    def last_batch(self) -> ForwardBatch | None:
        """The inputs of the latest step that ran (the debugger shows them)."""
        return self.runner.last_batch

    def request(self, request_id: str) -> Request:
        return self._requests[request_id]

    # ---- one step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step, launches left asynchronous; decode-only steps replay a CUDA graph when
        the engine has them (EngineConfig.cuda_graphs), all-greedy ones pipelined (runner/step.py): such a
        step reports the tokens of the step before it; other steps replay one up to final_norm
        (EngineConfig.prefill_graphs)."""
        return drain(self.step_stages(synchronize=False, graphs=True))

    def step_stages(self, all_logits: bool = False, synchronize: bool = True,
                    graphs: bool = False) -> Iterator[Stage]:
        """One scheduler step as a generator of forward-pass stages; returns the step's RequestOutputs.
        schedule -> runner.execute_stages -> scheduler.update, stop checks, outputs.
        `all_logits`: logits for every token, the stages run eagerly (golden checks). `synchronize`: wait for each
        stage's kernels (see ModelRunner.forward_stages). `graphs`: a step replays its captured graph instead
        (decode-only: DecodeGraphs; others: PrefillGraphs), yielding no stages.

        With a pipelined decode step in flight (its tokens not read yet), a step with `graphs` whose
        sequences are sure to decode once more (_can_follow) is scheduled on placeholders for those tokens
        and launched before they are read; otherwise the step in flight is read first, and with `graphs`
        that is the whole step (the next one schedules afresh)."""
        outputs = self._rejected_outputs()
        graphs = graphs and not all_logits
        in_flight = self.runner.in_flight
        follows = in_flight is not None and graphs and self._can_follow(in_flight)
        if in_flight is not None and not follows:
            outputs += self._finish_step(self.runner.settle())
            if graphs:
                return outputs
        if follows:
            self.scheduler.update(in_flight, {s.seq.seq_id: FED_BACK for s in in_flight.scheduled})
        schedule = self.scheduler.schedule()
        assert not follows or ([s.seq for s in schedule.scheduled] == [s.seq for s in in_flight.scheduled]
                               and not schedule.preempted), "a pipelined step changed its sequences"
        self.last_schedule = schedule
        now = time.perf_counter()
        for s in schedule.scheduled:
            self.metrics.on_scheduled(s.seq.data.request_id, now)
        if not schedule.is_empty:
            result = yield from self.runner.execute_stages(schedule, all_logits, synchronize, graphs)
            if result is not None:
                outputs += self._finish_step(result, placeholders=follows)
        self._end_step(schedule)
        return outputs

    def settle(self) -> list[RequestOutput]:
        """Read the tokens of the pipelined decode step in flight, if there is one, and report what they did, as the
        next step() would; launch nothing. A server stopping at its deadline settles before it aborts the rest: a
        step launched before the deadline counts, as an eager step that ran before it does."""
        if self.runner.in_flight is None:
            return []
        return self._finish_step(self.runner.settle())

    def _finish_step(self, result: StepResult, placeholders: bool = False) -> list[RequestOutput]:
        """Append the step's tokens (`placeholders`: write them over the FED_BACK placeholders appended when the
        next step was scheduled), end the sequences they stop, and report each sequence that got a token. A
        sequence aborted while its pipelined step was in flight is left out, its token dropped."""
        live = [s for s in result.schedule.scheduled if not s.seq.is_finished]
        schedule, sampled = result.schedule, result.sampled
        if len(live) < len(schedule.scheduled):
            schedule = SchedulerOutput(live, [], sum(s.num_new_tokens for s in live))
            sampled = {seq.seq_id: sampled[seq.seq_id] for seq in schedule.sampling_seqs}
        if placeholders:
            self.scheduler.fill_placeholders(schedule, sampled, FED_BACK)
        else:
            self.scheduler.update(schedule, sampled)
        now = time.perf_counter()
        seqs = schedule.sampling_seqs
        for seq in seqs:
            self.metrics.on_token(seq.data.request_id, now)
            self._check_stop(seq.data)
        return [self._output(seq.data) for seq in seqs]

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

    def _can_follow(self, in_flight: SchedulerOutput) -> bool:
        """Whether the next step is sure to be the in-flight sequences decoding once more, in the same rows (so
        it may be launched before their tokens are read): nothing waits to be admitted, each sequence is still
        running and not at its length limit, its next token keeps argmax (min_tokens reached), and the KV pool
        has the blocks they need."""
        seqs, bm = in_flight.sampling_seqs, self.block_manager
        if self.scheduler.num_waiting or self.scheduler.running != seqs:
            return False
        if any(seq.num_output_tokens + 1 >= seq.max_tokens or seq.num_output_tokens + 1 < seq.data.params.min_tokens
               for seq in seqs):
            return False
        # A sequence of N tokens (the in-flight step computes position N - 1) starts a block at position N.
        return sum(seq.num_tokens % bm.block_size == 0 for seq in seqs) <= bm.num_free_blocks

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

    def _check_stop(self, request: Request) -> None:
        stop = check_stop(request.seq, request.params, request.stop_token_ids, self.tokenizer.decode)
        if stop is not None:
            if stop.text is not None:
                request.text = stop.text
            request.finish_reason = stop.reason
            self.scheduler.finish(request.seq)
            self.metrics.on_finished(request.request_id, time.perf_counter(), stop.reason)

    def _output(self, request: Request) -> RequestOutput:
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
