"""tinyvllm serve --debug and debug --replay: the debugger stepping an engine whose requests come from real
HTTP clients (the official openai client, on a free localhost port) or from a recording."""
import asyncio
import json
import threading
import time

import httpx
import pytest
from textual.widgets import DataTable

from debugger.app import DebuggerApp
from debugger.session import Breakpoint, Session
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.serving.server import listen
from debugger.serve_debug import _HTTP_CLIENT, HttpClient, ServerThread, replay_session, serving_session
from tinyvllm.serving.recording import read_recording

from .test_debugger_app import cells, settle, shown

pytestmark = pytest.mark.slow  # end to end: the debugger stepping a server's real HTTP clients

CONFIG = dict(num_blocks=64, block_size=4, max_num_seqs=8)


@pytest.fixture(scope="module")
def model():
    return load_model(None, log=lambda message: None)


@pytest.fixture
def served(model):
    """A debugger session whose feed is served over HTTP on a free port; stopped after the test."""
    engine = LLMEngine(model, EngineConfig(**CONFIG), log=lambda message: None)
    session, feed = serving_session(engine, None)
    server = ServerThread(feed, listen("127.0.0.1", 0), "tinyvllm-demo")
    feed.url = server.url
    feed.start()
    server.start()
    yield session, feed, server
    session.close()
    server.stop()
    assert not server.thread.is_alive()


def stream_client(url: str, prompt: str, max_tokens: int, received: list, **body):
    """A streamed completion from the openai client in a thread; `received` gets each chunk's token ids."""
    import openai
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def run():
        for chunk in client.completions.create(model="tinyvllm-demo", prompt=prompt, max_tokens=max_tokens,
                                               stream=True, **body,
                                               extra_body={"ignore_eos": True, "return_token_ids": True}):
            received.append((chunk.choices[0].token_ids or [], chunk.choices[0].finish_reason))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def tokens(received) -> int:
    return sum(len(ids) for ids, _ in received)


async def until(pilot, condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


def rows(app) -> list[list[str]]:
    table = app.query_one("#scheduler-table", DataTable)
    return [cells(table, i) for i in range(table.row_count)]


def test_pilot_steps_an_openai_streaming_client_token_by_token(served):
    session, feed, server = served
    app = DebuggerApp(session)
    received = []

    async def scenario(pilot):
        client = stream_client(server.url, "The sun rose", 3, received, temperature=0)
        await until(pilot, lambda: rows(app))          # shown as it arrives, while the engine is paused
        row = rows(app)[0]
        request_id = session.view().requests[0].request_id
        assert row[:2] == [request_id[:13] + "…-0", "arrived"] and request_id.startswith("cmpl-")
        assert row[2].startswith("127.0.0.1:") and row[3] == "greedy max 3" and row[4].startswith("arrived")
        await pilot.press("B", *"finished from 127.0.0.1", "enter")   # a standing breakpoint for c
        await pilot.pause(0.5)
        assert received == [] and session.engine.num_steps == 0   # paused: nothing ran by itself
        assert "breakpoints: finished from 127.0.0.1" in shown(app, "#scheduler-summary")
        for n in (1, 2):                                # d: one scheduler step, exactly one more token
            await pilot.press("d")
            await settle(pilot)
            await until(pilot, lambda: tokens(received) >= n)
            await pilot.pause(0.3)
            assert tokens(received) == n, received
            assert rows(app)[0][4] == f"streaming · {n} sent"
        await pilot.press("c")                          # serve freely until the breakpoint: the last token
        await settle(pilot)
        await asyncio.get_running_loop().run_in_executor(None, client.join, 120)
        assert tokens(received) == 3 and received[-1][1] == "length"
        assert rows(app)[0][4] == "done · 3 sent"
        assert shown(app, "#status").startswith(f"breakpoint: request {request_id} from {rows(app)[0][2]} finished")

        # a client that goes away while the server is paused: its request is aborted, its blocks freed
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{server.url}/v1/completions",
                             json={"prompt": "a river", "max_tokens": 8, "stream": True}) as response:
                await until(pilot, lambda: len(rows(app)) == 2)
                await pilot.press("d")
                await settle(pilot)
                assert session.engine.block_manager.usage > 0
        await until(pilot, lambda: rows(app)[1][4] == "client gone · aborted")
        assert session.engine.block_manager.usage == 0 and not session.in_step
        assert response.status_code == 200

    asyncio.run(_drive(app, scenario))


async def _drive(app, scenario, size=(170, 50)):
    async with app.run_test(size=size) as pilot:
        await scenario(pilot)
        await pilot.press("q")


def test_a_recorded_session_of_concurrent_clients_replays_token_for_token(served, tmp_path, monkeypatch):
    session, feed, server = served
    monkeypatch.chdir(tmp_path)                       # w records to ./tinyvllm-session.jsonl
    app = DebuggerApp(session)
    received = [[], [], []]
    bodies = [dict(temperature=0), dict(temperature=0.9, seed=7), dict(temperature=1.0)]  # the last: engine's seed

    async def scenario(pilot):
        await pilot.press("w")
        assert shown(app, "#status").startswith("recording to tinyvllm-session.jsonl")
        clients = [stream_client(server.url, p, 3, received[i], **bodies[i])
                   for i, p in enumerate(["The sun rose", "a small town"])]
        await until(pilot, lambda: len(rows(app)) == 2)
        await pilot.press("d")                        # both prefill in step 0
        await settle(pilot)
        clients.append(stream_client(server.url, "every morning bakers", 3, received[2], **bodies[2]))
        await until(pilot, lambda: len(rows(app)) == 3)
        await pilot.press("c")                        # the third joins at step 1; serve until all are done
        for c in clients:
            await asyncio.get_running_loop().run_in_executor(None, c.join, 120)
        await pilot.press("x")
        await settle(pilot)
        await pilot.press("w")
        assert shown(app, "#status").startswith("recording stopped: tinyvllm-session.jsonl")
    asyncio.run(_drive(app, scenario))
    assert [tokens(r) for r in received] == [3, 3, 3]

    recording = read_recording(tmp_path / "tinyvllm-session.jsonl")
    assert [r.step for r in recording.requests] == [0, 0, 1]
    assert [r.params["seed"] is not None for r in recording.requests] == [True] * 3
    sent = [[t for ids, _ in r for t in ids] for r in received]
    assert [r.token_ids for r in recording.requests] == sent
    # one recorded answer altered: the replay must find exactly that token, and match the others
    lines = (tmp_path / "tinyvllm-session.jsonl").read_text().splitlines()
    altered = recording.requests[1]
    for i, line in enumerate(lines):
        obj = json.loads(line)
        if obj["type"] == "finished" and obj["id"] == altered.request_id:
            obj["token_ids"][2] = (obj["token_ids"][2] + 1) % 300
            lines[i] = json.dumps(obj)
    (tmp_path / "altered.jsonl").write_text("\n".join(lines) + "\n")

    replay, replay_feed = replay_session(str(tmp_path / "altered.jsonl"))
    app = DebuggerApp(replay)

    async def replaying(pilot):
        assert [r[1] for r in rows(app)] == ["due", "due", "due"]
        await pilot.press("d")                        # step 0: the first two arrive and prefill
        await settle(pilot)
        assert [r[1] for r in rows(app)][2] == "due" and len(replay.engine.scheduler.running) == 2
        await pilot.press("c")
        await settle(pilot)
        assert shown(app, "#status").endswith("replay: 2/3 requests match token for token, 1 diverged (v: report)")
        assert [r[4] for r in rows(app)] == ["match", "DIVERGED at token 2", "match"]   # the stream column
        await pilot.press("v")
        report = str(app.screen.query_one("#report-text").render())
        assert f"{altered.request_id}: DIVERGED at token 2" in report
        assert all(f"{r.request_id}: match (3 tokens, length)" in report
                   for r in recording.requests if r is not altered)
        await pilot.press("escape")
    asyncio.run(_drive(app, replaying))


# ---- serving breakpoints, at the session level -----------------------------------------------------------
def submit(feed, prompt, client=None, **params):
    """What an HTTP handler does: submit into the feed's inbox, with the client in the context."""
    token = _HTTP_CLIENT.set(HttpClient(client) if client else None)
    try:
        return feed.submit(prompt, SamplingParams(temperature=0, ignore_eos=True, **params), lambda updates: None)
    finally:
        _HTTP_CLIENT.reset(token)


def within(seconds: float):
    """A `cancelled` for serve(): a breakpoint that never hits fails the test instead of hanging it."""
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def test_arrival_and_finished_from_a_client_breakpoints(model):
    session, feed = serving_session(LLMEngine(model, EngineConfig(**CONFIG), log=lambda m: None), None)
    feed.start()
    first = submit(feed, [5, 6, 7], "10.0.0.1:5000", max_tokens=2)
    session.breakpoints = [Breakpoint.parse("arrival 10.0.0.2")]
    second = []

    def progress(event):   # the second client comes once the first one's request is done
        if getattr(event, "finished", ()) == (first,):
            second.append(submit(feed, [8, 9], "10.0.0.2:6000", max_tokens=1))

    result = session.serve(within(120), progress)  # the first client's arrival is not a hit
    assert result.reason == "breakpoint" and result.detail == f"arrival: {second[0]} from 10.0.0.2:6000"
    assert result.event.request_ids == (second[0],) and session.engine.request(second[0]).seq.state == "waiting"
    session.breakpoints = [Breakpoint.parse("finished from 10.0.0.3"), Breakpoint.parse("finished from 10.0.0.2")]
    result = session.serve(within(120))
    assert result.detail == f"request {second[0]} from 10.0.0.2:6000 finished"
    assert [r.stream for r in session.view().requests] == ["done · 2 sent", "done · 1 sent"]
    assert [r.client for r in session.view().requests] == ["10.0.0.1:5000", "10.0.0.2:6000"]
    session.breakpoints = [Breakpoint.parse("arrival")]
    assert session.serve(cancelled=lambda: session.idle).reason == "cancelled"   # nothing more came


def test_kv_slow_and_preemption_breakpoints(model):
    # 4 blocks of 4 tokens: two 6-token prompts fill the pool at their 8th position, so one is preempted
    session = Session(LLMEngine(model, EngineConfig(num_blocks=4, block_size=4, max_num_seqs=4),
                                log=lambda m: None), None, [])
    for p in ([5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]):
        session.add_request(p, SamplingParams(temperature=0, ignore_eos=True, max_tokens=4))
    session.breakpoints = [Breakpoint.parse(s) for s in ("kv 60%", "slow 1", "preemption")]
    result = session.continue_to_end()
    assert result.detail == "KV usage rose above 60%: 0.0% -> 100.0%" and result.event.name == "embedding"
    result = session.continue_to_end()               # the rest of step 0 took more than 1 ms
    assert result.detail.startswith("step 0 took ") and result.event.seconds > 0.001
    del session.breakpoints[1]
    result = session.continue_to_end()
    assert result.detail == "preempted 1" and result.event.step == 3 and result.event.index == 0
    result = session.continue_to_end()               # 0 finished, 1 is prefilled again: above 60% again
    assert result.detail == "KV usage rose above 60%: 0.0% -> 75.0%"
    assert session.continue_to_end().reason == "idle"
    assert [r.finish_reason for r in session.view().requests] == ["length", "length"]


def test_prefix_hit_breakpoint(model):
    session = Session(LLMEngine(model, EngineConfig(**CONFIG), log=lambda m: None), None, [])
    session.breakpoints = [Breakpoint.parse("prefix-hit"), Breakpoint.parse("slow 100000")]   # never that slow
    session.add_request([40, 41, 42, 43, 44], SamplingParams(temperature=0, max_tokens=1))
    assert session.continue_to_end().reason == "idle"  # its first block is now cached
    second = session.add_request([40, 41, 42, 43, 45], SamplingParams(temperature=0, max_tokens=1))
    result = session.continue_to_end()
    assert result.detail == f"prefix-cache hit: {second} reuses 4 tokens" and result.event.name == "embedding"


@pytest.mark.parametrize("spec, kind, value, again", [
    ("arrival", "arrival", None, "arrival"), ("arrival 10.0.0.2", "arrival", "10.0.0.2", "arrival 10.0.0.2"),
    ("finished cmpl-*", "finished", "cmpl-*", "finished cmpl-*"),
    ("finished from 127.0.0.1:5000", "finished_from", "127.0.0.1:5000", "finished from 127.0.0.1:5000"),
    ("kv 80%", "kv", 0.8, "kv 80%"), ("kv 0.5", "kv", 0.5, "kv 50%"), ("preemption", "preemption", None, "preemption"),
    ("prefix-hit", "prefix_hit", None, "prefix-hit"), ("slow 50ms", "slow", 0.05, "slow 50ms")])
def test_serving_breakpoint_specs(spec, kind, value, again):
    breakpoint = Breakpoint.parse(spec)
    assert breakpoint == Breakpoint(kind, value) and breakpoint.describe() == again


@pytest.mark.parametrize("spec", ["kv 1.5", "kv", "slow -3", "slow x", "finished from", "preemption now"])
def test_bad_serving_breakpoint_specs_say_how_to_write_one(spec):
    with pytest.raises(ValueError, match="arrival \\[CLIENT\\] .* slow MS"):
        Breakpoint.parse(spec)


def test_debug_replay_and_serve_debug_errors_are_one_line(tmp_path, capsys):
    from tinyvllm.cli import main
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"type": "header", "format": "tinyvllm-recording", "version": 1}) + "\n{oops\n")
    cases = [(["debug", "--replay", str(tmp_path / "missing.jsonl")],
              f"error: cannot read the recording {tmp_path / 'missing.jsonl'}: No such file or directory"),
             (["debug", "--replay", str(bad)], f"error: {bad}:2: not JSON (Expecting property name enclosed in "
                                                f"double quotes at column 2)"),
             (["serve", "--debug", "--jsonl"], "error: --debug serves HTTP; it does not go with --jsonl")]
    for argv, message in cases:
        assert main(argv) == 1
        assert capsys.readouterr().err.strip().splitlines() == [message]


def test_a_recording_started_mid_session_leaves_out_the_requests_before_it(model, tmp_path):
    from tinyvllm.serving.engine_loop import Update
    from tinyvllm.serving.recording import Recorder
    engine = LLMEngine(model, EngineConfig(**CONFIG), log=lambda m: None)
    before = engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    path = tmp_path / "late.jsonl"
    recorder = Recorder.open(path, engine)                 # as `w` starts one while `before` is in flight
    after = engine.add_request([8, 9], SamplingParams(max_tokens=2, seed=4))
    recorder.request(engine, after)
    for request_id in (before, after):
        recorder.abort(engine, request_id)
        recorder.finished(engine, Update(request_id, [], finished=True, finish_reason="abort", token_ids=[1], text=""))
    recorder.close()
    recording = read_recording(path)                       # readable: no answer of a request it never saw
    assert [(r.request_id, r.abort_step, r.token_ids) for r in recording.requests] == [(after, 0, [1])]
    assert len(path.read_text().splitlines()) == 4         # header, request, abort, finished


def test_finished_and_arrival_breakpoints_match_id_globs_and_clients():
    from debugger.session import ArrivalRecord, StepRecord
    clients = {"cmpl-ab12-0": "10.0.0.2:6000", "chatcmpl-ff-0": "10.0.0.3:7000"}
    step = StepRecord(4, 0.1, 2, {}, ("chatcmpl-ff-0", "cmpl-ab12-0"))

    def hit(spec, event=step):
        return Breakpoint.parse(spec).hit(event, 1e-4, None, clients.get)
    assert hit("finished cmpl-*") == "request cmpl-ab12-0 finished"
    assert hit("finished chat*") == "request chatcmpl-ff-0 finished"
    assert hit("finished cmpl-ab12") is None                       # a glob, not a prefix
    assert hit("finished from 10.0.0.2") == "request cmpl-ab12-0 from 10.0.0.2:6000 finished"
    assert hit("finished from 10.0.0.3:7000") == "request chatcmpl-ff-0 from 10.0.0.3:7000 finished"
    assert hit("finished from 10.0.0.3:7001") is None and hit("finished from 10.0.0.9") is None
    arrival = ArrivalRecord(4, ("cmpl-ab12-0", "7"), ("10.0.0.2:6000", None))
    assert hit("arrival", arrival) == "arrival: cmpl-ab12-0 from 10.0.0.2:6000, 7"
    assert hit("arrival 10.0.0.2", arrival) == "arrival: cmpl-ab12-0 from 10.0.0.2:6000"
    assert hit("arrival 10.0.0.3", arrival) is None and hit("finished", arrival) is None


def record_two_requests(model, path):
    """A recording, made in-process, of two greedy requests that arrive together: one of 1 token, one of 3."""
    from tinyvllm.serving.engine_loop import Update
    from tinyvllm.serving.recording import Recorder
    engine = LLMEngine(model, EngineConfig(**CONFIG), log=lambda m: None)
    recorder = Recorder.open(path, engine)
    for prompt, n in (([5, 6, 7], 1), ([8, 9, 10, 11], 3)):
        recorder.request(engine, engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n,
                                                                           ignore_eos=True)))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                recorder.finished(engine, Update(out.request_id, [], finished=True, finish_reason=out.finish_reason,
                                                 token_ids=list(out.token_ids), text=""))
    recorder.close()
    return read_recording(path)


def test_v_before_a_replay_ends_compares_only_the_finished_requests(model, tmp_path):
    recording = record_two_requests(model, tmp_path / "two.jsonl")
    short, long = recording.requests
    session, feed = replay_session(str(tmp_path / "two.jsonl"))
    app = DebuggerApp(session)

    def report() -> str:
        return str(app.screen.query_one("#report-text").render())

    async def scenario(pilot):
        assert app.sub_title == "step 0 · replaying 2 requests"
        await pilot.press("v")
        assert report() == "0 of 2 requests finished so far: 0/0 match; run to the end (c) to verify the rest"
        await pilot.press("escape")
        await pilot.press("d")                       # step 0: both prefill, the 1-token request finishes
        await settle(pilot)
        await pilot.press("v")
        lines = report().splitlines()
        assert lines[0] == "1 of 2 requests finished so far: 1/1 match; run to the end (c) to verify the rest"
        assert f"{short.request_id}: match (1 tokens, length)" in lines
        assert "DIVERGED" not in report() and not any(line.startswith(f"{long.request_id}:") for line in lines)
        await pilot.press("escape")
        await pilot.press("c")
        await settle(pilot)
        assert app.sub_title == "step 3 · done"
        await pilot.press("v")
        assert "2/2 requests match token for token; 0 diverged" in report().splitlines()
        assert f"{long.request_id}: match (3 tokens, length)" in report().splitlines()
        await pilot.press("escape")
    asyncio.run(_drive(app, scenario))
    assert not feed.diverged


def test_serve_debug_waits_for_requests_rather_than_saying_done(model):
    engine = LLMEngine(model, EngineConfig(**CONFIG), log=lambda message: None)
    session, feed = serving_session(engine, None)
    app = DebuggerApp(session)

    async def scenario(pilot):
        await pilot.pause()
        assert app.sub_title == "step 0 · waiting for requests"
    asyncio.run(_drive(app, scenario))
