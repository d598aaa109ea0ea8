"""`tinyvllm serve` as a user runs it: a subprocess that exits 0 on SIGTERM, and the JSONL loop on stdin."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.references import require

pytestmark = pytest.mark.slow  # end to end: a server process
httpx = require("httpx", "the serving tests' client: pip install -e '.[test-serving]'")

from tinyvllm import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
ENGINE_FLAGS = ["--num-blocks", "64", "--block-size", "4"]
CHAT = [{"role": "user", "content": "Where is the river?"}]


def serve(*args, **popen):
    # the checkout first, then whatever PYTHONPATH already holds (the GPU machine's packages live on it)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": path}
    return subprocess.Popen([sys.executable, "-m", "tinyvllm.cli", "serve", *ENGINE_FLAGS, *args], cwd=ROOT, env=env,
                            text=True, **popen)


def test_sigterm_lets_a_short_request_finish_cuts_a_long_one_and_exits_0():
    proc = serve("--port", "0", "--shutdown-timeout", "8", stderr=subprocess.PIPE)
    try:
        log = []
        for line in proc.stderr:  # model loading, then the banner with the port
            log.append(line)
            if (m := re.search(r"on http://127\.0\.0\.1:(\d+)", line)):
                break
        assert m, "".join(log)
        threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
        url = f"http://127.0.0.1:{m.group(1)}/v1/completions"
        results, first_chunks = {}, threading.Semaphore(0)

        def stream(name, max_tokens):
            body = {"prompt": "The sun rose", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "stream": True}
            lines = []
            try:
                with httpx.stream("POST", url, json=body, timeout=120) as r:
                    assert r.status_code == 200, r.read()
                    for line in filter(None, r.iter_lines()):  # events are separated by blank lines
                        if line.startswith("data: {") and not lines:
                            first_chunks.release()
                        lines.append(line)
            except httpx.HTTPError as e:  # the server cut the stream
                lines.append(f"cut: {type(e).__name__}")
            results[name] = lines

        # short: one more step after its first token; long: 240 steps, far more than 8 s even unloaded
        clients = [threading.Thread(target=stream, args=("short", 2)),
                   threading.Thread(target=stream, args=("long", 240))]
        for c in clients:
            c.start()
        assert first_chunks.acquire(timeout=120) and first_chunks.acquire(timeout=120)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert proc.wait(timeout=60) == 0, "".join(log)
        assert time.monotonic() - signalled < 8 + 15  # the shutdown timeout, plus a step and the exit
        for c in clients:
            c.join(timeout=30)
        short, long = ([json.loads(line[6:]) for line in results[name][:-1]] for name in ("short", "long"))
        assert results["short"][-1] == results["long"][-1] == "data: [DONE]"
        assert len(short) == 2 and short[-1]["choices"][0]["finish_reason"] == "length"
        assert 1 <= len(long) < 240 and long[-1]["choices"][0]["finish_reason"] == "abort"  # at the timeout
        with pytest.raises(httpx.ConnectError):
            httpx.get(url.replace("/v1/completions", "/health"), timeout=5)
        assert "Traceback" not in "".join(log) and "stopped" in "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_jsonl_loop_answers_every_line_streams_deltas_and_exits_0_at_eof():
    greedy = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    lines = [json.dumps({"id": "a", "prompt": "The sun rose", **greedy}),
             "this is not json",
             json.dumps({"id": "b", "prompt": "x", "max_tokens": 0}),
             json.dumps({"messages": CHAT, **greedy}),
             json.dumps({"id": "a", "prompt": "again", **greedy}),   # "a" is still running
             json.dumps({"id": "c", "prompt": "x", "temprature": 1})]
    proc = serve("--jsonl", "--stream", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    offline = LLM(num_blocks=64, block_size=4, log=lambda m: None).generate(  # while the server starts
        ["The sun rose", CHAT], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    out, err = proc.communicate("\n".join(lines) + "\n", timeout=600)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in out.splitlines()]  # stdout holds JSON lines only
    errors = {r["line"]: r for r in records if "error" in r and "finished" not in r}
    assert errors[2]["id"] is None and errors[2]["error"].startswith("not JSON")
    assert errors[3]["id"] == "b" and "max_tokens" in errors[3]["error"]
    assert errors[5]["id"] == "a" and "already in flight" in errors[5]["error"]
    assert errors[6]["id"] == "c" and "unknown field 'temprature'" in errors[6]["error"]
    assert len(errors) == 4
    results = {r["id"]: r for r in records if r.get("finished")}
    assert set(results) == {"a", "line-4"}   # line 4 has no id
    for key, expected in zip(["a", "line-4"], offline):
        result = results[key]
        assert (result["token_ids"], result["text"], result["finish_reason"]) == (expected.token_ids, expected.text,
                                                                                  "length")
        deltas = [r for r in records if r["id"] == key and r.get("finished") is False]
        assert "".join(d["delta"] for d in deltas) == expected.text
        assert [t for d in deltas for t in d["delta_token_ids"]] == expected.token_ids
        assert result["metrics"]["ttft_ms"] > 0 and result["prompt_tokens"] == len(expected.prompt_token_ids)
    assert "end of input" in err
