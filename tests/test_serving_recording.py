"""The engine loop's recording of arrivals and aborts, and their replay at the recorded steps.

The model's math is replaced by a constant token (test_serving_engine_loop.fake_math), so these run in well
under a second: what is checked is the step bookkeeping (an aborted request replays with exactly as many
tokens as it had when its client went away), not the numbers; test_serving_replay.py runs the real model.
"""
import json
import threading

from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.serving.engine_loop import EngineLoop
from tinyvllm.serving.recording import Recorder, read_recording
from tinyvllm.serving.replay import engine_config_for, format_report, replay
from tests.test_serving_engine_loop import Collector, fake_math, model, new_engine, quiet  # noqa: F401 (fixture)


def test_an_abort_is_recorded_and_the_abort_replays_at_its_step(model, tmp_path):
    path = tmp_path / "session.jsonl"
    engine = fake_math(new_engine(model), step_seconds=0.01)
    loop = EngineLoop(engine, log=quiet, recorder=Recorder.open(path, engine)).start()
    sink, some_tokens = Collector(), threading.Event()

    def watch(updates):
        sink(updates)
        if sum(len(u.new_token_ids) for u in sink.updates.get("long", [])) >= 3:
            some_tokens.set()

    loop.submit([5, 6, 7], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), watch, "long")
    assert some_tokens.wait(60)
    loop.submit([8, 9], SamplingParams(temperature=0.7, max_tokens=2, ignore_eos=True), watch, "short")
    loop.abort("long")
    sink.wait(2)
    loop.stop()
    kinds = [json.loads(line)["type"] for line in path.read_text().splitlines()]
    assert kinds == ["header", "request", "request", "abort", "finished", "finished"] or \
        kinds == ["header", "request", "request", "abort", "finished"] + ["finished"], kinds
    recording = read_recording(path)
    long, short = recording.requests
    assert long.finish_reason == "abort" and long.abort_step is not None and 3 <= len(long.token_ids) < 200
    assert long.token_ids == sink.finished["long"].token_ids == [t for u in sink.updates["long"] for t in u.new_token_ids]
    assert short.params["seed"] is not None and short.token_ids == sink.finished["short"].token_ids

    report = replay(recording, fake_math(new_engine(model), step_seconds=0.01))
    assert report.num_matched == 2 and not report.diverged, format_report(report)
    assert [r.replayed_steps for r in report.results] == [r.recorded_steps for r in report.results]
    assert engine_config_for(recording) == engine.config
