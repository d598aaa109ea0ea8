"""The requests each workload sends: random token ids from fixed seeds (tinyvllm and HF get the same)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyvllm.bench.config import BenchConfig, PROMPT_ID_LIMIT, WORKLOADS


@dataclass
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int
    arrival: float = 0.0                  # seconds after the run starts


def workload_rng(seed: int, workload: str, *extra: int) -> np.random.Generator:
    """One stream per workload, so no workload's prompts share a prefix with another's (prefix caching)."""
    return np.random.default_rng([seed, WORKLOADS.index(workload), *extra])


def random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> list[int]:
    return rng.integers(0, min(vocab_size, PROMPT_ID_LIMIT), length).tolist()


def nano_vllm_requests(rng, n: int, prompt_range: tuple[int, int], output_range: tuple[int, int],
                       vocab_size: int) -> list[BenchRequest]:
    """nano-vllm's bench.py workload: each request's prompt and output lengths uniform in their ranges."""
    prompt_lens = rng.integers(prompt_range[0], prompt_range[1] + 1, n)
    output_lens = rng.integers(output_range[0], output_range[1] + 1, n)
    return [BenchRequest(random_prompt(rng, int(p), vocab_size), int(o)) for p, o in zip(prompt_lens, output_lens)]


def poisson_arrivals(rng, n: int, rate: float) -> np.ndarray:
    """Arrival times (s) of a Poisson process at `rate` requests/s, the first at 0 (as vLLM's benchmark)."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.exponential(1.0 / rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def fit_to_context(requests: list[BenchRequest], max_model_len: int) -> list[BenchRequest]:
    """Shorten prompts and outputs that would not fit the engine's context, so requested == produced."""
    for r in requests:
        r.prompt_ids = r.prompt_ids[:max_model_len - 1]
        r.max_tokens = min(r.max_tokens, max_model_len - len(r.prompt_ids))
    return requests


@dataclass
class Workloads:
    """Every request of every selected workload, made once so tinyvllm and HF see the same ids."""
    latency: list[BenchRequest]
    prefill: dict[int, list[BenchRequest]]      # prompt length -> one single-token request per repeat
    throughput: list[BenchRequest]
    serving: list[BenchRequest]

    @classmethod
    def make(cls, cfg: BenchConfig, vocab_size: int, max_model_len: int) -> Workloads:
        rng = workload_rng(cfg.seed, "latency")
        latency = [BenchRequest(random_prompt(rng, cfg.latency_prompt, vocab_size), cfg.latency_new_tokens)]
        prefill = {}
        for length in sorted({min(n, max_model_len - 1) for n in cfg.prefill_lens}):
            rng = workload_rng(cfg.seed, "prefill", length)
            prefill[length] = [BenchRequest(random_prompt(rng, length, vocab_size), 1)
                               for _ in range(cfg.prefill_repeats)]
        throughput = nano_vllm_requests(workload_rng(cfg.seed, "throughput"), cfg.num_requests,
                                        (cfg.min_len, cfg.max_len), cfg.output_range, vocab_size)
        rng = workload_rng(cfg.seed, "serving")
        serving = nano_vllm_requests(rng, cfg.serving_requests, (cfg.min_len, cfg.max_len), cfg.output_range,
                                     vocab_size)
        for r, t in zip(serving, poisson_arrivals(rng, len(serving), cfg.request_rate)):
            r.arrival = float(t)
        fit = lambda rs: fit_to_context(rs, max_model_len)
        return cls(fit(latency), {n: fit(rs) for n, rs in prefill.items()}, fit(throughput), fit(serving))
