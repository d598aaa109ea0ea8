"""Where the numbers come from: the in-process engine, or any OpenAI-compatible server (`remote.py`).

A backend runs a list of jobs and calls `on_done(index, result)` as each finishes (any order):
- `loglikelihoods(jobs)`: a LoglikelihoodJob's result is one log-probability per continuation;
- `generate(jobs, max_tokens, stop)`: a GenerationJob's result is a Generation (text, token count);
a job that failed gets a Failure (its message) instead. `stats()` adds backend facts to the report.

EngineBackend is the adapter to the engine's logprobs API (SamplingParams.logprob_token_ids: at a generated
position, the log-probabilities of the given ids under the raw model distribution, log_softmax of the
logits): each trie node of a question (scoring.ContinuationTrie) is one request with max_tokens=1. Requests
enter the engine through a window of a few batches, so a question's deeper nodes run right after its root
while the prompt's blocks are still in the prefix cache, and memory stays flat over 14,042 questions.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

from tinyvllm.engine.gc_control import without_cyclic_gc
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.evaluation.scoring import ContinuationTrie


@dataclass
class LoglikelihoodJob:
    prompt_ids: list[int]
    continuations: list[tuple[int, ...]]


@dataclass
class GenerationJob:
    prompt_ids: list[int]           # the rendered chat prompt with the answer prefix, tokenized (engine)
    messages: list[dict]            # the conversation (servers: /v1/chat/completions)
    answer_prefix: str = ""         # begins the assistant's turn


@dataclass
class Generation:
    text: str                       # what the model wrote after the answer prefix
    output_tokens: int


@dataclass
class Failure:
    message: str


OnDone = Callable[[int, object], None]


@functools.lru_cache(maxsize=4096)
def next_token_params(token_ids: tuple[int, ...]) -> SamplingParams:
    """One greedy step that reports `token_ids`' log-probabilities at the next position. Cached: every MMLU
    question asks for the same letters, and SamplingParams (frozen) is checked field by field when made."""
    return SamplingParams(temperature=0.0, max_tokens=1, logprob_token_ids=tuple(token_ids))


def next_token_logprobs(output, token_ids: tuple[int, ...]) -> dict[int, float]:
    """The log-probabilities of `token_ids` at a finished max_tokens=1 request's generated position."""
    position = output.logprobs[0]
    return {t: float(position[t]) for t in token_ids}


class EngineBackend:
    name = "engine"

    def __init__(self, engine, window: int | None = None, deadline: float | None = None):
        """`deadline` (time.perf_counter()): jobs not yet started then are not run (a benchmark's time cap)."""
        self.engine = engine
        self.window = window or 4 * engine.config.max_num_seqs
        self.deadline = deadline

    def loglikelihoods(self, jobs: list[LoglikelihoodJob], on_done: OnDone) -> None:
        tries = [ContinuationTrie(job.continuations) for job in jobs]
        found: list[dict] = [{} for _ in jobs]
        failed: set[int] = set()
        owners: dict[str, tuple[int, tuple[int, ...]]] = {}

        def submit(j: int, prefix: tuple[int, ...]) -> None:
            # the engine names it: ids stay unique over every task run on one engine
            request_id = self.engine.add_request(jobs[j].prompt_ids + list(prefix),
                                                 next_token_params(tries[j].nodes[prefix]))
            owners[request_id] = (j, prefix)

        def on_output(out) -> None:
            j, prefix = owners.pop(out.request_id)
            if j in failed:
                return
            if out.error:
                failed.add(j)
                on_done(j, Failure(out.error))
                return
            found[j][prefix] = next_token_logprobs(out, tries[j].nodes[prefix])
            if not prefix:
                for deeper in tries[j].deeper_nodes:
                    submit(j, deeper)
            if len(found[j]) == len(tries[j].nodes):
                on_done(j, tries[j].scores(found[j]))

        self._run(len(jobs), lambda j: submit(j, ()), owners, on_output, on_done)

    def generate(self, jobs: list[GenerationJob], max_tokens: int, stop: tuple[str, ...], on_done: OnDone) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop)
        owners: dict[str, int] = {}

        def submit(j: int) -> None:
            owners[self.engine.add_request(jobs[j].prompt_ids, params)] = j

        def on_output(out) -> None:
            j = owners.pop(out.request_id)
            on_done(j, Failure(out.error) if out.error else Generation(out.text, len(out.token_ids)))

        self._run(len(jobs), submit, owners, on_output, on_done)

    def _run(self, n: int, submit_job, owners: dict, on_output, on_done: OnDone) -> None:
        """Feed jobs 0..n-1 to the engine, at most `window` requests in it at once, until all finished."""
        with without_cyclic_gc():
            self._feed(n, submit_job, owners, on_output, on_done)

    def _feed(self, n: int, submit_job, owners: dict, on_output, on_done: OnDone) -> None:
        next_job = 0
        while next_job < n or owners:
            if next_job < n and self.deadline is not None and time.perf_counter() > self.deadline:
                for j in range(next_job, n):
                    on_done(j, Failure("not run: the time limit was reached"))
                next_job = n
            while next_job < n and len(owners) < self.window:
                submit_job(next_job)
                next_job += 1
            if not owners:
                break
            assert self.engine.has_unfinished_requests(), f"{len(owners)} requests lost by the engine"
            for out in self.engine.step():
                if out.finished:
                    on_output(out)
                    self.engine.release_request(out.request_id)  # tables stay flat over 14,042 questions

    def stats(self) -> dict:
        bm = self.engine.block_manager
        return {"prefix_cache_hit_rate": bm.prefix_hit_rate, "prefix_cache_hit_tokens": bm.prefix_hit_tokens,
                "prefix_cache_query_tokens": bm.prefix_query_tokens, "engine_steps": self.engine.num_steps}


