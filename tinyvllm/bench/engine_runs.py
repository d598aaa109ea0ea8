"""Running the workloads through tinyvllm: a fresh engine per run, warm-up, synchronised clocks."""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from tinyvllm.engine.gc_control import without_cyclic_gc
from tinyvllm.bench.config import KERNEL_STEPS, PROGRESS_EVERY_S
from tinyvllm.bench.workloads import BenchRequest, Workloads


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
    """Add each request at its arrival time and step the engine until all finish or max_seconds pass (the cyclic
    garbage collector off meanwhile: gc_control)."""
    with without_cyclic_gc():  # as eval scores: a full collection would pause a large run mid-measurement
        return _drive(engine, requests, max_seconds, log, label)


def _drive(engine, requests: list[BenchRequest], max_seconds: float, log, label: str) -> RunRecord:
    from tinyvllm.engine.sampling_params import SamplingParams
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
        from tinyvllm.engine.engine import LLMEngine
        self.release()
        self.current = LLMEngine(self.model, dataclasses.replace(self.config, **overrides), log=self._log)
        # Every later run gets the pool the first one sized from free memory; and logs quietly.
        self.config = dataclasses.replace(self.config, num_blocks=self.current.kv_pool.num_blocks)
        self.current.capture_graphs(self._log)  # now, not in a timed run
        self._log = lambda message: None
        return self.current

    def set_batch_invariant(self, invariant: bool) -> None:
        """The engines of the runs that follow: EngineConfig.batch_invariant = invariant."""
        self.config = dataclasses.replace(self.config, batch_invariant=invariant)

    def ran_batch_invariant(self) -> bool:
        """Whether the latest engine's kernel plan was asked for batch invariance (what the run's rows record:
        the engine's, not the flag's)."""
        return self.current.runner.forward_pass.plan.batch_invariant

    def release(self):
        from kernels_numba.common import SIMULATOR, cuda
        self.current = None
        gc.collect()
        if not SIMULATOR:
            cuda.current_context().deallocations.clear()  # numba frees lazily; free now, before the next pool


def warm_up(engines: EngineFactory, log) -> None:
    """Compile every kernel a run uses: a multi-token prefill (gemm_blocked) of two requests, then decodes."""
    from tinyvllm.engine.sampling_params import SamplingParams
    start = time.perf_counter()
    engine = engines.fresh()
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, seed=0)
    engine.generate([list(range(1, 11)), [3, 1, 4]], params)   # a multi-token prefill, then decodes
    engine.generate([[5, 9, 2]], params)                         # batch-1 prefill logits and decodes
    compile_decode_gemvs(engine.model.weights.embed_tokens.dtype)
    synced_clock()
    log(f"warm-up (kernel compilation) {time.perf_counter() - start:.1f} s")


def compile_decode_gemvs(weight_dtype=np.uint16) -> None:
    """gemv_coalesced is compiled once per token count (its accumulators are registers): compile every
    count a decode batch can have, for the model's weight dtype, so no timed step pays for it. Types, not
    shapes, pick the compilation."""
    from kernels_numba.common import SIMULATOR, cuda
    from kernels_numba.matmul import MAX_GEMV_TOKENS, gemv_coalesced
    if SIMULATOR:
        return
    w = cuda.to_device(np.zeros((4, 64), weight_dtype))
    for tokens in range(1, MAX_GEMV_TOKENS + 1):
        gemv_coalesced(cuda.to_device(np.ones((tokens, 64), np.float32)), w)


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
    from tinyvllm.engine.metrics import Stats
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


def bench_kernels(engines, w: Workloads, cfg, log) -> list[dict]:
    """Per kernel: the latency prompt's prefill step and one batch-1 decode step, each stage synchronised,
    timed, and set against the bytes and FLOPs it must move and do (tinyvllm.bench.stage_costs)."""
    from tinyvllm.engine.sampling_params import SamplingParams
    from tinyvllm.bench.stage_costs import stage_costs
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
        costs = stage_costs(engine.model.config, batch, len(batch.logits_rows),
                            fused=engine.runner.forward_pass.fuses_norms(batch.num_tokens),
                            weight_bytes=engine.model.weights.embed_tokens.dtype.itemsize,
                            kv_element_bytes=engine.kv_pool.layer(0)[0].dtype.itemsize)
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
