"""`tinyvllm eval --base-url`: the OpenAI-compatible backend over real HTTP (httpx). First against a small
FastAPI mock started on a free localhost port, whose made-up model (`mock_logprob`) is fully known, so the
scores computed from /v1/completions' echoed prompt log-probabilities can be checked exactly, with errors a
real server is slow to provoke; then against the real `tinyvllm serve` on the demo model (tests/
serving_helpers.py), checked against HF's golden logits and against the in-process engine backend."""
import json
import socket
import threading
import time

import pytest

from tests.references import require

pytestmark = pytest.mark.slow  # end to end: evals against a real server
fastapi = require("fastapi")
uvicorn = require("uvicorn")

from tinyvllm.cli import main  # noqa: E402
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR  # noqa: E402
from tinyvllm.evaluation.backends import Failure, Generation, GenerationJob, LoglikelihoodJob  # noqa: E402
from tinyvllm.evaluation.remote import RemoteBackend  # noqa: E402


def mock_logprob(token: int, position: int) -> float:
    """The mock model's log-probability of `token` at `position` of a prompt."""
    return -((token * 7 + position * 3) % 11) / 4 - 0.05


def mock_app(seen: list):
    app = fastapi.FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "mock-model", "object": "model"}]}

    @app.post("/v1/completions")
    def completions(body: dict):
        seen.append(body)
        if not body.get("echo"):  # a generation from a rendered chat prompt
            return {"choices": [{"index": 0, "text": " C"}], "usage": {"completion_tokens": 2}}
        assert body["logprobs"] == 1 and body["max_tokens"] == 1
        choices = []
        for index, ids in enumerate(body["prompt"]):
            if any(t >= 1000 for t in ids):
                return fastapi.responses.JSONResponse({"error": {"message": "token id out of range"}}, 400)
            lps = [None] + [mock_logprob(t, p) for p, t in enumerate(ids) if p > 0] + [-0.5]
            choices.append({"index": index, "text": "x", "logprobs": {"token_logprobs": lps}})
        return {"choices": choices, "usage": {"prompt_tokens": sum(map(len, body["prompt"]))}}

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        seen.append(body)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hmm."}}],
                "usage": {"completion_tokens": 2}}
    return app


@pytest.fixture(scope="module")
def server():
    """(base URL, list of request bodies the server received)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = []
    srv = uvicorn.Server(uvicorn.Config(mock_app(seen), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, "the mock server did not start"
    yield f"http://127.0.0.1:{port}/v1", seen
    srv.should_exit = True
    thread.join(timeout=10)


def collect(run, jobs):
    results = {}
    run(jobs, lambda j, result: results.__setitem__(j, result))
    return [results[j] for j in range(len(jobs))]


def test_loglikelihood_sums_the_echoed_continuation_logprobs(server):
    url, seen = server
    backend = RemoteBackend(url, concurrency=3)
    assert backend.model == "mock-model"
    prompt = [5, 6, 7, 8]
    jobs = [LoglikelihoodJob(prompt, [(9,), (10, 11), (12,), (13, 14, 15)]),
            LoglikelihoodJob(prompt[:2], [(1,), (2,)]),
            LoglikelihoodJob(prompt, [(1,), (5000,)])]
    seen.clear()
    first, second, failed = collect(backend.loglikelihoods, jobs)
    assert first == pytest.approx([mock_logprob(9, 4), mock_logprob(10, 4) + mock_logprob(11, 5), mock_logprob(12, 4),
                                   mock_logprob(13, 4) + mock_logprob(14, 5) + mock_logprob(15, 6)], abs=1e-12)
    assert second == pytest.approx([mock_logprob(1, 2), mock_logprob(2, 2)], abs=1e-12)
    assert isinstance(failed, Failure) and "HTTP 400: token id out of range" in failed.message
    # one request per question: its prompt followed by each continuation, as token ids
    assert sorted(len(body["prompt"]) for body in seen) == [2, 2, 4]
    assert [5, 6, 7, 8, 10, 11] in next(b["prompt"] for b in seen if len(b["prompt"]) == 4 and b["prompt"][0][-1] == 9)


def test_generation_with_and_without_the_answer_prefix(server):
    url, seen = server
    backend = RemoteBackend(url, model="mock-model")
    messages = [{"role": "user", "content": "Q?"}]
    seen.clear()
    with_prefix, without = collect(lambda jobs, done: backend.generate(jobs, 5, (".",), done),
                                   [GenerationJob([7, 8, 9], messages, "The best answer is"),
                                    GenerationJob([7, 8, 9], messages, "")])
    assert with_prefix == Generation(" C", 2) and without == Generation("Hmm.", 2)
    completion = next(b for b in seen if "prompt" in b)   # the prompt rendered here, prefix included
    assert completion["prompt"] == [7, 8, 9] and completion["stop"] == ["."] and completion["temperature"] == 0
    chat = next(b for b in seen if "messages" in b)
    assert chat["messages"] == messages and chat["max_tokens"] == 5


def test_eval_cli_through_the_server(server, tmp_path, capsys):
    url, _ = server
    out = tmp_path / "ll"
    assert main(["eval", "--base-url", url, "--model", str(DEMO_MODEL_DIR), "--tasks", "gpqa_diamond",
                 "--limit", "6", "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    s = report["tasks"]["gpqa_diamond"]
    assert (s["num_selected"], s["n"], s["num_errors"]) == (6, 6, 0) and "mock-model" in report["backend"]
    for item in report["items"]:  # " (A)" .. " (D)": several tokens each, summed from the echoed logprobs
        assert len(item["scores"]) == 4 and item["prediction"] == "ABCD"[item["scores"].index(max(item["scores"]))]
    out = tmp_path / "gen"
    assert main(["eval", "--base-url", url, "--model", str(DEMO_MODEL_DIR), "--tasks", "gpqa_diamond",
                 "--mode", "generative", "--limit", "4", "--out", str(out)]) == 0
    items = json.loads((out / "results.json").read_text())["items"]
    assert [i["prediction"] for i in items] == ["C"] * 4
    assert all(i["response"] is None for i in items)   # no GPQA text is ever stored
    assert "prompt tok/s" in capsys.readouterr().out


def test_an_unreachable_server_is_one_line(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["eval", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", str(DEMO_MODEL_DIR)]) == 1
    err = capsys.readouterr().err
    assert "cannot list models" in err and "Traceback" not in err


# ---- against the real server: `tinyvllm serve` on the demo model, in the simulator -------------------------

@pytest.fixture(scope="module")
def real_server():
    from tests.serving_helpers import start_server
    from tinyvllm.model.loader import load_model
    # fp32: the scores are checked against HF float32 goldens (a GPU's default, the fast precision, is bf16)
    running = start_server(load_model(log=lambda m: None), num_blocks=64, block_size=4, precision="fp32")
    yield running
    running.stop()


def test_real_server_scores_match_hf_golden_logits(real_server):
    # the jobs of tests/test_eval_engine.py, through HTTP: /v1/completions with echo gives prompt logprobs
    import numpy as np
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
    g = Goldens.load(DEFAULT_GOLDENS).prompts[0]
    ids = g["input_ids"].tolist()
    x = g["logits"].astype(np.float64)
    hf = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    k = 17
    t0, t1 = ids[k:k + 2]
    job = LoglikelihoodJob(ids[:k], [(t0, t1), (t0, 9), (5,), (t1,)])
    (scores,) = collect(RemoteBackend(f"{real_server.url}/v1").loglikelihoods, [job])
    expected = [hf[k - 1, t0] + hf[k, t1], hf[k - 1, t0] + hf[k, 9], hf[k - 1, 5], hf[k - 1, t1]]
    np.testing.assert_allclose(scores, expected, rtol=0, atol=3e-4)


def test_real_server_generation_equals_the_engine_backend(real_server):
    from tinyvllm.evaluation.backends import EngineBackend
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    job = GenerationJob([384, 71, 72, 73], [{"role": "user", "content": "unused"}], "The best answer is")
    (remote,) = collect(lambda jobs, done: RemoteBackend(f"{real_server.url}/v1").generate(jobs, 3, (".",), done), [job])
    engine = LLMEngine(None, EngineConfig(num_blocks=64, block_size=4, precision="fp32"), log=lambda m: None)
    (local,) = collect(lambda jobs, done: EngineBackend(engine).generate(jobs, 3, (".",), done), [job])
    assert isinstance(remote, Generation) and remote == local
