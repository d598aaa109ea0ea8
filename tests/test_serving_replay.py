"""Record a real `tinyvllm serve --record` session of concurrent openai clients, then replay it in-process.

The server is a subprocess on a free localhost port; three clients stream at once: greedy, sampled with a
client seed, and a sampled chat whose seed the engine chose. The replay with the recorded configuration must
give every request's tokens back; a shorter context (a different configuration) and a tampered recording must
be reported as divergences at the right token.
"""
import json
import re
import signal
import subprocess
import threading

import pytest

from tests.references import require

pytestmark = pytest.mark.slow  # end to end: a recording server process and a replay
openai = require("openai", "the serving tests' client: pip install -e '.[test-serving]'")

from tinyvllm.cli import main  # noqa: E402
from tinyvllm.engine.engine import LLMEngine  # noqa: E402
from tinyvllm.model.loader import load_model  # noqa: E402
from tinyvllm.serving.recording import FORMAT, VERSION, BadRecording, read_recording  # noqa: E402
from tinyvllm.serving.replay import engine_config_for, format_report, replay  # noqa: E402
from tests.test_serving_process import serve  # noqa: E402

MAX_TOKENS = 2
EXTRA = {"ignore_eos": True, "return_token_ids": True}
CHAT = [{"role": "user", "content": "Where is the river?"}]
CLIENTS = {  # name: (endpoint, request)
    "greedy": ("completions", dict(prompt="The sun rose", temperature=0)),
    "seeded": ("completions", dict(prompt="A small dog ran along the river", temperature=0.9, seed=1234)),
    "chat": ("chat", dict(messages=CHAT, temperature=1.0)),  # no seed: the engine picks one, the recording keeps it
}


def quiet(message):
    pass


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """(recording path, {client name: (token ids the client streamed, its server request id)})."""
    path = tmp_path_factory.mktemp("recording") / "session.jsonl"
    proc = serve("--port", "0", "--record", str(path), stderr=subprocess.PIPE)
    try:
        log = []
        for line in proc.stderr:
            log.append(line)
            if (m := re.search(r"on http://127\.0\.0\.1:(\d+)", line)):
                break
        assert m, "".join(log)
        threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{m.group(1)}/v1", api_key="unused", max_retries=0,
                               timeout=300)
        streamed, errors = {}, []

        def run(name):
            endpoint, request = CLIENTS[name]
            try:
                create = client.completions.create if endpoint == "completions" else client.chat.completions.create
                chunks = list(create(model="tinyvllm-demo", max_tokens=MAX_TOKENS, stream=True, extra_body=EXTRA,
                                     **request))
                ids = [t for c in chunks if c.choices for t in (c.choices[0].token_ids or [])]
                streamed[name] = (ids, chunks[0].id)
            except Exception as e:  # reported below, not lost in the thread
                errors.append(f"{name}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=run, args=(name,)) for name in CLIENTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return path, streamed


@pytest.fixture(scope="module")
def model():
    return load_model(log=quiet)


def _request_id(recording, server_id):
    """The engine's id of a client's request: the response id, plus the choice index."""
    return next(r.request_id for r in recording.requests if r.request_id.startswith(server_id))


def test_the_recording_holds_each_arrival_and_what_each_client_was_sent(session):
    path, streamed = session
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and (lines[0]["format"], lines[0]["version"]) == (FORMAT, VERSION)
    assert lines[0]["engine_config"]["block_size"] == 4 and lines[0]["engine_config"]["num_blocks"] == 64
    recording = read_recording(path)
    assert len(recording.requests) == len(CLIENTS)
    for name, (ids, server_id) in streamed.items():
        r = next(r for r in recording.requests if r.request_id == _request_id(recording, server_id))
        assert len(ids) == MAX_TOKENS and r.token_ids == ids and r.finish_reason == "length"
        assert r.endpoint == ("chat.completions" if name == "chat" else "completions")
        assert r.params["max_tokens"] == MAX_TOKENS and r.params["seed"] is not None
    by_name = {name: next(line for line in lines if line["type"] == "request"
                          and line["id"].startswith(server_id)) for name, (_, server_id) in streamed.items()}
    assert by_name["seeded"]["params"]["seed"] == 1234 and by_name["seeded"]["seed_from"] == "client"
    assert by_name["chat"]["seed_from"] == "engine" and by_name["chat"]["params"]["temperature"] == 1.0
    assert by_name["greedy"]["prompt_text"] == "The sun rose"


def test_replay_with_the_recorded_configuration_gives_every_token_back(session, model):
    path, _ = session
    recording = read_recording(path)
    report = replay(recording, LLMEngine(model, engine_config_for(recording), log=quiet))
    assert [r.replayed for r in report.results] == [r.token_ids for r in recording.requests], format_report(report)
    assert report.num_matched == len(CLIENTS) and not report.diverged and not report.config_differences
    # queued before the same step as on the server, so the same batches: finished at the same step too
    assert [r.replayed_steps for r in report.results] == [r.recorded_steps for r in report.results]
    assert [r.recorded_steps[1] for r in report.results] == [r.finish_step for r in recording.requests]
    assert "3/3 requests match token for token; 0 diverged" in format_report(report)
    assert "step" not in format_report(report).split("\n")[0]  # no step mismatch noted


def test_replay_with_a_shorter_context_reports_where_it_diverged(session, model):
    path, streamed = session
    recording = read_recording(path)
    longest = max(recording.requests, key=lambda r: len(r.prompt_token_ids))
    max_model_len = len(longest.prompt_token_ids) + MAX_TOKENS - 1  # room for one token fewer than recorded
    engine = LLMEngine(model, engine_config_for(recording, {"max_model_len": max_model_len}), log=quiet)
    report = replay(recording, engine)
    diverged = {r.request_id: r for r in report.diverged}
    assert longest.request_id in diverged, format_report(report)
    assert diverged[longest.request_id].diverged_at == MAX_TOKENS - 1
    assert report.config_differences == {"max_model_len": (None, max_model_len)}
    text = format_report(report)
    assert f"{longest.request_id}: DIVERGED at token {MAX_TOKENS - 1}: recorded " in text
    assert "engine configuration differs from the recording: max_model_len None -> " in text


def test_bench_replay_reports_a_tampered_token_and_exits_1(session, tmp_path, capsys):
    path, streamed = session
    recording = read_recording(path)
    seeded = _request_id(recording, streamed["seeded"][1])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        if line["type"] == "finished" and line["id"] == seeded:
            line["token_ids"][1] = (line["token_ids"][1] + 1) % 640
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["bench", "--replay", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"^{seeded}: DIVERGED at token 1: recorded \d+, replayed \d+", out, re.M), out
    assert "2/3 requests match token for token; 1 diverged" in out


@pytest.mark.parametrize("content, message", [
    ("", "empty: not a tinyvllm recording"),
    ('{"type": "request"}\n', ":1: not a tinyvllm recording"),
    (f'{{"type": "header", "format": "{FORMAT}", "version": 99}}\n', ":1: recording format version 99"),
    (f'{{"type": "header", "format": "{FORMAT}", "version": {VERSION}}}\n{{"type": "request"\n', ":2: not JSON"),
    (f'{{"type": "header", "format": "{FORMAT}", "version": {VERSION}}}\n'
     '{"type": "finished", "id": "x", "step": 1, "token_ids": []}\n', ":2: finished of request 'x', which was not"),
    (f'{{"type": "header", "format": "{FORMAT}", "version": {VERSION}}}\n'
     '{"type": "request", "id": "x", "t": 0, "step": 0, "prompt_token_ids": [1, "a"], "params": {}}\n',
     ":2: prompt_token_ids must be a non-empty list of integers"),
    (f'{{"type": "header", "format": "{FORMAT}", "version": {VERSION}}}\n'
     '{"type": "request", "id": "x", "t": 0, "step": -1, "prompt_token_ids": [1], "params": {}}\n',
     ":2: field 'step' must be >= 0"),
])
def test_a_bad_recording_is_one_line_naming_file_and_line(tmp_path, capsys, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(BadRecording, match=re.escape(message)):
        read_recording(path)
    assert main(["bench", "--replay", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and message in err and "Traceback" not in err


def test_bad_recorded_sampling_parameters_name_the_line(tmp_path, model):
    path = tmp_path / "bad.jsonl"
    path.write_text(f'{{"type": "header", "format": "{FORMAT}", "version": {VERSION}}}\n'
                    '{"type": "request", "id": "x", "t": 0, "step": 0, "prompt_token_ids": [1], '
                    '"params": {"temperature": -1}}\n')
    with pytest.raises(BadRecording, match=re.escape(f"{path}:2: request 'x': temperature must be")):
        replay(read_recording(path), LLMEngine(model, log=quiet))
