"""The server's live state as one small JSON object (GET /state), for a web page to poll.

Counters since start, plus rolling windows: latency percentiles over the last `window_requests` finished
requests, token throughput over the last `window_seconds`; for the page's charts, a per-second series of the
last `series_seconds` (LiveSeries) and a histogram of the recent TTFTs. Fed by the engine loop after every step
(its thread) and by the app for HTTP errors (the event loop's), read by /state: a lock guards it.
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from dataclasses import dataclass

from tinyvllm.engine.metrics import percentile
from tinyvllm.serving.engine_loop import EngineState, StepReport


# TTFT histogram buckets' upper bounds (ms), 1-2-5 steps: a GPU's milliseconds and the simulator's seconds alike
TTFT_BUCKETS_MS = tuple(m * 10 ** e for e in range(0, 5) for m in (1, 2, 5)) + (100_000,)


def ttft_histogram(ttfts_s) -> dict:
    """{"le_ms": upper bounds, "counts": one per bound plus one for above the last} of TTFTs given in seconds."""
    counts = [0] * (len(TTFT_BUCKETS_MS) + 1)
    for ttft in ttfts_s:
        counts[bisect.bisect_left(TTFT_BUCKETS_MS, 1000 * ttft)] += 1
    return {"le_ms": list(TTFT_BUCKETS_MS), "counts": counts}


@dataclass
class Second:
    """One second of the series: the tokens sampled in it, and the engine's state after its last step."""
    index: int                    # floor(t) of its steps' StepReport.t
    output_tokens: int
    running: int
    waiting: int
    kv_cache_usage: float


class LiveSeries:
    """The last `seconds` seconds, one sample each, for the page's charts. A second without a step (an idle
    engine does not step) repeats the state of the one before with no tokens; before the first step the engine
    was idle. Not thread-safe on its own (LiveStats holds the lock)."""

    def __init__(self, seconds: int = 300, start: float = 0.0):
        assert seconds >= 1
        self.seconds = seconds
        self._start = math.floor(start)
        self._samples: deque[Second] = deque(maxlen=seconds)

    def add(self, t: float, output_tokens: int, state: EngineState) -> None:
        index = math.floor(t)
        last = self._samples[-1] if self._samples else None
        assert last is None or index >= last.index, "steps arrive in time order"
        if last is None or index > last.index:
            last = Second(index, 0, 0, 0, 0.0)
            self._samples.append(last)
        last.output_tokens += output_tokens
        last.running, last.waiting, last.kv_cache_usage = state.num_running, state.num_waiting, state.kv_usage

    def rows(self, now: float) -> dict:
        """The whole seconds before `now` (the one under way is not over), oldest first, at most `seconds`."""
        end = math.floor(now)                       # the second under way; the last row is the one before it
        first = max(self._start, end - self.seconds)
        columns = {"output_tokens_per_s": [], "running": [], "waiting": [], "kv_cache_usage": []}
        by_index = {s.index: s for s in self._samples}
        before = [s for s in self._samples if s.index < first]
        carried = before[-1] if before else Second(first - 1, 0, 0, 0, 0.0)
        for index in range(first, end):
            sample = by_index.get(index)
            carried = sample or carried
            columns["output_tokens_per_s"].append(sample.output_tokens if sample else 0)
            columns["running"].append(carried.running)
            columns["waiting"].append(carried.waiting)
            columns["kv_cache_usage"].append(round(carried.kv_cache_usage, 4))
        return {"interval_s": 1, "seconds": self.seconds, **columns}


class LiveStats:
    def __init__(self, window_requests: int = 200, window_seconds: float = 10.0, series_seconds: int = 300,
                 clock=time.perf_counter):
        """`clock`: the time base of StepReport.t (time.perf_counter), read by snapshot."""
        self.window_seconds = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._series = LiveSeries(series_seconds, start=clock())
        self._ttft: deque[float] = deque(maxlen=window_requests)
        self._itl: deque[float] = deque(maxlen=window_requests)     # each request's mean ITL
        self._e2e: deque[float] = deque(maxlen=window_requests)
        self._tokens: deque[tuple[float, int]] = deque()           # (step end, tokens sampled in the step)
        self.finished = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.http_errors = {"4xx": 0, "5xx": 0}
        self.prompt_tokens = 0
        self.output_tokens = 0

    def on_step(self, report: StepReport) -> None:
        new_tokens = sum(len(u.new_token_ids) for u in report.updates)
        with self._lock:
            self.output_tokens += new_tokens
            self._tokens.append((report.t, new_tokens))
            self._trim(report.t)
            self._series.add(report.t, new_tokens, report.state)
            for u in report.updates:
                if not u.finished:
                    continue
                self.finished[u.finish_reason] = self.finished.get(u.finish_reason, 0) + 1
                m = u.metrics
                if u.finish_reason == "error" or m is None:
                    continue
                self.prompt_tokens += u.num_prompt_tokens
                if m.ttft is not None:
                    self._ttft.append(m.ttft)
                if m.itls:
                    self._itl.append(sum(m.itls) / len(m.itls))
                if m.e2e is not None:
                    self._e2e.append(m.e2e)

    def on_http_error(self, status: int) -> None:
        with self._lock:
            self.http_errors["5xx" if status >= 500 else "4xx"] += 1

    def _trim(self, now: float) -> None:
        while self._tokens and self._tokens[0][0] < now - self.window_seconds:
            self._tokens.popleft()

    def snapshot(self, state: EngineState, model_name: str, uptime_s: float, in_flight: int) -> dict:
        """The /state object (docs/serving.md lists its fields)."""
        def ms(values) -> dict:
            ordered = sorted(values)
            at = lambda q: round(1000 * percentile(ordered, q), 3) if ordered else None
            return {"p50": at(50), "p95": at(95), "count": len(ordered)}

        now = self._clock()
        with self._lock:
            self._trim(now)
            window_tokens = sum(n for _, n in self._tokens)
            return {
                "model": model_name,
                "uptime_s": round(uptime_s, 3),
                "engine_alive": state.alive,
                "steps": state.num_steps,
                "running": state.num_running,
                "waiting": state.num_waiting,
                "in_flight": in_flight,
                "kv_cache_usage": state.kv_usage,
                "kv_blocks": {"total": state.num_blocks, "used": round(state.kv_usage * state.num_blocks),
                              "block_size": state.block_size},
                "prefix_cache_hit_rate": (state.prefix_hit_tokens / state.prefix_query_tokens
                                          if state.prefix_query_tokens else None),
                "requests_finished": dict(self.finished),
                "http_errors": dict(self.http_errors),
                # the engine's failures only (Prometheus' request_errors_total): a client's 404 is not one
                "errors": self.finished.get("error", 0),
                "prompt_tokens_total": self.prompt_tokens,
                "output_tokens_total": self.output_tokens,
                "output_tokens_per_s": round(window_tokens / self.window_seconds, 3),
                "ttft_ms": ms(self._ttft),
                "itl_ms": ms(self._itl),
                "e2e_ms": ms(self._e2e),
                "window": {"requests": self._ttft.maxlen, "seconds": self.window_seconds},
                "series": self._series.rows(now),
                "ttft_histogram": ttft_histogram(self._ttft),
            }
