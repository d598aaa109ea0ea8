"""`tinyvllm bench --base-url URL`: the serving benchmark client against a real tinyvllm server (a free localhost
port, the demo model, the simulator), against no server, and against a server that rejects every request;
and its stream parsing on canned answers. Nothing here asserts on speed."""
import asyncio
import contextlib
import csv
import io
import json
import re
import socket
from types import SimpleNamespace

import httpx
import pytest

from tinyvllm.bench import BenchConfig, Workloads
from tinyvllm.bench.http_client import HttpRequest, HttpResult, completion_payload, stream_completion
from tinyvllm.bench.http_runs import compare_greedy
from tinyvllm.cli import main
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
from tinyvllm.model.loader import load_model
from tests.serving_helpers import ENGINE_OPTIONS, MODEL_NAME, quiet, start_server

pytestmark = pytest.mark.slow  # end to end: the bench client against a real server

# 3 serving requests and 2 throughput requests, each of 4-8 prompt tokens and 2 new tokens
TINY = ["--serving-requests", "3", "--num-requests", "2", "--min-len", "4", "--max-len", "8", "--min-output-len", "2",
        "--max-output-len", "2", "--request-rate", "50", "--max-seconds", "120", "--no-plot"]
LATENCY_FIELDS = [f"{stat}_{key}_ms" for key in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")]
VLLM_FIELDS = ["num_finished", "num_errored", "elapsed_s", "request_throughput", "output_tok_s",
               "total_token_throughput", "max_concurrent_requests", "prompt_tokens", "output_tokens"] + LATENCY_FIELDS


@pytest.fixture(scope="module")
def server():
    running = start_server(load_model(log=quiet))
    yield running
    running.stop()


def bench(*argv) -> tuple[int, str]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", *argv])
    return code, stdout.getvalue()


def read_report(out_dir):
    report = json.loads((out_dir / "bench.json").read_text())
    with open(out_dir / "bench.csv", newline="") as f:
        return report, list(csv.DictReader(f))


@pytest.fixture(scope="module")
def served(server, tmp_path_factory):
    """Both workloads through HTTP, then the greedy check against offline LLM.generate."""
    out = tmp_path_factory.mktemp("http")
    code, stdout = bench("--base-url", server.url, "--workload", "serving,throughput", *TINY, "--max-concurrency", "2", "--max-num-seqs", "1", "--check-greedy",
                         "--num-blocks", str(ENGINE_OPTIONS["num_blocks"]), "--block-size",
                         str(ENGINE_OPTIONS["block_size"]), "--out", str(out))
    return code, stdout, *read_report(out), out


def test_every_request_succeeds_with_the_tokens_it_asked_for_and_the_report_has_every_field(served, server):
    code, stdout, report, csv_rows, out = served
    assert code == 0
    serving, throughput = report["results"]
    cfg = BenchConfig(workloads=("serving", "throughput"), serving_requests=3, num_requests=2, min_len=4, max_len=8,
                      min_output_len=2, max_output_len=2, request_rate=50)
    expected = Workloads.make(cfg, ModelConfig.from_model_dir(DEMO_MODEL_DIR).vocab_size, 257)
    for row, requests in ((serving, expected.serving), (throughput, expected.throughput)):
        assert row["system"] == "http" and row["served_model"] == MODEL_NAME and row["completed"]
        assert row["num_requests"] == row["num_finished"] == len(requests) and row["num_errored"] == 0
        assert row["output_tokens"] == row["requested_output_tokens"] == sum(r.max_tokens for r in requests)
        assert row["prompt_tokens"] == sum(len(r.prompt_ids) for r in requests)
        assert row["token_count_mismatches"] == 0
        assert all(row[k] is not None for k in VLLM_FIELDS), [k for k in VLLM_FIELDS if row[k] is None]
        assert row["max_concurrent_requests"] == 2  # --max-concurrency 2 held back the third
        assert row["output_tok_s"] == pytest.approx(row["output_tokens"] / row["elapsed_s"])
        assert row["total_token_throughput"] == pytest.approx((row["output_tokens"] + row["prompt_tokens"]) / row["elapsed_s"])
        assert 0 < row["median_ttft_ms"] <= row["p99_ttft_ms"] <= row["p99_e2el_ms"] <= 1e3 * row["elapsed_s"]
        assert 0 < row["mean_ttft_ms"] < row["mean_e2el_ms"]
        # one token per chunk from tinyvllm: the mean gap between chunks is the mean TPOT, weighted per token
        assert row["mean_itl_ms"] > 0 and row["mean_tpot_ms"] > 0
        assert row["greedy_check"]["identical"] == row["greedy_check"]["compared_by_token_ids"] == len(requests)
        assert row["greedy_mismatches"] == 0
    assert serving["variant"] == "50 req/s" and throughput["variant"] == "at once"
    assert len(csv_rows) == 2 and float(csv_rows[0]["p99_itl_ms"]) == pytest.approx(serving["p99_itl_ms"])
    for line in ("Successful requests:", "Failed requests:", "Peak concurrent requests:", "Median TTFT (ms):",
                 "P99 ITL (ms):", "Mean E2EL (ms):", "Identical to LLM.generate:              3/3"):
        assert line in stdout, line
    assert report["command"].startswith("tinyvllm bench ") and "--check-greedy" in report["command"]
    assert server.wait_idle()["kv_blocks"]["used"] == 0
    # an HTTP report merges with another (e.g. the offline run's) like any bench.json
    code, merged = bench("--merge", str(out / "bench.json"), str(out / "bench.json"), "--out", str(out / "merged"))
    assert code == 0 and merged.count("Successful requests:") == 4


def test_an_unreachable_server_counts_every_request_as_failed(tmp_path):
    with socket.socket() as s:             # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, stdout = bench("--base-url", f"http://127.0.0.1:{port}", "--workload", "serving", *TINY, "--out", str(tmp_path))
    (row,) = read_report(tmp_path)[0]["results"]
    assert code == 1
    assert row["num_errored"] == row["num_requests"] == 3 and row["num_finished"] == 0 and not row["completed"]
    assert list(row["error_samples"].values()) == [3] and "ConnectError" in next(iter(row["error_samples"]))
    assert row["output_tokens"] == 0 and row["mean_ttft_ms"] is None
    assert re.search(r"^Failed requests:\s+3\s*$", stdout, re.M), stdout


def test_requests_the_server_rejects_are_counted_with_its_message(server, tmp_path):
    """Prompt ids from a 100,000-token vocabulary: the demo model's server answers each with a 400."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": 100_000}))
    code, stdout = bench("--base-url", server.url, "--model", str(model_dir), "--workload", "serving", *TINY, "--no-warmup", "--out", str(tmp_path / "out"))
    (row,) = read_report(tmp_path / "out")[0]["results"]
    assert code == 1 and row["num_errored"] == 3 and row["num_finished"] == 0
    assert sum(row["error_samples"].values()) == 3
    for message in row["error_samples"]:   # each names the request's own unknown ids
        assert message.startswith("HTTP 400: ") and "prompt" in message, message
    assert stdout.count("error: 1 x HTTP 400: prompt: token ids outside the vocabulary") == 3
    assert server.state()["http_errors"]["4xx"] >= 3


@pytest.mark.parametrize("body, status, error", [
    (b'data: {"choices": [{"text": "a", "token_ids": [5]}]}\n\ndata: {"choices": [{"text": "b", "token_ids": [6], '
     b'"finish_reason": "length"}]}\n\ndata: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
     b'\n\ndata: [DONE]\n\n', 200, None),
    (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"error": {"message": "boom", "code": 400}}\n\n', 200,
     "error event: boom"),
    (b'data: {"choices": [{"text": "a"}]}\n\n', 200, "the stream ended before data: [DONE]"),
    (b'data: [DONE]\n\n', 200, "the stream carried no output"),
    (b'data: {not json\n\n', 200, "a chunk is not JSON: '{not json'"),
    (b'{"error": {"message": "the server is busy", "type": "x"}}', 503, "HTTP 503: the server is busy"),
])
def test_stream_parsing_on_canned_answers(body, status, error):
    def answer(request):
        sent = json.loads(request.content)
        assert sent == completion_payload(HttpRequest([1, 2, 3], 2), "m", return_token_ids=True)
        assert request.url.path == "/v1/completions"
        return httpx.Response(status, content=body)

    async def one():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://test") as client:
            return await stream_completion(client, completion_payload(HttpRequest([1, 2, 3], 2), "m", True))

    r = asyncio.run(one())
    assert r.error == error and r.ok == (error is None)
    if error is None:
        assert (r.text, r.token_ids, r.output_tokens, r.prompt_tokens, r.finish_reason) == ("ab", [5, 6], 2, 3, "length")
        assert 0 <= r.ttft == r.output_times[0] <= r.output_times[1] <= r.e2e and len(r.itls) == 1
        assert r.tpot == pytest.approx(r.e2e - r.ttft)


def test_base_url_options_are_checked_before_anything_runs(capsys):
    for argv, message in ((["--base-url", "localhost:8000", "--workload", "serving"], "must start with http://"),
                          (["--base-url", "http://x", "--workload", "latency"], "add --workload serving"),
                          (["--base-url", "http://x"], "not ['kernels', 'latency', 'prefill']"),
                          (["--workload", "serving", "--check-greedy"], "go with --base-url"),
                          (["--base-url", "http://x", "--workload", "serving", "--max-concurrency", "0"],
                           "--max-concurrency must be >= 1")):
        assert main(["bench", *argv]) == 1
        assert message in capsys.readouterr().err, argv


def test_the_greedy_check_reports_where_outputs_part():
    served = [HttpResult(ok=True, token_ids=[5, 6, 7]), HttpResult(ok=True, token_ids=[5, 6, 7]),
              HttpResult(ok=True, text_parts=["ab", " c"])]
    offline = [SimpleNamespace(token_ids=[5, 6, 7], text=""), SimpleNamespace(token_ids=[5, 6, 8], text=""),
               SimpleNamespace(token_ids=[], text="ab d")]
    check = compare_greedy([(i, None, r) for i, r in enumerate(served)], offline)
    assert check == {"compared": 3, "compared_by_token_ids": 2, "identical": 1, "num_mismatches": 2, "mismatches": [
        {"request": 1, "first_difference_at": 2, "served": [7], "offline": [8]},
        {"request": 2, "first_difference_at": 3, "served": "c", "offline": "d"}]}
