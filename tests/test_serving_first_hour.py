"""The serving edges a first hour hit (issue 26): the JSONL loop's default ids, strict numbers in request
bodies, a JSON body sent without a JSON Content-Type, and client errors counted apart from the engine's.

Over real HTTP on localhost (tests/serving_helpers.py), on the demo model in the simulator.
"""
import io
import json

import pytest

from tests.references import require
require("openai", "the serving tests' client: pip install -e '.[test-serving]'")
import httpx  # noqa: E402  (installed with openai)

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
