"""`tinyvllm bench`: measure the engine the way inference engines are measured, optionally beside HF transformers.

    tinyvllm bench [--model DIR | --random-1b DIR] [--workload latency,prefill,throughput,serving]
                   [--compare hf] [--out DIR] [--max-seconds S] ...      (python -m tinyvllm.bench: the same)

Every request is random token ids from a fixed seed, greedy, ignore_eos, so it produces exactly the tokens it
asks for (and tinyvllm and HF get the very same prompts):
  latency     batch 1, a 128-token prompt, 256 new tokens: TTFT, TPOT, output tok/s, and the decode step against
              the HBM roofline: weight bytes read per step / TPOT, as a fraction of the copy bandwidth measured
              in the same run (a device-to-device copy)
  prefill     TTFT of one 128 / 1024 / 4096-token prompt (capped to the context), median of --prefill-repeats
  throughput  nano-vllm's workload: 256 requests, prompt and output lengths uniform in 100..1024, all queued at
              once: output tok/s with continuous and with static batching (batches of --max-num-seqs)
  serving     requests arriving as a Poisson process at --request-rate: TTFT / ITL / E2E p50 p95 p99 from the
              engine's MetricsCollector; TTFT and E2E count from each request's scheduled arrival time
  kernels     the latency prompt's prefill step and one batch-1 decode step, every stage synchronised: time,
              useful GB/s and TFLOP/s per kernel against what the stage must move and do (stage_costs.py)
Timing: a warm-up generate first (numba compiles kernels at their first launch), a fresh engine per run (empty
KV pool and prefix cache, fresh metrics), cuda.synchronize() before every clock read that ends a run. A run
stops at --max-seconds and reports how far it got. Output: OUT/bench.json, OUT/bench.csv, a table on stdout,
progress on stderr, and OUT/bench.png when matplotlib is installed.

--compare hf runs latency, prefill and throughput through HF transformers (LlamaForCausalLM in bf16, sdpa, on
the same GPU and weights; serving is not run: `generate` has no request-arrival API): greedy `generate` with
min_new_tokens = max_new_tokens, throughput in static batches of --hf-batch-size with left padding, counting
only the tokens each request asked for. The table then shows tinyvllm/HF ratios. torch and transformers are
imported only then. Without a CUDA GPU it stops with a message, unless --hf-device cpu (a slow dry run).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import json
import math
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import TinyVLLMError

WORKLOADS = ("latency", "prefill", "throughput", "serving", "kernels")
BATCHING_MODES = ("continuous", "static")
PROMPT_ID_LIMIT = 10_000      # nano-vllm draws prompt ids from [0, 10000]
PROGRESS_EVERY_S = 10.0
SIMULATOR_COPY_BYTES = 1 << 20


# ---- configuration ----------------------------------------------------------------------------------

@dataclass
class BenchConfig:
    model: str | None = None              # None: the demo model
    random_1b: str | None = None          # write (once) and use a random Llama-3.2-1B-shaped model here
    workloads: tuple[str, ...] = WORKLOADS
    out: str = "out/bench"
    seed: int = 0
    max_seconds: float = 300.0            # per run (one workload on one system, one batching mode)
    latency_prompt: int = 128
    latency_new_tokens: int = 256
    prefill_lens: tuple[int, ...] = (128, 1024, 4096)
    prefill_repeats: int = 3
    num_requests: int = 256
    min_len: int = 100
    max_len: int = 1024
    min_output_len: int | None = None     # None: min_len (nano-vllm uses one range for both)
    max_output_len: int | None = None
    batching: tuple[str, ...] = BATCHING_MODES
    serving_requests: int = 100
    request_rate: float = 4.0             # requests/s; inf: all at once
    compare: str | None = None            # "hf"
    hf_only: bool = False                 # only the HF side (e.g. on a second GPU beside a tinyvllm run)
    hf_batch_size: int = 64
    hf_device: str = "cuda"
    copy_mib: int = 1024
    plot: bool = True
    warmup: bool = True
    # engine
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_fraction: float = 0.5
    max_model_len: int | None = None      # None: what the workloads need, capped by the model
    enable_prefix_caching: bool = True

    def __post_init__(self):
        def check(ok, message):
            if not ok:
                raise TinyVLLMError(f"bench: {message}")
        check(not (self.model and self.random_1b), "give --model or --random-1b, not both")
        unknown = sorted(set(self.workloads) - set(WORKLOADS))
        check(self.workloads and not unknown, f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
        unknown = sorted(set(self.batching) - set(BATCHING_MODES))
        check(self.batching and not unknown, f"unknown batching mode(s) {unknown}; choose from continuous, static")
        check(self.compare in (None, "hf"), f"--compare takes hf, got {self.compare!r}")
        check(not self.hf_only or self.compare == "hf", "--hf-only needs --compare hf")
        for name in ("latency_prompt", "latency_new_tokens", "prefill_repeats", "num_requests", "min_len",
                     "serving_requests", "hf_batch_size", "copy_mib", "max_num_seqs", "max_num_batched_tokens",
                     "block_size"):
            check(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        check(all(n >= 1 for n in self.prefill_lens) and self.prefill_lens, "--prefill-lens must be integers >= 1")
        check(self.min_len <= self.max_len, f"--min-len {self.min_len} > --max-len {self.max_len}")
        check(1 <= self.output_range[0] <= self.output_range[1], f"output length range {self.output_range} is empty")
        check(self.max_seconds > 0, f"--max-seconds must be > 0, got {self.max_seconds}")
        check(self.request_rate > 0, f"--request-rate must be > 0 (inf: all at once), got {self.request_rate}")

    @property
    def output_range(self) -> tuple[int, int]:
        return (self.min_output_len or self.min_len, self.max_output_len or self.max_len)

    def needed_model_len(self) -> int:
        """The longest prompt + output any selected workload asks for."""
        needs = {"latency": self.latency_prompt + self.latency_new_tokens, "prefill": max(self.prefill_lens) + 1,
                 "throughput": self.max_len + self.output_range[1], "serving": self.max_len + self.output_range[1],
                 "kernels": self.latency_prompt + KERNEL_STEPS}
        return max(needs[w] for w in self.workloads)


# ---- requests ---------------------------------------------------------------------------------------

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


# ---- driving the engine -----------------------------------------------------------------------------

def synced_clock() -> float:
    """perf_counter after the device has finished everything queued."""
    from kernels_numba.common import cuda
    cuda.synchronize()
    return time.perf_counter()


@dataclass
class RunRecord:
    """What one run of requests through an engine did, whether or not it got to the end."""
    num_requests: int
    num_arrived: int
    num_finished: int
    num_errored: int
    prompt_tokens: int               # of the requests that arrived
    requested_output_tokens: int     # of all the run's requests
    output_tokens: int               # produced, by finished and unfinished requests alike
    elapsed: float
    stopped_early: bool
    summary: object                  # the engine's MetricsSummary
    arrival_lag: dict[str, float] = field(default_factory=dict)   # request id -> add time - scheduled arrival


def drive_engine(engine, requests: list[BenchRequest], max_seconds: float, log, label: str) -> RunRecord:
    """Add each request at its arrival time and step the engine until all finish or max_seconds pass."""
    from .sampling_params import SamplingParams
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    produced: dict[str, int] = {}
    finished, errored, lag = set(), set(), {}
    arrived = prompt_tokens = 0
    stopped_early = False
    start = synced_clock()
    deadline, next_progress = start + max_seconds, start + PROGRESS_EVERY_S
    while True:
        now = time.perf_counter()
        while arrived < len(order) and start + requests[order[arrived]].arrival <= now:
            r = requests[order[arrived]]
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, seed=0)
            rid = engine.add_request(r.prompt_ids, params)
            lag[rid] = time.perf_counter() - (start + r.arrival)
            produced[rid] = 0
            arrived += 1
            prompt_tokens += len(r.prompt_ids)
        if now >= deadline:
            stopped_early = arrived < len(order) or engine.has_unfinished_requests()
            break
        if engine.has_unfinished_requests():
            for out in engine.step():
                produced[out.request_id] += len(out.new_token_ids)
                if out.finished:
                    (errored if out.error else finished).add(out.request_id)
        elif arrived < len(order):
            time.sleep(max(0.0, min(start + requests[order[arrived]].arrival, deadline) - time.perf_counter()))
        else:
            break
        if time.perf_counter() >= next_progress:
            next_progress += PROGRESS_EVERY_S
            log(f"  {label}: {time.perf_counter() - start:.0f} s, {len(finished)}/{len(requests)} requests done, "
                f"{sum(produced.values())} tokens")
    elapsed = synced_clock() - start
    if stopped_early:
        log(f"  {label}: stopped at --max-seconds {max_seconds:g}: {len(finished)}/{len(requests)} requests done")
    return RunRecord(len(requests), arrived, len(finished), len(errored), prompt_tokens,
                     sum(r.max_tokens for r in requests), sum(produced.values()), elapsed, stopped_early,
                     engine.metrics.summary(), lag)


class EngineFactory:
    """A fresh LLMEngine per run over one loaded model; the previous engine's KV pool is freed first."""

    def __init__(self, model, config, log):
        self.model, self.config, self._log = model, config, log
        self.current = None

    def fresh(self, **overrides):
        from .engine import LLMEngine
        self.release()
        self.current = LLMEngine(self.model, dataclasses.replace(self.config, **overrides), log=self._log)
        # Every later run gets the pool the first one sized from free memory; and logs quietly.
        self.config = dataclasses.replace(self.config, num_blocks=self.current.kv_pool.num_blocks)
        if self.current.decode_graphs is not None:  # capture now, as a server does at start, not in a timed run
            start = time.perf_counter()
            self.current.decode_graphs.capture_all()
            self._log(f"captured decode CUDA graphs for batch sizes {self.current.decode_graphs.captured_buckets} "
                      f"in {time.perf_counter() - start:.1f} s")
        self._log = lambda message: None
        return self.current

    def release(self):
        from kernels_numba.common import SIMULATOR, cuda
        self.current = None
        gc.collect()
        if not SIMULATOR:
            cuda.current_context().deallocations.clear()  # numba frees lazily; free now, before the next pool


def warm_up(engines: EngineFactory, log) -> None:
    """Compile every kernel a run uses: a multi-token prefill (gemm_blocked) of two requests, then decodes."""
    from .sampling_params import SamplingParams
    start = time.perf_counter()
    engine = engines.fresh()
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, seed=0)
    engine.generate([list(range(1, 11)), [3, 1, 4]], params)   # a multi-token prefill, then decodes
    engine.generate([[5, 9, 2]], params)                         # batch-1 prefill logits and decodes
    compile_decode_gemvs()
    synced_clock()
    log(f"warm-up (kernel compilation) {time.perf_counter() - start:.1f} s")


def compile_decode_gemvs() -> None:
    """gemv_coalesced is compiled once per token count (its accumulators are registers): compile every
    count a decode batch can have, so no timed step pays for it. Types, not shapes, pick the compilation."""
    from kernels_numba.common import SIMULATOR, cuda
    from kernels_numba.matmul import MAX_GEMV_TOKENS, gemv_coalesced
    if SIMULATOR:
        return
    w = cuda.to_device(np.zeros((4, 64), np.uint16))
    for tokens in range(1, MAX_GEMV_TOKENS + 1):
        gemv_coalesced(cuda.to_device(np.ones((tokens, 64), np.float32)), w)


# ---- tinyvllm workloads -----------------------------------------------------------------------------

def run_result(workload: str, system: str, variant: str, compare_key: str, record) -> dict:
    """The fields every result row has."""
    return {
        "workload": workload, "system": system, "variant": variant, "compare_key": compare_key,
        "num_requests": record.num_requests, "num_finished": record.num_finished,
        "num_errored": record.num_errored, "prompt_tokens": record.prompt_tokens,
        "requested_output_tokens": record.requested_output_tokens, "output_tokens": record.output_tokens,
        "elapsed_s": record.elapsed, "output_tok_s": record.output_tokens / record.elapsed if record.elapsed > 0 else 0.0,
        "stopped_early": record.stopped_early,
        "completed": record.num_finished == record.num_requests and not record.stopped_early,
    }


def latency_key(requests) -> str:
    return f"batch 1, {len(requests[0].prompt_ids)}+{requests[0].max_tokens}"


def bench_latency(engines, w: Workloads, cfg, log) -> list[dict]:
    record = drive_engine(engines.fresh(), w.latency, cfg.max_seconds, log, "latency")
    m = record.summary.requests[0]
    row = run_result("latency", "tinyvllm", latency_key(w.latency), latency_key(w.latency), record)
    row["ttft_ms"] = None if m.ttft is None else 1e3 * m.ttft
    row["tpot_ms"] = None if m.tpot is None else 1e3 * m.tpot
    if m.tpot is None and len(m.itls) > 0:       # stopped early: the decode steps it did get through
        row["tpot_ms"] = 1e3 * statistics.fmean(m.itls)
    return [row]


def bench_prefill(engines, w: Workloads, cfg, log) -> list[dict]:
    engine, rows = engines.fresh(), []
    deadline = time.perf_counter() + cfg.max_seconds
    for length, requests in w.prefill.items():
        ttfts = []
        for r in requests:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            record = drive_engine(engine, [r], left, log, f"prefill {length}")
            ttft = record.summary.requests[-1].ttft
            if ttft is not None:
                ttfts.append(ttft)
        row = prefill_row("tinyvllm", length, ttfts, len(requests))
        rows.append(row)
        log(f"  prefill {length}: TTFT {row['ttft_ms'] or float('nan'):.2f} ms (median of {len(ttfts)})")
    return rows


def prefill_row(system: str, length: int, ttfts: list[float], repeats: int) -> dict:
    median = statistics.median(ttfts) if ttfts else None
    return {
        "workload": "prefill", "system": system, "variant": f"prompt {length}", "compare_key": f"prompt {length}",
        "prompt_len": length, "num_requests": repeats, "num_finished": len(ttfts),
        "stopped_early": len(ttfts) < repeats, "completed": len(ttfts) == repeats,
        "ttft_ms": None if median is None else 1e3 * median, "ttft_ms_all": [1e3 * t for t in ttfts],
        "prefill_tok_s": None if not median else length / median,
    }


def bench_throughput(engines, w: Workloads, cfg, log) -> list[dict]:
    rows = []
    for mode in cfg.batching:
        log(f"throughput, {mode} batching: {len(w.throughput)} requests")
        record = drive_engine(engines.fresh(batching=mode), w.throughput, cfg.max_seconds, log, f"throughput {mode}")
        row = run_result("throughput", "tinyvllm", mode, "all requests", record)
        row.update(batching=mode, max_num_seqs=cfg.max_num_seqs)
        rows.append(row)
        log(f"  throughput {mode}: {row['output_tok_s']:.1f} output tok/s")
    return rows


def bench_serving(engines, w: Workloads, cfg, log) -> list[dict]:
    from .metrics import Stats
    log(f"serving: {len(w.serving)} requests at {cfg.request_rate:g} req/s")
    record = drive_engine(engines.fresh(batching="continuous"), w.serving, cfg.max_seconds, log, "serving")
    s = record.summary
    done = [m for m in s.requests if m.finish_reason not in (None, "error")]
    lag = lambda m: record.arrival_lag.get(str(m.request_id), 0.0)
    stats = {"ttft": Stats.of([m.ttft + lag(m) for m in done if m.ttft is not None]),
             "e2e": Stats.of([m.e2e + lag(m) for m in done if m.e2e is not None]),
             "itl": s.itl, "tpot": s.tpot, "queue": s.queue_time}
    row = run_result("serving", "tinyvllm", f"{cfg.request_rate:g} req/s", "serving", record)
    row["request_rate"] = cfg.request_rate
    row["request_throughput"] = record.num_finished / record.elapsed if record.elapsed > 0 else 0.0
    for name, st in stats.items():
        for q in ("mean", "p50", "p95", "p99"):
            value = getattr(st, q)
            row[f"{name}_{q}_ms"] = None if value is None else 1e3 * value
    row["arrival_lag_max_ms"] = 1e3 * max(record.arrival_lag.values(), default=0.0)
    row["engine_summary"] = {k: v for k, v in s.to_json_dict().items() if k not in ("requests",)}
    return [row]


KERNEL_STEPS = 2  # the latency prompt's prefill, then one decode step


def bench_kernels(engines, w: Workloads, cfg, log) -> list[dict]:
    """Per kernel: the latency prompt's prefill step and one batch-1 decode step, each stage synchronised,
    timed, and set against the bytes and FLOPs it must move and do (tinyvllm.stage_costs)."""
    from .sampling_params import SamplingParams
    from .stage_costs import stage_costs
    engine = engines.fresh()
    r = w.latency[0]
    engine.add_request(r.prompt_ids, SamplingParams(temperature=0.0, max_tokens=KERNEL_STEPS, ignore_eos=True))
    rows = []
    for phase in ("prefill", "decode"):
        seconds, kernels, counts = {}, {}, {}
        for stage in engine.step_stages(synchronize=True):
            if not stage.launched:  # its output came from an earlier stage's fused kernel
                continue
            kind = stage.name.split(".")[-1]
            seconds[kind] = seconds.get(kind, 0.0) + stage.seconds
            kernels[kind], counts[kind] = stage.kernel, counts.get(kind, 0) + 1
        batch = engine.last_batch
        costs = stage_costs(engine.model.config, batch, len(batch.logits_rows))
        for kind, elapsed in seconds.items():
            cost, n = costs[kind], counts[kind]
            rows.append({"workload": "kernels", "system": "tinyvllm", "variant": f"{phase} {kind}",
                         "compare_key": f"{phase} {kind}", "kernel": kernels[kind], "tokens": batch.num_tokens,
                         "launches_x": n, "ms": 1e3 * elapsed, "bytes": cost.bytes * n, "flops": cost.flops * n,
                         "gb_s": cost.bytes * n / elapsed / 1e9, "tflop_s": cost.flops * n / elapsed / 1e12})
        log(f"  kernels {phase}: {batch.num_tokens} tokens, {1e3 * sum(seconds.values()):.2f} ms in all stages")
    return rows


TINYVLLM_WORKLOADS = {"latency": bench_latency, "prefill": bench_prefill, "throughput": bench_throughput,
                      "serving": bench_serving, "kernels": bench_kernels}


# ---- HF transformers --------------------------------------------------------------------------------

def check_hf_available(device: str) -> None:
    """Fail before any work when --compare hf cannot run."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise TinyVLLMError(f"--compare hf needs torch and transformers (pip install -e '.[goldens]'), "
                            f"and a CUDA GPU: {e}") from e
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TinyVLLMError("--compare hf needs a CUDA GPU: torch sees none. HF transformers runs in bf16 on "
                            "the same GPU as tinyvllm; --hf-device cpu gives a slow functional dry run only")


@dataclass
class HFGeneration:
    seconds: float
    new_tokens: int          # generate steps run (every row of the batch gets this many)
    stopped_early: bool
    token_times: list[float]  # seconds from the start to each step's token, device-synchronised

    @property
    def ttft(self) -> float:
        return self.token_times[0]

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None


class HFBaseline:
    """HF transformers' LlamaForCausalLM in bf16 on the tinyvllm model's own weights, driven by `generate`."""

    def __init__(self, model_dir: Path, device: str, log):
        import torch
        import transformers
        self.torch, self.device = torch, torch.device(device)
        start = time.perf_counter()
        self.model = load_hf_bf16(model_dir, self.device)
        self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.eos_ids = self.model.config.eos_token_id
        log(f"HF {self.version}: bf16 {self.model.config._attn_implementation} on {device}, "
            f"loaded in {time.perf_counter() - start:.1f} s")

    def clock(self) -> float:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def generate(self, prompts: list[list[int]], new_tokens: int, deadline: float) -> HFGeneration:
        """Greedy, exactly `new_tokens` per row (EOS suppressed until then), left padded; stops at deadline.
        A stopping criterion, which generate calls after every new token, clocks each step."""
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1

        token_times = []

        class ClockAndDeadline(StoppingCriteria):
            def __call__(criterion, input_ids, scores, **kwargs):
                now = self.clock()
                token_times.append(now - start)
                return torch.full((input_ids.shape[0],), now >= deadline, dtype=torch.bool, device=input_ids.device)

        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                  pad_token_id=0, eos_token_id=self.eos_ids)
        ids, mask = ids.to(self.device), mask.to(self.device)
        start = self.clock()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                      stopping_criteria=StoppingCriteriaList([ClockAndDeadline()]))
        seconds = self.clock() - start
        made = out.shape[1] - width
        assert len(token_times) == made, (len(token_times), made)
        return HFGeneration(seconds, made, made < new_tokens, token_times)

    def warm_up(self, log) -> None:
        start = time.perf_counter()
        self.generate([list(range(1, 11)), [3, 1, 4]], 3, math.inf)
        self.generate([[3, 1, 4, 1, 5]], 3, math.inf)
        log(f"HF warm-up {time.perf_counter() - start:.1f} s")


def load_hf_bf16(model_dir: Path, device):
    """goldens/hf_reference.py's load_hf_model with bf16 in place of float32 (sdpa attention, HF's default
    fast path): built from the config, weights loaded by hand, embeddings tied when the checkpoint ties them."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM
    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "sdpa"
    try:
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = LlamaForCausalLM._from_config(config, torch_dtype=torch.bfloat16)
    state = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        state.update({name: t.to(torch.bfloat16) for name, t in load_file(shard).items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if "lm_head.weight" in missing:
        assert config.tie_word_embeddings, "checkpoint has no lm_head.weight but embeddings are not tied"
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def hf_latency(hf: HFBaseline, w: Workloads, cfg, log) -> list[dict]:
    r = w.latency[0]
    g = hf.generate([r.prompt_ids], r.max_tokens, time.perf_counter() + cfg.max_seconds)
    row = hf_row("latency", latency_key(w.latency), latency_key(w.latency), 1, [r.max_tokens],
                 g.new_tokens, g.seconds, g.stopped_early)
    row["ttft_ms"] = 1e3 * g.ttft
    row["tpot_ms"] = None if g.tpot is None else 1e3 * g.tpot
    return [row]


def hf_prefill(hf: HFBaseline, w: Workloads, cfg, log) -> list[dict]:
    rows, deadline = [], time.perf_counter() + cfg.max_seconds
    for length, requests in w.prefill.items():
        ttfts = [hf.generate([r.prompt_ids], 1, deadline) for r in requests if time.perf_counter() < deadline]
        rows.append(prefill_row("hf", length, [g.ttft for g in ttfts if not g.stopped_early], len(requests)))
    return rows


def hf_throughput(hf: HFBaseline, w: Workloads, cfg, log) -> list[dict]:
    """Static batches in request order, each generating as many steps as its longest request asks for."""
    requests, size = w.throughput, cfg.hf_batch_size
    start = hf.clock()
    deadline = start + cfg.max_seconds
    useful = finished = 0
    stopped = False
    for i in range(0, len(requests), size):
        batch = requests[i:i + size]
        if time.perf_counter() >= deadline:
            stopped = True
            break
        g = hf.generate([r.prompt_ids for r in batch], max(r.max_tokens for r in batch), deadline)
        useful += sum(min(g.new_tokens, r.max_tokens) for r in batch)
        finished += sum(g.new_tokens >= r.max_tokens for r in batch)
        stopped = g.stopped_early
        log(f"  HF throughput: batch {i // size + 1}/{math.ceil(len(requests) / size)} done, "
            f"{useful} useful tokens")
    elapsed = hf.clock() - start
    row = hf_row("throughput", f"static x{size}", "all requests", len(requests), [r.max_tokens for r in requests],
                 useful, elapsed, stopped or finished < len(requests))
    row["num_finished"], row["batching"] = finished, f"static, batches of {size}"
    return [row]


def hf_row(workload, variant, compare_key, num_requests, requested, output_tokens, elapsed, stopped) -> dict:
    return {"workload": workload, "system": "hf", "variant": variant, "compare_key": compare_key,
            "num_requests": num_requests, "num_finished": num_requests if not stopped else 0,
            "requested_output_tokens": sum(requested), "output_tokens": output_tokens, "elapsed_s": elapsed,
            "output_tok_s": output_tokens / elapsed if elapsed > 0 else 0.0,
            "stopped_early": stopped, "completed": not stopped}


HF_WORKLOADS = {"latency": hf_latency, "prefill": hf_prefill, "throughput": hf_throughput}


# ---- the HBM roofline -------------------------------------------------------------------------------

def weight_bytes(config) -> int:
    """Bytes of bf16 weights one decode step reads: every tensor once (a tied lm_head is the embedding)."""
    from .weights import expected_tensor_shapes
    return sum(2 * math.prod(shape) for shape in expected_tensor_shapes(config).values())


def copy_bandwidth(nbytes: int, repeats: int = 5) -> dict:
    """Device-to-device copy bandwidth, counting bytes read + written (2 x size), best of `repeats`, timed
    with CUDA events (synchronised wall clock in the simulator, which has no event timing)."""
    from kernels_numba.common import SIMULATOR, cuda
    n = max(1, nbytes // 4)
    src = cuda.to_device(np.arange(n, dtype=np.uint32))   # not zeros: never time a copy of zeros
    dst = cuda.device_array(n, np.uint32)
    dst.copy_to_device(src)                                 # first touch
    times = []
    for _ in range(repeats):
        if SIMULATOR:
            start = synced_clock()
            dst.copy_to_device(src)
            times.append(synced_clock() - start)
        else:
            begin, end = cuda.event(), cuda.event()
            begin.record()
            dst.copy_to_device(src)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
    best = min(times)
    return {"bytes": 4 * n, "bytes_moved": 8 * n, "seconds": best, "gb_per_s": 8 * n / best / 1e9,
            "method": "numba DeviceNDArray.copy_to_device (cuMemcpyDtoD), best of %d" % repeats}


def add_roofline(rows: list[dict], weights: int, copy: dict) -> None:
    """Latency rows: weight bytes per decode step / TPOT, and that as a fraction of the copy bandwidth."""
    for row in rows:
        if row["workload"] == "latency" and row.get("tpot_ms"):
            achieved = weights / (row["tpot_ms"] / 1e3)
            row["decode_weight_gb_s"] = achieved / 1e9
            row["hbm_roofline_fraction"] = achieved / (copy["gb_per_s"] * 1e9)


# ---- report -----------------------------------------------------------------------------------------

HEADLINES = {   # workload -> (label, key); every row's table lines
    "latency": [("TTFT (ms)", "ttft_ms"), ("TPOT (ms)", "tpot_ms"), ("output tok/s", "output_tok_s"),
                ("decode weights GB/s", "decode_weight_gb_s"), ("HBM roofline fraction", "hbm_roofline_fraction")],
    "prefill": [("TTFT (ms)", "ttft_ms"), ("prefill tok/s", "prefill_tok_s")],
    "throughput": [("output tok/s", "output_tok_s"), ("requests done", "num_finished")],
    "serving": [(f"{name} {q} (ms)", f"{key}_{q}_ms") for name, key in (("TTFT", "ttft"), ("ITL", "itl"),
                                                                        ("E2E", "e2e"))
                for q in ("p50", "p95", "p99")] + [("output tok/s", "output_tok_s")],
    "kernels": [("ms (all layers)", "ms"), ("useful GB/s", "gb_s"), ("TFLOP/s", "tflop_s")],
}


CHART_METRICS = {"latency": ("output tok/s", "output_tok_s"), "prefill": ("TTFT (ms)", "ttft_ms"),
                 "throughput": ("output tok/s", "output_tok_s"), "serving": ("TTFT p50 (ms)", "ttft_p50_ms"),
                 "kernels": ("useful GB/s", "gb_s")}


def comparisons(rows: list[dict]) -> list[dict]:
    """tinyvllm / HF for each headline metric both measured on the same compare key."""
    hf = {(r["workload"], r["compare_key"]): r for r in rows if r["system"] == "hf"}
    out = []
    for r in rows:
        other = hf.get((r["workload"], r["compare_key"])) if r["system"] == "tinyvllm" else None
        for label, key in HEADLINES[r["workload"]] if other else []:
            a, b = r.get(key), other.get(key)
            if a is not None and b is not None:
                out.append({"workload": r["workload"], "variant": r["variant"], "hf_variant": other["variant"],
                            "metric": key, "tinyvllm": a, "hf": b, "ratio": a / b if b else None})
    return out


def format_report(report: dict) -> str:
    rows, ratios = report["results"], {(c["workload"], c["variant"], c["metric"]): c for c in report["comparisons"]}
    hf_on = any(r["system"] == "hf" for r in rows)
    m, copy = report["model"], report.get("copy_bandwidth")
    lines = [f"tinyvllm bench: {m['dir']} ({m['layers']} layers, hidden {m['hidden_size']}, "
             f"{m['weight_bytes'] / 1e9:.4g} GB of bf16 weights) on {report['environment']['device']}"]
    if copy:
        lines.append(f"copy bandwidth {copy['gb_per_s']:.1f} GB/s -> batch-1 decode roofline "
                     f"{copy['gb_per_s'] * 1e9 / m['weight_bytes']:.1f} tok/s")
    header = f"{'workload':<11}{'variant':<22}{'metric':<24}{'tinyvllm':>12}"
    header += f"{'HF':>12}{'tinyvllm/HF':>13}" if hf_on else ""
    lines += [header, "-" * len(header)]
    cell = lambda v: f"{'-':>12}" if v is None else f"{v:>12.4g}" if isinstance(v, float) else f"{v:>12}"
    hf_only = not any(r["system"] == "tinyvllm" for r in rows)  # an --hf-only run: its rows in the HF column
    for r in rows:
        if r["system"] != "tinyvllm" and not hf_only:
            continue
        variant = r["variant"] + (" *" if r.get("stopped_early") else "")
        if hf_only:
            lines += [f"{r['workload']:<11}{variant:<22}{label:<24}{cell(None)}{cell(r.get(key))}{'-':>13}"
                      for label, key in HEADLINES[r["workload"]]]
            continue
        for label, key in HEADLINES[r["workload"]]:
            line = f"{r['workload']:<11}{variant:<22}{label:<24}{cell(r.get(key))}"
            if hf_on:
                c = ratios.get((r["workload"], r["variant"], key))
                line += cell(c and c["hf"]) + (f"{c['ratio']:>13.3g}" if c and c["ratio"] else f"{'-':>13}")
            lines.append(line)
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def report_notes(rows: list[dict], cfg: BenchConfig) -> list[str]:
    notes = []
    for r in rows:
        if r.get("stopped_early"):
            notes.append(f"* {r['system']} {r['workload']} {r['variant']}: stopped at --max-seconds "
                         f"{cfg.max_seconds:g}: {r['num_finished']}/{r['num_requests']} requests done, "
                         f"{r.get('output_tokens', '-')} tokens")
    if any(r["system"] == "hf" for r in rows):
        notes.append(f"HF throughput: static batches of {cfg.hf_batch_size} in request order, left padded, each "
                     "batch runs to its longest request; only requested tokens count")
        if "serving" in cfg.workloads:
            notes.append("HF serving: not run (generate has no request-arrival API)")
    return notes


def write_outputs(report: dict, out_dir: Path, plot: bool, log) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / "bench.json", out_dir / "bench.csv"
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    flat = [{k: (";".join(f"{x:.6g}" for x in v) if isinstance(v, list) else v)
             for k, v in r.items() if not isinstance(v, dict)} for r in report["results"]]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(flat)
    written = [json_path, csv_path]
    if plot:
        png = draw_chart(report, out_dir / "bench.png", log)
        written += [png] if png else []
    return written


def draw_chart(report: dict, path: Path, log) -> Path | None:
    """One bar panel per workload (its CHART_METRICS entry, per variant and system); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in report["results"])]
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        label, key = CHART_METRICS[workload]
        rows = [r for r in report["results"] if r["workload"] == workload and r.get(key) is not None]
        ax.bar(range(len(rows)), [r[key] for r in rows],
               color=["tab:blue" if r["system"] == "tinyvllm" else "tab:orange" for r in rows])
        ax.set_xticks(range(len(rows)), [f"{r['variant']}\n{r['system']}" for r in rows], fontsize=7)
        ax.set_title(f"{workload}: {label}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    log(f"chart: {path}")
    return path


# ---- the command ------------------------------------------------------------------------------------

def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    m = p.add_mutually_exclusive_group()
    m.add_argument("--model", metavar="DIR", help="HF Llama model directory (default: the demo model)")
    m.add_argument("--random-1b", metavar="DIR",
                   help="a random Llama-3.2-1B-shaped model in DIR, written first if DIR has none")
    p.add_argument("--workload", dest="workloads", type=_name_list, default=d.workloads, metavar="LIST",
                   help=f"comma-separated, from {','.join(WORKLOADS)} (default: all)")
    p.add_argument("--out", default=d.out, metavar="DIR", help="where bench.json/.csv/.png go (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-seconds", type=float, default=d.max_seconds, metavar="S",
                   help="stop each run (workload x system x batching mode) after S seconds (default: %(default)s)")
    p.add_argument("--compare", choices=("hf",), help="also run HF transformers (bf16 generate) on the same GPU")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="only merge these bench.json files (e.g. a tinyvllm run and an --hf-only run) into --out")
    p.add_argument("--hf-only", action="store_true",
                   help="run only the HF side of --compare hf (e.g. on a second GPU beside a tinyvllm run)")
    p.add_argument("--hf-batch-size", type=int, default=d.hf_batch_size, metavar="N")
    p.add_argument("--hf-device", default=d.hf_device, help="cpu: a slow dry run of the HF path (default: cuda)")
    p.add_argument("--copy-mib", type=int, default=d.copy_mib, metavar="MIB",
                   help="size of the bandwidth-measuring copy (default: %(default)s)")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="no PNG chart even with matplotlib")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up (timings then include numba's compilation; for quick checks)")
    w = p.add_argument_group("workload sizes")
    w.add_argument("--latency-prompt", type=int, default=d.latency_prompt, metavar="N")
    w.add_argument("--latency-new-tokens", type=int, default=d.latency_new_tokens, metavar="N")
    w.add_argument("--prefill-lens", type=_int_list, default=d.prefill_lens, metavar="LIST")
    w.add_argument("--prefill-repeats", type=int, default=d.prefill_repeats, metavar="N")
    w.add_argument("--num-requests", type=int, default=d.num_requests, metavar="N", help="throughput requests")
    w.add_argument("--min-len", type=int, default=d.min_len, metavar="N", help="prompt (and output) length range")
    w.add_argument("--max-len", type=int, default=d.max_len, metavar="N")
    w.add_argument("--min-output-len", type=int, metavar="N", help="output length range (default: --min/max-len)")
    w.add_argument("--max-output-len", type=int, metavar="N")
    w.add_argument("--batching", type=_name_list, default=d.batching, metavar="LIST",
                   help="throughput modes (default: continuous,static)")
    w.add_argument("--serving-requests", type=int, default=d.serving_requests, metavar="N")
    w.add_argument("--request-rate", type=float, default=d.request_rate, metavar="R",
                   help="serving arrivals per second, Poisson (inf: all at once; default: %(default)s)")
    e = p.add_argument_group("engine")
    e.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, metavar="N",
                   help="sequences in flight; static batching runs batches of this size (default: %(default)s)")
    e.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens, metavar="N")
    e.add_argument("--block-size", type=int, default=d.block_size, metavar="N")
    e.add_argument("--num-blocks", type=int, metavar="N", help="KV blocks (default: from free GPU memory)")
    e.add_argument("--gpu-memory-fraction", type=float, default=d.gpu_memory_fraction, metavar="F")
    e.add_argument("--max-model-len", type=int, metavar="N", help="default: what the workloads need")
    e.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")


_FLAGS = {"workloads": "--workload", "enable_prefix_caching": "--no-prefix-caching", "plot": "--no-plot",
          "warmup": "--no-warmup"}


def command_line(cfg: BenchConfig) -> str:
    """The command that reproduces this configuration (flags for what differs from the defaults)."""
    default, parts = BenchConfig(), ["tinyvllm", "bench"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        flag = _FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):        # every boolean defaults to True; its flag turns it off
            parts.append(flag)
        else:
            parts += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return shlex.join(parts)


def config_from_args(args) -> BenchConfig:
    return BenchConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)})


def run(args) -> int:
    """The `tinyvllm bench` subcommand: exit status 0, or 1 when a request ended with an error."""
    if args.merge:
        return merge_reports([Path(p) for p in args.merge], Path(args.out), args.plot)
    return run_bench(config_from_args(args))


def merge_reports(paths: list[Path], out_dir: Path, plot: bool = True, log=None) -> int:
    """One report from several runs' bench.json (e.g. tinyvllm on one GPU and --hf-only on an identical
    second GPU of the same host, run at the same time): results joined, ratios and notes recomputed."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        reports = [json.loads(p.read_text()) for p in paths]
    except (OSError, ValueError) as e:
        raise TinyVLLMError(f"cannot read a report to merge: {e}") from e
    rows = [r for report in reports for r in report["results"]]
    merged = dict(reports[0], results=rows, comparisons=comparisons(rows),
                  notes=list(dict.fromkeys(n for report in reports for n in report["notes"])),
                  merged_from=[{"path": str(p), "command": r["command"], "environment": r["environment"],
                                "copy_bandwidth": r.get("copy_bandwidth")} for p, r in zip(paths, reports)])
    merged["environment"] = dict(reports[0]["environment"],
                                 hf=next((r["environment"]["hf"] for r in reports if r["environment"]["hf"]), None))
    written = write_outputs(merged, out_dir, plot, log)
    print(format_report(merged))
    log("wrote " + ", ".join(map(str, written)))
    return 0


def run_bench(cfg: BenchConfig, log=None) -> int:
    t0 = time.perf_counter()
    log = log or (lambda message: print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr,
                                        flush=True))
    if cfg.compare == "hf":
        check_hf_available(cfg.hf_device)
    from kernels_numba.common import SIMULATOR
    from .engine import EngineConfig
    from .model import default_model_dir, load_model
    model_dir = Path(cfg.model) if cfg.model else (prepare_random_model(Path(cfg.random_1b), log=log)
                                                   if cfg.random_1b else default_model_dir())
    model = load_model(model_dir, log=log)
    c = model.config
    max_model_len = min(cfg.max_model_len or cfg.needed_model_len(), c.max_position_embeddings)
    engine_config = EngineConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
        num_blocks=cfg.num_blocks, gpu_memory_fraction=cfg.gpu_memory_fraction, max_model_len=max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching)
    workloads = Workloads.make(cfg, c.vocab_size, max_model_len)
    engines = EngineFactory(model, engine_config, log)
    if cfg.warmup and not cfg.hf_only:
        warm_up(engines, log)

    copy_bytes = SIMULATOR_COPY_BYTES if SIMULATOR else cfg.copy_mib << 20
    copy = copy_bandwidth(copy_bytes)
    log(f"copy bandwidth: {copy['gb_per_s']:.1f} GB/s ({copy['bytes'] / 2**20:.0f} MiB device to device)")
    rows: list[dict] = []
    for name in cfg.workloads if not cfg.hf_only else ():
        log(f"tinyvllm {name}")
        rows += TINYVLLM_WORKLOADS[name](engines, workloads, cfg, log)
    engines.release()
    hf_version = None
    if cfg.compare == "hf":
        hf = HFBaseline(model_dir, cfg.hf_device, log)
        hf_version = hf.version
        if cfg.warmup:
            hf.warm_up(log)
        for name in cfg.workloads:
            if name in HF_WORKLOADS:
                log(f"HF {name}")
                rows += HF_WORKLOADS[name](hf, workloads, cfg, log)
        del hf
    wbytes = weight_bytes(c)
    add_roofline(rows, wbytes, copy)
    report = {
        "format": "tinyvllm-bench/1",
        "command": command_line(cfg),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment(hf_version),
        "model": {"dir": str(model_dir), "layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
                  "vocab_size": c.vocab_size, "weight_bytes": wbytes},
        "config": dataclasses.asdict(cfg),
        "engine_config": dataclasses.asdict(engines.config),
        "copy_bandwidth": copy,
        "results": rows,
        "comparisons": comparisons(rows),
        "notes": report_notes(rows, cfg),
        "wall_seconds": time.perf_counter() - t0,
    }
    written = write_outputs(report, Path(cfg.out), cfg.plot, log)
    print(format_report(report))
    log("wrote " + ", ".join(map(str, written)))
    return 1 if any(r.get("num_errored") for r in rows) else 0


def environment(hf_version: str | None) -> dict:
    import numba
    from kernels_numba.common import SIMULATOR, cuda
    if SIMULATOR:
        device = "numba CUDA simulator"
    else:
        name = cuda.get_current_device().name
        device = name.decode() if isinstance(name, bytes) else str(name)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"device": device, "simulator": SIMULATOR, "python": platform.python_version(),
            "numba": numba.__version__, "numpy": np.__version__, "hf": hf_version, "git_commit": commit}


# ---- the random 1B model ----------------------------------------------------------------------------

def prepare_random_model(model_dir: Path, config_dict: dict | None = None, log=print) -> Path:
    """A seeded random model (Llama-3.2-1B-shaped by default) in model_dir, written only if missing, with a
    tokenizer: Meta's Llama 3 one when llama-models is installed (as scripts/gpu_compare.py builds it), else a
    placeholder word-level vocabulary of the right size (the benchmark feeds token ids, never text)."""
    from .random_model import LLAMA_3_2_1B_CONFIG, write_random_model
    config_dict = config_dict or LLAMA_3_2_1B_CONFIG
    if not (model_dir / "config.json").is_file() or not (model_dir / "model.safetensors").is_file():
        start = time.perf_counter()
        write_random_model(model_dir, config_dict, seed=0)
        log(f"wrote random weights to {model_dir} in {time.perf_counter() - start:.1f} s")
    if not (model_dir / "tokenizer.json").is_file():
        if not _write_llama3_tokenizer(model_dir, config_dict["vocab_size"]):
            write_placeholder_tokenizer(model_dir, config_dict["vocab_size"])
            log(f"wrote a placeholder {config_dict['vocab_size']}-token tokenizer to {model_dir}")
    return model_dir


def _write_llama3_tokenizer(model_dir: Path, vocab_size: int) -> bool:
    try:
        from tests.llama3_vocab import meta_tokenizer_model_path, write_llama3_tokenizer_files
    except ImportError:
        return False
    if vocab_size != 128256 or meta_tokenizer_model_path() is None:
        return False
    write_llama3_tokenizer_files(model_dir)
    return True


def write_placeholder_tokenizer(model_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    backend = Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(vocab_size)}, unk_token="<t0>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text("{}\n")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main
    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
