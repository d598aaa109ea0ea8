"""The engine loop without HTTP: flat tables over many requests, no spinning, aborts, shutdown, back-pressure.

Most tests replace the model's math (forward pass and sampler) with a constant token, so the real
scheduler, block manager, metrics and request tables run thousands of requests in seconds; the test of
outputs runs the real demo model in the simulator.
"""
import threading
import time

import pytest

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.serving.engine_loop import (STEP_SAMPLES_KEPT, EngineLoop, LoopClosed, QueueFull, Update)

FAKE_TOKEN = 7  # not one of the demo model's EOS ids


def quiet(message):
    pass


@pytest.fixture(scope="module")
def model():
    return load_model(log=quiet)


def new_engine(model, **options) -> LLMEngine:
    options.setdefault("num_blocks", 64)
    options.setdefault("block_size", 4)
    return LLMEngine(model, EngineConfig(**options), log=quiet)


def eager(model, **options) -> LLMEngine:
    """An engine whose every step runs forward_stages and sample (which fake_math replaces), on any device."""
    return new_engine(model, cuda_graphs=False, prefill_graphs=False, **options)


def fake_math(engine: LLMEngine, step_seconds: float = 0.0) -> LLMEngine:
    """Every step samples FAKE_TOKEN for every row without running a kernel (taking `step_seconds`). The engine
    must run its steps eagerly: a step replayed from a CUDA graph (on a GPU by default) would run the real model."""
    assert engine.runner.decode_graphs is None and engine.runner.prefill_graphs is None, "build it with eager()"
    def forward_stages(batch, all_logits=False, synchronize=True):
        time.sleep(step_seconds)
        return None
        yield  # a generator, like the real one

    engine.runner.forward_stages = forward_stages
    engine.runner.sample = lambda logits, plan, schedule, greedy_ids=None: {
        seq.seq_id: FAKE_TOKEN for seq in schedule.sampling_seqs}
    return engine


class Collector:
    """A sink that keeps every update and signals each finished request."""

    def __init__(self):
        self.updates: dict[str, list[Update]] = {}
        self.finished: dict[str, Update] = {}
        self.done = threading.Condition()

    def __call__(self, updates):
        with self.done:
            for u in updates:
                self.updates.setdefault(u.request_id, []).append(u)
                if u.finished:
                    self.finished[u.request_id] = u
            self.done.notify_all()

    def wait(self, n: int, timeout: float = 60) -> None:
        with self.done:
            assert self.done.wait_for(lambda: len(self.finished) >= n, timeout), f"{len(self.finished)}/{n} finished"


def test_tables_stay_flat_over_2000_requests(model):
    engine = fake_math(eager(model, max_num_seqs=8))
    sizes = []

    class Probe:
        def on_step(self, report):
            sizes.append((len(engine._requests), len(engine._by_seq_id), len(engine.metrics._requests)))

    loop = EngineLoop(engine, max_waiting=8, observers=[Probe()], log=quiet).start()
    sink = Collector()
    params = SamplingParams(temperature=0, max_tokens=1)
    for i in range(2000):
        loop.submit([1 + i % 50, 2, 3], params, sink, block=True)  # back-pressure keeps <= 8 waiting
    sink.wait(2000)
    loop.stop()
    assert all(u.finish_reason == "length" and u.token_ids == [FAKE_TOKEN] for u in sink.finished.values())
    # in flight at most: 8 running + 8 waiting + what one inbox delivers; never the whole history
    assert max(max(s) for s in sizes) <= 24, max(sizes)
    assert (len(engine._requests), len(engine._by_seq_id), len(engine.metrics._requests)) == (0, 0, 0)
    assert len(engine.metrics._steps) <= STEP_SAMPLES_KEPT and engine.num_steps >= 2000 / 8
    assert not loop._sinks and not loop._live
    assert engine.block_manager.num_free_blocks == 64


def test_an_idle_loop_sleeps_and_wakes_for_a_new_request(model):
    engine = fake_math(eager(model))
    checks = []
    has_unfinished = engine.has_unfinished_requests
    engine.has_unfinished_requests = lambda: checks.append(1) or has_unfinished()
    loop = EngineLoop(engine, log=quiet).start()
    sink = Collector()
    loop.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=2), sink)
    sink.wait(1)
    time.sleep(0.05)
    before = (len(checks), engine.num_steps)
    time.sleep(0.3)
    assert (len(checks), engine.num_steps) == before  # waiting on the condition: no polling, no steps
    loop.submit([4, 5], SamplingParams(temperature=0, max_tokens=2), sink)
    sink.wait(2)
    assert engine.num_steps == before[1] + 2
    loop.stop()


def test_an_abort_frees_the_kv_blocks_and_ends_the_stream(model):
    engine = fake_math(eager(model, num_blocks=1024), step_seconds=0.002)
    loop = EngineLoop(engine, log=quiet).start()
    sink = Collector()
    rid = loop.submit(list(range(1, 30)), SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True), sink)
    with sink.done:
        sink.done.wait_for(lambda: rid in sink.updates)
    loop.abort(rid)
    sink.wait(1)
    last = sink.finished[rid]
    assert last.finish_reason == "abort" and 0 < len(last.token_ids) < 2000
    assert loop.state.kv_usage == 0 and engine.block_manager.num_free_blocks == 1024
    assert rid not in engine._requests
    loop.stop()


class StopWhen:
    """An observer that begins the loop's stop (with `timeout`) right after the step that reports the
    `num_tokens`-th token of `request_id`: the stop lands at a known point of that request, on any device."""

    def __init__(self, request_id: str, num_tokens: int, timeout: float):
        self.request_id, self.num_tokens, self.timeout = request_id, num_tokens, timeout
        self.loop: EngineLoop | None = None
        self.seen = 0
        self.step_in_flight = None  # whether a pipelined step was in flight when the stop began

    def on_step(self, report):
        before = self.seen
        self.seen += sum(len(u.new_token_ids) for u in report.updates if u.request_id == self.request_id)
        if before < self.num_tokens <= self.seen:
            self.step_in_flight = self.loop.engine.runner.in_flight is not None
            self.loop.begin_stop(self.timeout)


def test_stop_finishes_or_aborts_within_the_timeout_and_refuses_new_requests(model):
    # The stop begins after the short request's first token; 2 more fake steps take ~4 ms, far inside the 1 s
    # timeout, and the endless one needs 2045 more (over 4 s of sleeps alone): it can only end by the abort.
    engine = fake_math(eager(model, num_blocks=1024), step_seconds=0.002)
    stopper = StopWhen("short", num_tokens=1, timeout=1.0)
    loop = stopper.loop = EngineLoop(engine, observers=[stopper], log=quiet)
    sink = Collector()
    loop.submit([1, 2], SamplingParams(temperature=0, max_tokens=3), sink, request_id="short")
    loop.submit([1, 2], SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True), sink, request_id="endless")
    loop.start()
    sink.wait(2)
    loop.stop()
    assert sink.finished["short"].finish_reason == "length" and sink.finished["short"].token_ids == [FAKE_TOKEN] * 3
    endless = sink.finished["endless"]
    assert endless.finish_reason == "abort" and 0 < len(endless.token_ids) < 2046
    with pytest.raises(LoopClosed):
        loop.submit([1], SamplingParams(), sink)


@pytest.mark.slow  # the demo model in the simulator
def test_a_pipelined_step_launched_before_the_deadline_counts(model):
    # With CUDA graphs (the simulator re-runs the recorded pass) an all-greedy decode step is launched before the
    # previous one's tokens are read: when the short request's 2nd token is reported its 3rd (last) one is in
    # flight. A stop with no time left must read that step before aborting, as an eager step would have run
    # to its end: the short request ends "length" with generate's tokens.
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    expected = new_engine(model).generate([[1, 2]], params)[0].token_ids
    stopper = StopWhen("short", num_tokens=2, timeout=0)
    engine = new_engine(model, cuda_graphs=True, prefill_graphs=False)
    loop = stopper.loop = EngineLoop(engine, observers=[stopper], log=quiet)
    sink = Collector()
    loop.submit([1, 2], params, sink, request_id="short")
    loop.submit([3, 4], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), sink, request_id="long")
    loop.start()
    sink.wait(2)
    loop.stop()
    assert stopper.step_in_flight, "the stop began with no pipelined step in flight: the test misses its case"
    assert sink.finished["short"].finish_reason == "length" and sink.finished["short"].token_ids == expected
    assert sink.finished["long"].finish_reason == "abort" and len(sink.finished["long"].token_ids) < 40
    assert engine.block_manager.num_free_blocks == 64


def test_max_waiting_refuses_or_blocks_until_there_is_room(model):
    loop = EngineLoop(fake_math(eager(model)), max_waiting=2, log=quiet)  # not started: nothing leaves the queue
    sink = Collector()
    params = SamplingParams(temperature=0, max_tokens=1)
    loop.submit([1], params, sink)
    loop.submit([2], params, sink)
    with pytest.raises(QueueFull):
        loop.submit([3], params, sink)
    blocked = threading.Thread(target=loop.submit, args=([4], params, sink), kwargs={"block": True})
    blocked.start()
    time.sleep(0.2)
    assert blocked.is_alive()
    loop.start()
    blocked.join(timeout=30)
    assert not blocked.is_alive()
    sink.wait(3)
    loop.stop()


def test_a_failing_engine_fails_its_requests_and_the_loop_says_why(model):
    engine = fake_math(eager(model))
    loop = EngineLoop(engine, log=quiet)
    engine.step = lambda: 1 / 0
    sink = Collector()
    rid = loop.submit([1, 2], SamplingParams(temperature=0, max_tokens=2), sink)
    loop.start()
    sink.wait(1)
    assert sink.finished[rid].finish_reason == "error" and "ZeroDivisionError" in sink.finished[rid].error
    loop._thread.join(timeout=10)
    assert not loop.alive and isinstance(loop.error, ZeroDivisionError)
    with pytest.raises(LoopClosed, match="ZeroDivisionError"):
        loop.submit([1], SamplingParams(), sink)


@pytest.mark.slow  # the demo model in the simulator
def test_the_loop_gives_what_generate_gives_with_requests_arriving_mid_run(model):
    prompts = ["The sun rose", "A small dog ran along the river", "Water"]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    offline = new_engine(model).generate(prompts, params)
    loop = EngineLoop(new_engine(model), log=quiet).start()
    sink = Collector()
    first = loop.submit(prompts[0], params, sink)
    with sink.done:
        sink.done.wait_for(lambda: first in sink.updates)  # the others join a batch already running
    rest = [loop.submit(p, params, sink) for p in prompts[1:]]
    sink.wait(3)
    loop.stop()
    assert loop.engine.num_steps <= 6  # the later two joined the first's batch (one after another: 9 steps)
    for rid, expected in zip([first] + rest, offline):
        got = sink.finished[rid]
        assert got.token_ids == expected.token_ids and got.text == expected.text
        assert [t for u in sink.updates[rid] for t in u.new_token_ids] == expected.token_ids
        assert got.metrics.output_tokens == 3 and got.metrics.ttft is not None
