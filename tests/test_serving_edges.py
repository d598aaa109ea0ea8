"""Serving behaviours that clients lean on but rarely check, over real HTTP on localhost (demo model, simulator):
each stream ends with `data: [DONE]`, a chat client that goes away frees its request's KV blocks, an
unsupported `logit_bias` is a 400 naming it, and chat `logprobs: true` alone still gives each token's logprob.
"""
import json
import time

import pytest

from tests.references import require

pytestmark = pytest.mark.slow  # end to end: a server with real streaming and disconnecting clients
openai = require("openai", "the serving tests' client: pip install -e '.[test-serving]'")
import httpx  # noqa: E402  (installed with openai)

from tinyvllm import LLM, SamplingParams
from tinyvllm.model.loader import load_model
from tests.serving_helpers import ENGINE_OPTIONS, MODEL_NAME, quiet, start_server

CHAT = [{"role": "user", "content": "Where is the river?"}]


@pytest.fixture(scope="module")
def model():
    return load_model(log=quiet)


@pytest.fixture(scope="module")
def offline(model):
    """The chat's greedy tokens and their logprobs from LLM.generate (before the server: the simulator must
    not run two engines' kernels at once)."""
    llm = LLM(model, log=quiet, **ENGINE_OPTIONS)
    out = llm.generate([CHAT], SamplingParams(temperature=0, max_tokens=2, logprobs=1, ignore_eos=True))[0]
    return {"chat": out, "tokenizer": llm.tokenizer}


@pytest.fixture(scope="module")
def server(model, offline):
    running = start_server(model)
    yield running
    running.stop()


def _stream_lines(server, path: str, body: dict) -> list[str]:
    with httpx.Client(timeout=120) as http, http.stream("POST", f"{server.url}{path}", json=body) as r:
        assert r.status_code == 200, r.read()
        return [line for line in r.iter_lines() if line]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": CHAT}),
    ("/v1/completions", {"prompt": "The sun rose"}),
])
def test_each_stream_ends_with_done_after_its_json_events(server, path, body):
    """OpenAI's server-sent events end with `data: [DONE]`; clients that wait for it (curl scripts, older
    SDKs) hang without it."""
    lines = _stream_lines(server, path, {**body, "model": MODEL_NAME, "max_tokens": 2, "temperature": 0,
                                         "ignore_eos": True, "stream": True})
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert lines.count("data: [DONE]") == 1
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert events and all(e["choices"] for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_clients_that_disconnect_midway_free_their_kv_blocks_soon(server, rng):
    """Like the completions test in test_serving_http.py, for the chat stream: a request whose client went
    away is aborted, not run to its max_tokens (200 tokens take the simulator well over 15 s)."""
    server.wait_idle()
    before = server.state()["requests_finished"]["abort"]
    body = {"model": MODEL_NAME, "messages": CHAT, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    read_chunks = [0, 2, int(rng.integers(1, 4))]  # 0: gone right after the response headers
    errors = server.disconnect_midway("/v1/chat/completions", body, read_chunks)
    assert not errors, errors
    gone = time.monotonic()
    state = server.wait_idle(timeout=15)
    assert time.monotonic() - gone < 15
    assert state["requests_finished"]["abort"] == before + len(read_chunks)
    assert server.engine_loop.engine.block_manager.num_free_blocks == ENGINE_OPTIONS["num_blocks"]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": CHAT}),
    ("/v1/completions", {"prompt": "The sun rose"}),
])
def test_logit_bias_is_refused_with_a_400_naming_it(server, path, body):
    """tinyvllm does not apply logit_bias: answering 200 would silently ignore what the client asked for."""
    r = httpx.post(f"{server.url}{path}", timeout=120,
                   json={**body, "model": MODEL_NAME, "max_tokens": 1, "logit_bias": {"50": 5.0}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "logit_bias" and "logit_bias" in error["message"], error
    assert "Traceback" not in r.text
    # an empty bias asks for nothing, as OpenAI accepts it
    r = httpx.post(f"{server.url}{path}", timeout=120,
                   json={**body, "model": MODEL_NAME, "max_tokens": 1, "logit_bias": {}})
    assert r.status_code == 200, r.text


def test_chat_logprobs_without_top_logprobs_gives_each_tokens_own_logprob(server, offline):
    """OpenAI: `logprobs: true` alone returns each output token's logprob, with empty top_logprobs."""
    expected = offline["chat"]
    text = lambda t: offline["tokenizer"].decode([t], skip_special_tokens=False)
    want = [(text(t), pytest.approx(e[t], abs=1e-5), []) for t, e in zip(expected.token_ids, expected.logprobs)]
    assert len(want) == 2
    client = server.openai()
    reply = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=2, temperature=0,
                                           logprobs=True, extra_body={"ignore_eos": True})
    assert reply.choices[0].logprobs is not None
    content = reply.choices[0].logprobs.content
    assert [(c.token, c.logprob, c.top_logprobs) for c in content] == want
    chunks = [c for c in client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=2,
                                                         temperature=0, logprobs=True, stream=True,
                                                         extra_body={"ignore_eos": True}) if c.choices]
    streamed = [c for ch in chunks if ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob, c.top_logprobs) for c in streamed] == want
