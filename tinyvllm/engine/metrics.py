"""Serving metrics in the shape of vLLM's benchmark_serving: per-request latencies and run aggregates.

The engine calls the `on_*` hooks with `time.perf_counter()` timestamps it takes itself (so tests can
feed exact times). Per request:
  queue time = first scheduled - arrival        TTFT = first output token - arrival
  ITL        = gaps between consecutive output tokens
  TPOT       = (E2E - TTFT) / (output tokens - 1)   (None for fewer than two output tokens)
  E2E        = finished - arrival
Aggregates are mean / p50 / p95 / p99 with linear-interpolation percentiles (numpy's default method,
"linear"), over completed requests only: a request that finished with reason "error" is counted apart,
one still running is counted as unfinished. ITL pools every gap of every completed request (as vLLM
does); TPOT and the rest take one value per request. Throughput divides by the run's wall time: first
to last timestamp the collector saw.

Objects are in seconds; `print(summary)` shows the table (`format_table`), `repr` one line. The JSON
(`MetricsSummary.to_json_dict`) names each number's unit in its key, as the table shows it: `_ms`
milliseconds, `_s` seconds (times of events count from the run's first timestamp), `_per_s` per second,
`_pct` percent; counts have no suffix. Latency stats are objects {count, mean, p50, p95, p99}.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

ERROR = "error"


@dataclass
class RequestMetrics:
    """One request; a field is None until the event it needs has happened. Times are in seconds."""
    request_id: int | str
    arrival_time: float
    prompt_tokens: int
    output_tokens: int = 0
    finish_reason: str | None = None
    queue_time: float | None = None
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    tpot: float | None = None
    e2e: float | None = None

    def __repr__(self) -> str:
        itl = f"ITL mean {_ms(sum(self.itls) / len(self.itls))} ({len(self.itls)} gaps)" if self.itls else "ITL -"
        return (f"<RequestMetrics {self.request_id}: {self.prompt_tokens} prompt + {self.output_tokens} output "
                f"tokens, {self.finish_reason or 'running'} · queue {_ms(self.queue_time)} · TTFT {_ms(self.ttft)} · "
                f"{itl} · TPOT {_ms(self.tpot)} · E2E {_ms(self.e2e)}>")

    def to_json_dict(self, start_time: float = 0.0) -> dict:
        """Units in the keys (module docstring); `arrival_s` counts from `start_time`."""
        return {"request_id": self.request_id, "arrival_s": self.arrival_time - start_time,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "finish_reason": self.finish_reason, "queue_time_ms": _to_ms(self.queue_time),
                "ttft_ms": _to_ms(self.ttft), "itls_ms": [1000.0 * x for x in self.itls],
                "tpot_ms": _to_ms(self.tpot), "e2e_ms": _to_ms(self.e2e)}


def _to_ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000.0 * seconds:.2f} ms"


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


@dataclass
class StepSample:
    """The engine's state after one step."""
    t: float
    num_running: int
    num_waiting: int
    kv_usage: float                 # fraction of KV blocks in use, 0..1
    num_batched_tokens: int
    prefix_hit_rate: float          # cumulative prefix-cache hits / lookups so far, 0..1


@dataclass
class Stats:
    """Mean and linear-interpolation percentiles of `count` values; all None when count is 0."""
    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        if not values:
            return cls()
        ordered = sorted(values)
        return cls(len(ordered), math.fsum(ordered) / len(ordered),
                   percentile(ordered, 50), percentile(ordered, 95), percentile(ordered, 99))


def percentile(ordered: list[float], q: float) -> float:
    """numpy.percentile(values, q, method="linear") of an ascending, non-empty list."""
    assert ordered and 0 <= q <= 100
    rank = q / 100 * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass
class MetricsSummary:
    num_requests: int                       # every request that arrived
    num_completed: int                      # finished with any reason but "error"
    num_errored: int
    num_unfinished: int
    start_time: float | None                # first timestamp seen (perf_counter clock)
    duration: float                         # first to last timestamp seen, seconds
    total_prompt_tokens: int                # over completed requests
    total_output_tokens: int                # over completed requests
    request_throughput: float               # completed requests / duration
    output_throughput: float                # completed requests' output tokens / duration
    queue_time: Stats
    ttft: Stats
    itl: Stats
    tpot: Stats
    e2e: Stats
    prompt_tokens: Stats
    output_tokens: Stats
    running_mean: float | None              # running / waiting / KV usage: plain means over steps
    running_max: int | None
    waiting_mean: float | None
    waiting_max: int | None
    kv_usage_mean: float | None
    kv_usage_max: float | None
    prefix_hit_rate: float | None           # the last step's cumulative rate
    requests: list[RequestMetrics]
    steps: list[StepSample]

    def __str__(self) -> str:
        return format_table(self)

    def __repr__(self) -> str:
        def p50(name):
            return _ms(getattr(self, name).p50)
        return (f"<MetricsSummary {self.num_requests} requests ({self.num_completed} completed, {self.num_errored} "
                f"errored, {self.num_unfinished} unfinished) in {self.duration:.3f} s · TTFT p50 {p50('ttft')} · "
                f"ITL p50 {p50('itl')} · TPOT p50 {p50('tpot')} · E2E p50 {p50('e2e')} · "
                f"{self.output_throughput:.2f} output tok/s>")

    def to_json_dict(self, request_extras: dict | None = None) -> dict:
        """Plain dicts, lists, numbers, strings and None, ready for json.dumps, with units in the keys (see
        the module docstring). `request_extras`: request id -> more fields for that request (its text)."""
        start = self.start_time or 0.0
        extras = request_extras or {}

        def stats(s: Stats, scale: float = 1.0) -> dict:
            return {"count": s.count, **{q: None if getattr(s, q) is None else scale * getattr(s, q)
                                         for q in ("mean", "p50", "p95", "p99")}}
        return {
            "num_requests": self.num_requests, "num_completed": self.num_completed,
            "num_errored": self.num_errored, "num_unfinished": self.num_unfinished,
            "duration_s": self.duration,
            "total_prompt_tokens": self.total_prompt_tokens, "total_output_tokens": self.total_output_tokens,
            "request_throughput_per_s": self.request_throughput,
            "output_throughput_tok_per_s": self.output_throughput,
            **{f"{name}_ms": stats(getattr(self, name), 1000.0) for _, name in _LATENCY_ROWS},
            **{name: stats(getattr(self, name)) for _, name in _TOKEN_ROWS},
            "running_mean": self.running_mean, "running_max": self.running_max,
            "waiting_mean": self.waiting_mean, "waiting_max": self.waiting_max,
            "kv_usage_mean_pct": _pct(self.kv_usage_mean), "kv_usage_max_pct": _pct(self.kv_usage_max),
            "prefix_hit_rate_pct": _pct(self.prefix_hit_rate),
            "requests": [{**m.to_json_dict(start), **extras.get(m.request_id, {})} for m in self.requests],
            "steps": [{"t_s": x.t - start, "num_running": x.num_running, "num_waiting": x.num_waiting,
                       "kv_usage_pct": 100.0 * x.kv_usage, "num_batched_tokens": x.num_batched_tokens,
                       "prefix_hit_rate_pct": 100.0 * x.prefix_hit_rate} for x in self.steps],
        }


@dataclass
class _RequestTimes:
    arrival: float
    prompt_tokens: int
    first_scheduled: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    finish_reason: str | None = None


class MetricsCollector:
    def __init__(self):
        self._requests: dict[int | str, _RequestTimes] = {}   # insertion order = arrival order
        self._steps: list[StepSample] = []
        self._first_time: float | None = None
        self._last_time: float | None = None

    def _saw(self, t: float) -> None:
        self._first_time = t if self._first_time is None else min(self._first_time, t)
        self._last_time = t if self._last_time is None else max(self._last_time, t)

    def _live(self, request_id, t: float) -> _RequestTimes:
        r = self._requests[request_id]
        assert r.finished is None, f"request {request_id!r} already finished"
        assert t >= r.arrival, f"request {request_id!r}: event at {t} before its arrival {r.arrival}"
        self._saw(t)
        return r

    def on_arrival(self, request_id, t: float, prompt_tokens: int) -> None:
        assert request_id not in self._requests, f"request {request_id!r} arrived twice"
        assert prompt_tokens >= 0
        self._requests[request_id] = _RequestTimes(arrival=t, prompt_tokens=prompt_tokens)
        self._saw(t)

    def on_scheduled(self, request_id, t: float) -> None:
        """Only the first call counts: a preempted request scheduled again keeps its queue time."""
        r = self._live(request_id, t)
        if r.first_scheduled is None:
            r.first_scheduled = t

    def on_token(self, request_id, t: float) -> None:
        r = self._live(request_id, t)
        assert not r.token_times or t >= r.token_times[-1], "output tokens must come in time order"
        r.token_times.append(t)

    def on_finished(self, request_id, t: float, finish_reason: str) -> None:
        r = self._live(request_id, t)
        assert not r.token_times or t >= r.token_times[-1], "finished before its last token"
        r.finished, r.finish_reason = t, finish_reason

    def on_step(self, t: float, num_running: int, num_waiting: int, kv_usage: float,
                num_batched_tokens: int, prefix_hit_rate: float) -> None:
        assert 0.0 <= kv_usage <= 1.0 and 0.0 <= prefix_hit_rate <= 1.0
        self._steps.append(StepSample(t, num_running, num_waiting, kv_usage, num_batched_tokens,
                                      prefix_hit_rate))
        self._saw(t)

    def forget(self, request_id) -> None:
        """Drop a finished request (a long-lived server keeps only what it still reports)."""
        r = self._requests.pop(request_id, None)
        assert r is None or r.finished is not None, f"request {request_id!r} is forgotten before it finished"

    def keep_last_steps(self, n: int) -> None:
        """From now on keep only the last n step samples (summary()'s step means then cover those)."""
        self._steps = deque(self._steps, maxlen=n)

    def request_metrics(self, request_id, as_of: tuple[int, bool] | None = None) -> RequestMetrics:
        """A request's metrics now, or `as_of` (output tokens, finished) an earlier moment: its first that
        many tokens, and its end only if it had finished (what a streamed output reports about its step)."""
        r = self._requests[request_id]
        token_times, finished = r.token_times, r.finished
        if as_of is not None:
            token_times, finished = token_times[:as_of[0]], finished if as_of[1] else None
        m = RequestMetrics(request_id, r.arrival, r.prompt_tokens, len(token_times),
                           r.finish_reason if finished is not None else None)
        if r.first_scheduled is not None:
            m.queue_time = r.first_scheduled - r.arrival
        if token_times:
            m.ttft = token_times[0] - r.arrival
            m.itls = [b - a for a, b in zip(token_times, token_times[1:])]
        if finished is not None:
            m.e2e = finished - r.arrival
            if m.output_tokens >= 2:
                m.tpot = (m.e2e - m.ttft) / (m.output_tokens - 1)
        return m

    def summary(self) -> MetricsSummary:
        requests = [self.request_metrics(rid) for rid in self._requests]
        completed = [m for m in requests if m.finish_reason not in (None, ERROR)]

        def stats(name: str) -> Stats:
            return Stats.of([getattr(m, name) for m in completed if getattr(m, name) is not None])

        duration = self._last_time - self._first_time if self._first_time is not None else 0.0
        total_output = sum(m.output_tokens for m in completed)
        steps = self._steps
        step_mean = lambda name: math.fsum(getattr(s, name) for s in steps) / len(steps) if steps else None
        step_max = lambda name: max(getattr(s, name) for s in steps) if steps else None
        return MetricsSummary(
            num_requests=len(requests),
            num_completed=len(completed),
            num_errored=sum(m.finish_reason == ERROR for m in requests),
            num_unfinished=sum(m.finish_reason is None for m in requests),
            start_time=self._first_time,
            duration=duration,
            total_prompt_tokens=sum(m.prompt_tokens for m in completed),
            total_output_tokens=total_output,
            request_throughput=len(completed) / duration if duration > 0 else 0.0,
            output_throughput=total_output / duration if duration > 0 else 0.0,
            queue_time=stats("queue_time"),
            ttft=stats("ttft"),
            itl=Stats.of([gap for m in completed for gap in m.itls]),
            tpot=stats("tpot"),
            e2e=stats("e2e"),
            prompt_tokens=stats("prompt_tokens"),
            output_tokens=stats("output_tokens"),
            running_mean=step_mean("num_running"),
            running_max=step_max("num_running"),
            waiting_mean=step_mean("num_waiting"),
            waiting_max=step_max("num_waiting"),
            kv_usage_mean=step_mean("kv_usage"),
            kv_usage_max=step_max("kv_usage"),
            prefix_hit_rate=steps[-1].prefix_hit_rate if steps else None,
            requests=requests,
            steps=list(steps),
        )


_LATENCY_ROWS = [("queue time", "queue_time"), ("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"),
                 ("E2E latency", "e2e")]
_TOKEN_ROWS = [("prompt tokens", "prompt_tokens"), ("output tokens", "output_tokens")]


def format_table(summary: MetricsSummary) -> str:
    """Fixed-width table: one row per metric (latencies in ms), then request counts and throughput."""
    def cell(value: float | None, scale: float) -> str:
        return f"{'-':>10}" if value is None else f"{value * scale:>10.2f}"

    def row(label: str, s: Stats, scale: float) -> str:
        return f"{label:<18}{s.count:>7}" + "".join(cell(v, scale) for v in (s.mean, s.p50, s.p95, s.p99))

    def fraction(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    s = summary
    lines = [f"{'metric':<18}{'count':>7}{'mean':>10}{'p50':>10}{'p95':>10}{'p99':>10}"]
    lines += [row(f"{label} (ms)", getattr(s, name), 1000.0) for label, name in _LATENCY_ROWS]
    lines += [row(label, getattr(s, name), 1.0) for label, name in _TOKEN_ROWS]
    lines.append("-" * len(lines[0]))
    lines += [
        f"requests: {s.num_requests} arrived, {s.num_completed} completed, {s.num_errored} errored, "
        f"{s.num_unfinished} unfinished",
        f"duration: {s.duration:.3f} s",
        f"request throughput: {s.request_throughput:.2f} req/s",
        f"output throughput: {s.output_throughput:.2f} tok/s",
        f"running: mean {number(s.running_mean)}, max {s.running_max if s.running_max is not None else '-'}",
        f"waiting: mean {number(s.waiting_mean)}, max {s.waiting_max if s.waiting_max is not None else '-'}",
        f"KV cache usage: mean {fraction(s.kv_usage_mean)}, max {fraction(s.kv_usage_max)}",
        f"prefix cache hit rate: {fraction(s.prefix_hit_rate)}",
    ]
    return "\n".join(lines)
