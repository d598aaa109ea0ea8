"""The serving edges a first hour hit (issue 26): the JSONL loop's default ids, strict numbers in request
bodies, a JSON body sent without a JSON Content-Type, and client errors counted apart from the engine's.

The HTTP ones over real HTTP on localhost (tests/serving_helpers.py); the JSONL ones through
jsonl_loop.run in this process (stdin / stdout, no HTTP there); all on the demo model in the simulator.
"""
import io
import json
import threading
import time

import pytest

from tests.references import require
require("openai", "the serving tests' client: pip install -e '.[test-serving]'")
import httpx  # noqa: E402  (installed with openai)

from tinyvllm import SamplingParams  # noqa: E402
from tinyvllm.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from tinyvllm.model.loader import load_model  # noqa: E402
from tinyvllm.serving import jsonl_loop  # noqa: E402
from tinyvllm.serving.engine_loop import EngineLoop  # noqa: E402
from tests.serving_helpers import ENGINE_OPTIONS, quiet, start_server  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load_model(log=quiet)


def test_jsonl_default_id_never_collides_with_an_explicit_one(model):
    # line 1 takes the explicit id 2 and is still running when line 2 (no id) arrives: line 2's default id
    # must not be 2. An explicit id in the defaults' form is refused, so a default can never meet it.
    long = {"prompt": "The sun rose", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    lines = [json.dumps({"id": 2, **long}),
             json.dumps({**long, "max_tokens": 2}),
             json.dumps({"id": "line-5", **long}),
             json.dumps({"id": "line 4", **long, "max_tokens": 1})]
    engine = LLMEngine(model, EngineConfig(**ENGINE_OPTIONS), log=quiet)
    out = io.StringIO()
    assert jsonl_loop.run(EngineLoop(engine, log=quiet), lines, out, log=quiet) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    errors = [r for r in records if "error" in r]
    results = {r["id"]: r for r in records if r.get("finished")}
    assert len(errors) == 1 and errors[0]["line"] == 3 and errors[0]["id"] == "line-5"
    assert "reserved" in errors[0]["error"] and "line-N" in errors[0]["error"]
    assert set(results) == {2, "line-2", "line 4"}
    assert len(results[2]["token_ids"]) == 6 and len(results["line-2"]["token_ids"]) == 2


@pytest.fixture(scope="module")
def server(model):
    running = start_server(model)
    yield running
    running.stop()


def post(server, path, body, **options) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120, **options)


# every integer or number field of the request bodies, each given as a string of a valid value (or a bool),
# which pydantic's lax mode would have converted
WRONG_NUMBERS = {"/v1/completions": {"max_tokens": "8", "temperature": "0", "top_p": "1", "top_k": "5", "seed": "1",
                                     "min_tokens": "1", "stop_token_ids": ["2"], "n": "1", "frequency_penalty": "0",
                                     "presence_penalty": "0", "logprobs": "1", "best_of": "1"},
                 "/v1/chat/completions": {"max_tokens": True, "max_completion_tokens": "8", "temperature": "0.5",
                                          "top_logprobs": "1", "seed": 1.0}}
BASE = {"/v1/completions": {"prompt": "The sun rose"},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True}}


@pytest.mark.parametrize("path, field, value", [(path, field, value) for path, fields in WRONG_NUMBERS.items()
                                                for field, value in fields.items()])
def test_a_number_of_the_wrong_type_is_a_400_naming_the_field(server, path, field, value):
    reply = post(server, path, {**BASE[path], "max_tokens": 1, field: value})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["message"].startswith(field), error


def test_the_same_fields_as_numbers_are_accepted(server):
    numbers = {"/v1/completions": {"temperature": 0, "top_p": 1, "top_k": 5, "seed": 1, "min_tokens": 1,
                                   "stop_token_ids": [2], "n": 1, "frequency_penalty": 0, "presence_penalty": 0.0,
                                   "logprobs": 1, "best_of": 1},
               "/v1/chat/completions": {"max_completion_tokens": 1, "temperature": 0.5, "top_logprobs": 1, "seed": 1}}
    for path, fields in numbers.items():
        body = {**BASE[path], **fields} | ({} if "max_completion_tokens" in fields else {"max_tokens": 1})
        reply = post(server, path, body)
        assert reply.status_code == 200, reply.text


def test_jsonl_numbers_are_strict_too(model):
    engine = LLMEngine(model, EngineConfig(**ENGINE_OPTIONS), log=quiet)
    out = io.StringIO()
    lines = [json.dumps({"id": "a", "prompt": "x", "max_tokens": "8"})]
    assert jsonl_loop.run(EngineLoop(engine, log=quiet), lines, out, log=quiet) == 0
    [record] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["id"] == "a" and record["error"].startswith("max_tokens"), record


def test_a_json_body_without_a_json_content_type_gets_a_message_naming_the_content_type(server):
    # not read as JSON (a CSRF guard), but the message says why and what to send
    body = json.dumps({"prompt": "The sun rose", "max_tokens": 1}).encode()
    sent = {"application/x-www-form-urlencoded": "application/x-www-form-urlencoded",  # curl -d without -H
            None: "without a Content-Type"}                                          # no header at all
    for path in ("/v1/completions", "/tokenize"):
        for content_type, named in sent.items():
            headers = {} if content_type is None else {"Content-Type": content_type}
            reply = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=120)
            assert reply.status_code == 400, reply.text
            message = reply.json()["error"]["message"]
            assert named in message and "Content-Type: application/json" in message, message
    reply = httpx.post(f"{server.url}/v1/completions", content=body, timeout=120,
                       headers={"Content-Type": "application/json; charset=utf-8"})
    assert reply.status_code == 200, reply.text


def prometheus_value(server, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name)


def test_clients_404_405_and_400_are_counted_apart_from_the_engines_errors(server):
    before = server.wait_idle()
    assert httpx.get(f"{server.url}/no/such/page", timeout=30).status_code == 404
    assert httpx.post(f"{server.url}/v1/no-such-route", json={}, timeout=30).status_code == 404
    assert httpx.get(f"{server.url}/v1/completions", timeout=30).status_code == 405
    assert post(server, "/v1/completions", {"prompt": "x", "max_tokens": -1}).status_code == 400
    # and one request the engine fails (a token id outside the vocabulary, past the HTTP checks)
    failed = threading.Event()
    server.engine_loop.submit([10 ** 9], SamplingParams(max_tokens=1), lambda updates: failed.set(), block=True)
    assert failed.wait(60)
    deadline = time.monotonic() + 30  # the stats hear of a step just after its requests' sinks
    while (state := server.wait_idle())["requests_finished"]["error"] == before["requests_finished"]["error"]:
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert state["http_errors"] == {"4xx": before["http_errors"]["4xx"] + 4, "5xx": before["http_errors"]["5xx"]}
    # "errors" is the engine's: one more, none for the clients' mistakes, and the count Prometheus gives
    assert state["errors"] == before["errors"] + 1 == state["requests_finished"]["error"]
    assert state["errors"] == prometheus_value(server, "tinyvllm:request_errors_total")
