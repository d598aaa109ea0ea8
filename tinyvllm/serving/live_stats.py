"""The server's live state as one small JSON object (GET /state), for a web page to poll.

Counters since start, plus rolling windows: latency percentiles over the last `window_requests` finished
requests, token throughput over the last `window_seconds`. Fed by the engine loop after every step (its
thread) and by the app for HTTP errors (the event loop's), read by /state: a lock guards it.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from tinyvllm.engine.metrics import percentile
from tinyvllm.serving.engine_loop import EngineState, StepReport


class LiveStats:
    def __init__(self, window_requests: int = 200, window_seconds: float = 10.0):
        self.window_seconds = window_seconds
        self._lock = threading.Lock()
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

        with self._lock:
            self._trim(time.perf_counter())
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
            }
