"""Serving metrics: hand-made timestamps, expected numbers derived here from the definitions.

Per-request values are compared exactly: the test does the same float subtractions the collector does.
Means and percentiles are compared to numpy with rel=1e-12: numpy sums pairwise and interpolates with a
different (but equivalent) lerp formula, so the two may differ in the last bit or two, never more.
"""
import json

import numpy as np
import pytest

from tinyvllm.engine.metrics import MetricsCollector, Stats, format_table, percentile

T0 = 1000.0  # perf_counter's origin is arbitrary; an offset catches code that forgets to subtract arrival

# request id -> (arrival, first scheduled, output token times, finished, finish reason, prompt tokens)
SCENARIO = {
    "a": (T0 + 0.00, T0 + 0.01, [T0 + 0.05, T0 + 0.07, T0 + 0.10, T0 + 0.16], T0 + 0.17, "stop", 7),
    "b": (T0 + 0.02, T0 + 0.04, [T0 + 0.09, T0 + 0.12, T0 + 0.13], T0 + 0.13, "length", 13),
    "c": (T0 + 0.03, T0 + 0.08, [T0 + 0.11, T0 + 0.19], T0 + 0.20, "stop", 5),
}


def feed(collector, scenario):
    """Replay the scenario's events in time order, as an engine would report them."""
    events = []
    for rid, (arrival, scheduled, tokens, finished, reason, prompt) in scenario.items():
        events.append((arrival, 0, lambda rid=rid, t=arrival, n=prompt: collector.on_arrival(rid, t, n)))
        events.append((scheduled, 1, lambda rid=rid, t=scheduled: collector.on_scheduled(rid, t)))
        events += [(t, 2, lambda rid=rid, t=t: collector.on_token(rid, t)) for t in tokens]
        if finished is not None:
            events.append((finished, 3,
                           lambda rid=rid, t=finished, r=reason: collector.on_finished(rid, t, r)))
    for _, _, call in sorted(events, key=lambda e: e[:2]):
        call()
    return collector


def expected(arrival, scheduled, tokens, finished):
    """The definitions, written out once more."""
    ttft = tokens[0] - arrival
    e2e = finished - arrival
    return dict(queue_time=scheduled - arrival, ttft=ttft, e2e=e2e,
                itls=[tokens[i + 1] - tokens[i] for i in range(len(tokens) - 1)],
                tpot=(e2e - ttft) / (len(tokens) - 1) if len(tokens) > 1 else None)


def assert_stats_match_numpy(stats: Stats, values):
    assert stats.count == len(values)
    assert stats.mean == pytest.approx(np.mean(values), rel=1e-12)
    for q in (50, 95, 99):
        assert getattr(stats, f"p{q}") == pytest.approx(np.percentile(values, q, method="linear"), rel=1e-12)


def test_per_request_metrics_follow_the_definitions():
    collector = feed(MetricsCollector(), SCENARIO)
    for rid, (arrival, scheduled, tokens, finished, reason, prompt) in SCENARIO.items():
        m = collector.request_metrics(rid)
        want = expected(arrival, scheduled, tokens, finished)
        assert (m.request_id, m.arrival_time, m.prompt_tokens) == (rid, arrival, prompt)
        assert m.output_tokens == len(tokens) and m.finish_reason == reason
        assert (m.queue_time, m.ttft, m.itls, m.tpot, m.e2e) == (
            want["queue_time"], want["ttft"], want["itls"], want["tpot"], want["e2e"])


def test_metrics_as_of_an_earlier_moment_see_only_what_had_happened():
    collector = feed(MetricsCollector(), SCENARIO)
    for rid, (arrival, scheduled, tokens, finished, reason, prompt) in SCENARIO.items():
        for n in range(len(tokens) + 1):
            m = collector.request_metrics(rid, as_of=(n, False))  # a streamed output after n tokens
            assert m.output_tokens == n and m.finish_reason is None and m.e2e is None and m.tpot is None
            assert m.ttft == (tokens[0] - arrival if n else None)
            assert m.itls == [tokens[i + 1] - tokens[i] for i in range(n - 1)]
        if finished is not None:  # the final output: the same as asking now
            assert collector.request_metrics(rid, as_of=(len(tokens), True)) == collector.request_metrics(rid)


def test_summary_percentiles_match_numpy_linear():
    s = feed(MetricsCollector(), SCENARIO).summary()
    per_request = [expected(*v[:4]) for v in SCENARIO.values()]
    for name in ("queue_time", "ttft", "tpot", "e2e"):
        assert_stats_match_numpy(getattr(s, name), [r[name] for r in per_request])
    # ITL pools every gap of every request: 3 + 2 + 1 = 6 values, not one mean per request.
    assert_stats_match_numpy(s.itl, [gap for r in per_request for gap in r["itls"]])
    assert_stats_match_numpy(s.prompt_tokens, [v[5] for v in SCENARIO.values()])
    assert_stats_match_numpy(s.output_tokens, [len(v[2]) for v in SCENARIO.values()])


@pytest.mark.parametrize("n", [1, 2, 5, 7, 101])
def test_percentile_matches_numpy_linear(rng, n):
    values = sorted(rng.exponential(0.05, size=n).tolist())
    for q in (0, 50, 95, 99, 100, 33.3):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q, method="linear"), rel=1e-12)


def test_throughput_and_counts():
    s = feed(MetricsCollector(), SCENARIO).summary()
    all_times = [t for v in SCENARIO.values() for t in (v[0], v[1], *v[2], v[3])]
    duration = max(all_times) - min(all_times)
    total_output = sum(len(v[2]) for v in SCENARIO.values())
    assert (s.num_requests, s.num_completed, s.num_errored, s.num_unfinished) == (3, 3, 0, 0)
    assert s.start_time == T0 and s.duration == duration
    assert s.total_output_tokens == total_output
    assert s.total_prompt_tokens == sum(v[5] for v in SCENARIO.values())
    assert s.output_throughput == total_output / duration
    assert s.request_throughput == 3 / duration


def test_error_requests_are_counted_apart_and_left_out_of_latencies():
    # "slow" has the longest TTFT and E2E of all: if it leaked into the percentiles, p99 would move.
    with_error = dict(SCENARIO, slow=(T0 + 0.01, T0 + 0.02, [T0 + 0.15, T0 + 0.18], T0 + 0.30, "error", 9))
    s = feed(MetricsCollector(), with_error).summary()
    clean = feed(MetricsCollector(), SCENARIO).summary()
    assert (s.num_requests, s.num_completed, s.num_errored) == (4, 3, 1)
    for name in ("queue_time", "ttft", "itl", "tpot", "e2e", "prompt_tokens", "output_tokens"):
        assert getattr(s, name) == getattr(clean, name), name
    assert s.total_output_tokens == clean.total_output_tokens
    assert s.ttft.p99 < with_error["slow"][2][0] - with_error["slow"][0]
    # Its own metrics are still there for whoever looks at it.
    slow = next(m for m in s.requests if m.request_id == "slow")
    assert slow.finish_reason == "error" and slow.e2e == T0 + 0.30 - (T0 + 0.01)


def test_single_output_token_has_no_itl_and_no_tpot():
    one = {"x": (T0, T0 + 0.01, [T0 + 0.04], T0 + 0.05, "stop", 3)}
    collector = feed(MetricsCollector(), one)
    m = collector.request_metrics("x")
    assert m.itls == [] and m.tpot is None and m.ttft == T0 + 0.04 - T0
    s = collector.summary()
    assert s.itl == Stats() and s.tpot == Stats()       # nothing to aggregate: count 0, all None
    assert s.ttft.count == 1 and s.ttft.p99 == m.ttft


def test_metrics_are_none_until_known_and_unfinished_requests_stay_out():
    collector = MetricsCollector()
    collector.on_arrival(1, T0, prompt_tokens=4)
    m = collector.request_metrics(1)
    assert (m.queue_time, m.ttft, m.tpot, m.e2e, m.finish_reason, m.itls) == (None, None, None, None, None, [])
    collector.on_scheduled(1, T0 + 0.02)
    collector.on_token(1, T0 + 0.05)
    collector.on_token(1, T0 + 0.06)
    m = collector.request_metrics(1)
    assert m.queue_time == T0 + 0.02 - T0 and m.ttft == T0 + 0.05 - T0
    assert m.tpot is None and m.e2e is None                 # both need the finish time
    s = collector.summary()
    assert (s.num_requests, s.num_completed, s.num_unfinished) == (1, 0, 1)
    assert s.ttft == Stats() and s.total_output_tokens == 0


def test_only_the_first_scheduling_counts():
    collector = MetricsCollector()
    collector.on_arrival("p", T0, prompt_tokens=4)
    collector.on_scheduled("p", T0 + 0.03)
    collector.on_scheduled("p", T0 + 0.09)                  # rescheduled after a preemption
    assert collector.request_metrics("p").queue_time == T0 + 0.03 - T0


def test_step_series_aggregates():
    collector = feed(MetricsCollector(), SCENARIO)
    steps = [(T0 + 0.05, 1, 2, 0.25, 17, 0.0), (T0 + 0.09, 3, 0, 0.75, 3, 0.4),
             (T0 + 0.13, 2, 0, 0.5, 2, 0.3)]
    for step in steps:
        collector.on_step(*step)
    s = collector.summary()
    running, waiting, kv = ([step[i] for step in steps] for i in (1, 2, 3))
    assert s.running_mean == pytest.approx(np.mean(running), rel=1e-12) and s.running_max == max(running)
    assert s.waiting_mean == pytest.approx(np.mean(waiting), rel=1e-12) and s.waiting_max == max(waiting)
    assert s.kv_usage_mean == pytest.approx(np.mean(kv), rel=1e-12) and s.kv_usage_max == max(kv)
    assert s.prefix_hit_rate == steps[-1][5]               # the engine reports a cumulative rate
    assert [tuple(vars(x).values()) for x in s.steps] == steps


def test_json_round_trip_keeps_requests_and_steps_with_units_in_the_keys():
    collector = feed(MetricsCollector(), SCENARIO)
    collector.on_step(T0 + 0.1, 3, 0, 0.5, 3, 0.25)
    s = collector.summary()
    d = s.to_json_dict({"a": {"text": "the output"}})
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert [r["request_id"] for r in d["requests"]] == list(SCENARIO)
    a = expected(*SCENARIO["a"][:4])
    first = d["requests"][0]
    assert first["itls_ms"] == pytest.approx([1000 * x for x in a["itls"]], rel=1e-12)
    assert first["ttft_ms"] == pytest.approx(1000 * a["ttft"], rel=1e-12)
    assert first["e2e_ms"] == pytest.approx(1000 * a["e2e"], rel=1e-12)
    assert first["arrival_s"] == 0.0 and d["requests"][1]["arrival_s"] == pytest.approx(0.02, rel=1e-9)
    assert first["text"] == "the output" and "text" not in d["requests"][1]
    assert d["steps"] == [dict(t_s=pytest.approx(0.1, rel=1e-9), num_running=3, num_waiting=0, kv_usage_pct=50.0,
                               num_batched_tokens=3, prefix_hit_rate_pct=25.0)]
    assert d["ttft_ms"]["p95"] == pytest.approx(1000 * s.ttft.p95, rel=1e-12) and d["num_completed"] == 3
    assert d["duration_s"] == s.duration and d["output_throughput_tok_per_s"] == s.output_throughput
    # every number the table shows is in the JSON, in the table's unit
    table = format_table(s)
    for label, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("E2E latency", "e2e_ms"), ("queue time", "queue_time_ms")):
        row = next(line for line in table.splitlines() if line.startswith(label)).split()[-4:]
        assert row == [f"{d[key][q]:.2f}" for q in ("mean", "p50", "p95", "p99")], label
    assert f"KV cache usage: mean {d['kv_usage_mean_pct']:.1f}%" in table
    assert f"output throughput: {d['output_throughput_tok_per_s']:.2f} tok/s" in table


def test_printing_a_summary_shows_the_table_and_its_repr_is_one_short_line():
    collector = feed(MetricsCollector(), SCENARIO)
    s = collector.summary()
    assert str(s) == format_table(s)
    assert "\n" not in repr(s) and len(repr(s)) < 250
    assert f"TTFT p50 {1000 * s.ttft.p50:.2f} ms" in repr(s) and "3 requests (3 completed" in repr(s)
    m = collector.request_metrics("a")
    assert "\n" not in repr(m) and len(repr(m)) < 200 and f"TTFT {1000 * m.ttft:.2f} ms" in repr(m)


def test_table_names_every_metric_and_shows_milliseconds():
    collector = feed(MetricsCollector(), SCENARIO)
    collector.on_step(T0 + 0.1, 3, 0, 0.5, 3, 0.25)
    s = collector.summary()
    table = format_table(s)
    for label in ("queue time", "TTFT", "ITL", "TPOT", "E2E latency", "prompt tokens", "output tokens",
                  "request throughput", "output throughput", "KV cache usage", "prefix cache hit rate"):
        assert label in table, label
    ttft_row = next(line for line in table.splitlines() if line.startswith("TTFT"))
    want = [f"{1000 * v:.2f}" for v in (s.ttft.mean, s.ttft.p50, s.ttft.p95, s.ttft.p99)]
    assert ttft_row.split()[-4:] == want
    assert f"{s.output_throughput:.2f} tok/s" in table
    widths = {len(line) for line in table.splitlines()[:8]}
    assert len(widths) == 1, "the metric rows are fixed-width"


def test_empty_run_summarizes_to_zero_requests():
    s = MetricsCollector().summary()
    assert (s.num_requests, s.num_completed, s.num_errored, s.num_unfinished) == (0, 0, 0, 0)
    assert s.duration == 0.0 and s.output_throughput == 0.0 and s.request_throughput == 0.0
    assert s.ttft == Stats() and s.kv_usage_mean is None and s.prefix_hit_rate is None
    assert s.requests == [] and s.steps == []
    d = s.to_json_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert "TTFT" in format_table(s)


def test_misuse_is_caught():
    collector = MetricsCollector()
    collector.on_arrival(1, T0, prompt_tokens=2)
    with pytest.raises(AssertionError):
        collector.on_arrival(1, T0, prompt_tokens=2)          # same id twice
    with pytest.raises(AssertionError):
        collector.on_token(1, T0 - 1.0)                       # before its arrival
    collector.on_finished(1, T0 + 0.1, "stop")
    with pytest.raises(AssertionError):
        collector.on_token(1, T0 + 0.2)                       # after it finished
    with pytest.raises(KeyError):
        collector.on_token(2, T0)                             # never arrived
