"""vLLM's serving metrics, named tinyvllm:* with a model_name label, for GET /metrics (Prometheus text).

Same meanings (and histogram buckets) as vLLM's v1 metrics:
  num_requests_running / num_requests_waiting     gauges: the running batch, the queue (preempted ones too)
  kv_cache_usage_perc                             gauge: fraction of KV blocks in use, 0..1
  prefix_cache_queries / prefix_cache_hits        counters, in tokens
  num_preemptions                                 counter
  prompt_tokens / generation_tokens               counters: prefilled prompt tokens, sampled tokens
  request_success{finished_reason}                counter: requests finished by stop / length / abort
  time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds,
  request_queue_time_seconds                      histograms over finished requests
  request_prompt_tokens, request_generation_tokens, iteration_tokens_total   histograms
tinyvllm adds request_errors (requests the engine finished with an error; vLLM has no such counter).
Each server has its own registry, so several can live in one process (tests do).
"""
from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tinyvllm.serving.engine_loop import StepReport

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def buckets_1_2_5(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


class PrometheusMetrics:
    def __init__(self, model_name: str, max_model_len: int):
        prometheus_client.disable_created_metrics()  # no *_created series (vLLM turns them off too)
        self.registry = r = CollectorRegistry()
        label = ["model_name"]

        def gauge(name, doc):
            return Gauge(f"tinyvllm:{name}", doc, label, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(f"tinyvllm:{name}", doc, label, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(f"tinyvllm:{name}", doc, label, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to run (preempted ones included).")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage: fraction of blocks in use, 1 = full.")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix-cache queries, in tokens.")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self.preemptions = counter("num_preemptions", "Preemptions (a running request's KV blocks freed).")
        self.prompt_tokens = counter("prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self._success = Counter("tinyvllm:request_success", "Requests finished, by finish reason.",
                                label + ["finished_reason"], registry=r)
        self._model_name = model_name
        self.errors = counter("request_errors", "Requests the engine finished with an error (tinyvllm only).")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token (s).", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between consecutive output tokens (s).", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish (s).", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to first scheduled (s).",
                                    REQUEST_LATENCY_BUCKETS)
        token_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per finished request.",
                                               token_buckets)
        self.request_generation_tokens = histogram("request_generation_tokens",
                                                   "Generated tokens per finished request.", token_buckets)
        self.iteration_tokens = histogram("iteration_tokens_total", "Tokens computed per engine step.",
                                          [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
        self._prefix = (0, 0)
        self._prefilled: set[str] = set()   # requests in flight whose prompt tokens were counted

    def on_step(self, report: StepReport) -> None:  # the engine loop's thread
        s = report.state
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        self.kv_usage.set(s.kv_usage)
        queries, hits = s.prefix_query_tokens, s.prefix_hit_tokens
        self.prefix_queries.inc(queries - self._prefix[0])
        self.prefix_hits.inc(hits - self._prefix[1])
        self._prefix = (queries, hits)
        self.preemptions.inc(report.num_preempted)
        if report.num_batched_tokens:
            self.iteration_tokens.observe(report.num_batched_tokens)
        for u in report.updates:
            self.generation_tokens.inc(len(u.new_token_ids))
            if u.new_token_ids and u.request_id not in self._prefilled:  # its first token: the prompt is in
                self._prefilled.add(u.request_id)
                self.prompt_tokens.inc(u.num_prompt_tokens)
            if not u.finished:
                continue
            self._prefilled.discard(u.request_id)
            if u.finish_reason == "error":
                self.errors.inc()
                continue
            self._success.labels(self._model_name, u.finish_reason).inc()
            m = u.metrics
            self.request_prompt_tokens.observe(u.num_prompt_tokens)
            self.request_generation_tokens.observe(m.output_tokens)
            for value, histogram in ((m.ttft, self.ttft), (m.e2e, self.e2e), (m.queue_time, self.queue_time)):
                if value is not None:
                    histogram.observe(value)
            for gap in m.itls:
                self.itl.observe(gap)

    def render(self, state=None) -> bytes:
        """The text exposition; `state` (an EngineState) refreshes the gauges first."""
        if state is not None:
            self.running.set(state.num_running)
            self.waiting.set(state.num_waiting)
            self.kv_usage.set(state.kv_usage)
        return generate_latest(self.registry)
