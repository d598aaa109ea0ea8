"""The serving package's parts that need no running engine: streamed text, error messages, logprob shapes,
the API key, a full queue and a dead engine loop (an app over a loop that is not running), the /state series
and TTFT histogram fed with hand-made StepReports."""
import pytest

from tests.references import require
require("httpx", "FastAPI's TestClient needs it: pip install -e '.[test-serving]'")
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.model.loader import load_model
from tinyvllm.serving.app import create_app
from tinyvllm.serving.server import STATIC_DIR
from tinyvllm.serving.context import ServingContext
from tinyvllm.serving.detokenizer import IncrementalDetokenizer
from tinyvllm.engine.metrics import RequestMetrics
from tinyvllm.serving.engine_loop import EngineLoop, EngineState, StepReport, Update
from tinyvllm.serving.live_stats import LiveStats
from tinyvllm.serving.logprobs import TokenText, chat_logprobs, completion_logprobs
from tinyvllm.serving.protocol import ChatCompletionRequest, CompletionRequest, validation_error


def quiet(message):
    pass


@pytest.fixture(scope="module")
def model():
    return load_model(log=quiet)


@pytest.mark.parametrize("stop", [(), ("ab", "xyz")])
def test_streamed_deltas_add_up_to_the_whole_decode(model, rng, stop):
    tok = model.tokenizer
    for _ in range(30):  # random ids: byte tokens split multi-byte characters, special tokens decode to ""
        ids = rng.integers(0, model.config.vocab_size, size=int(rng.integers(1, 40))).tolist()
        final = tok.decode(ids)
        detok, sent, i = IncrementalDetokenizer(tok.decode, stop), "", 0
        while i < len(ids):
            n = int(rng.integers(1, 4))
            sent += detok.add(ids[i:i + n])
            i += n
            assert final.startswith(sent), (ids, sent)
            if stop:  # the last len(longest stop) - 1 characters are still held back
                assert len(sent) <= max(0, len(tok.decode(ids[:i])) - 2)
        sent += detok.finish(final)
        assert sent == final, ids


def test_the_final_text_wins_over_what_was_decoded_when_a_stop_string_cut_it(model):
    tok = model.tokenizer
    ids = tok.encode("abcd efgh", add_special_tokens=False)
    last = next(k for k in range(1, len(ids) + 1) if "d e" in tok.decode(ids[:k]))  # the engine stops here
    detok = IncrementalDetokenizer(tok.decode, ("d e",))
    streamed = "".join(detok.add([t]) for t in ids[:last - 1])
    assert streamed + detok.finish("abc") == "abc"  # what the engine returns: the text before the stop string


def errors_of(model_class, body):
    with pytest.raises(ValidationError) as e:
        model_class.model_validate(body)
    return validation_error(e.value.errors())


@pytest.mark.parametrize("model_class,body,message,param", [
    (CompletionRequest, {"prompt": "x", "tempreature": 0.5}, "unknown field 'tempreature'", "tempreature"),
    (CompletionRequest, {"prompt": {"a": 1}}, "prompt: expected text, a list of texts", "prompt"),
    (CompletionRequest, {"prompt": "x", "max_tokens": 1.5}, "max_tokens: Input should be a valid integer", "max_tokens"),
    (CompletionRequest, {"prompt": "x", "best_of": 3}, "best_of: only best_of=1 is supported", "best_of"),
    (CompletionRequest, {"prompt": "x", "presence_penalty": 1}, "presence_penalty: penalties are not supported",
     "presence_penalty"),
    (CompletionRequest, {"prompt": "x", "logprobs": 21}, "logprobs: Input should be less than or equal to 20",
     "logprobs"),
    (CompletionRequest, {}, "prompt: Field required", "prompt"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content: expected a string",
     "messages"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     "top_logprobs needs logprobs: true", None),
])
def test_invalid_bodies_get_one_line_naming_the_field(model_class, body, message, param):
    error = errors_of(model_class, body)
    assert error.status == 400 and error.message.startswith(message) and error.param == param, error.message


def test_logprobs_in_both_openai_shapes(model):
    text = TokenText(model.tokenizer.decode)
    ids = [300, 301, 302]
    entries = [None, {301: -0.5, 7: -1.25, 9: -3.0}, {302: -2.0, 7: -0.25, 8: -0.75}]
    out = completion_logprobs(ids, entries, 2, text, offset=5)
    assert out.tokens == [text(i) for i in ids]
    assert out.token_logprobs == [None, -0.5, -2.0]
    assert out.top_logprobs == [None, {text(301): -0.5, text(7): -1.25}, {text(7): -0.25, text(8): -0.75}]
    assert out.text_offset == [5, 5 + len(text(300)), 5 + len(text(300)) + len(text(301))]
    chat = chat_logprobs(ids[1:], entries[1:], 1, text).content
    assert [(c.token, c.logprob) for c in chat] == [(text(301), -0.5), (text(302), -2.0)]
    assert [[(t.token, t.logprob) for t in c.top_logprobs] for c in chat] == [[(text(301), -0.5)], [(text(7), -0.25)]]
    assert chat[0].bytes == list(text(301).encode())


@pytest.fixture
def idle_app(model):
    """An app over an engine loop that was never started: nothing it accepts will run."""
    def make(static_dir=None, **options):
        engine = LLMEngine(model, EngineConfig(num_blocks=16, block_size=4), log=quiet)
        loop = EngineLoop(engine, max_waiting=options.pop("max_waiting", 0), log=quiet)
        return TestClient(create_app(ServingContext.create(loop, "demo", **options), static_dir=static_dir))
    return make


def test_a_full_queue_is_a_503_with_retry_after_and_a_stopped_loop_fails_health(idle_app):
    client = idle_app()
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "--max-waiting 0" in r.json()["error"]["message"]
    assert client.get("/health").status_code == 503
    assert client.get("/state").json()["http_errors"] == {"4xx": 0, "5xx": 2}


def test_the_api_key_guards_the_api_but_not_health_or_metrics(idle_app):
    client = idle_app(api_key="sesame")
    body = {"prompt": "x", "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
        r = client.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    assert client.post("/tokenize", json={"prompt": "x"}).status_code == 401
    # the right key gets through to the (full) queue
    assert client.post("/v1/completions", json=body, headers={"Authorization": "Bearer sesame"}).status_code == 503
    assert client.get("/metrics").status_code == 200 and client.get("/version").status_code == 200


@pytest.mark.parametrize("with_page", [True, False])
def test_unknown_api_routes_are_404_and_wrong_methods_405_beside_the_web_page(idle_app, with_page):
    client = idle_app(static_dir=STATIC_DIR if with_page else None)
    for method, path, status in [("POST", "/v1/nowhere", 404), ("GET", "/v1/chat", 404),
                                 ("DELETE", "/v1/completions", 405), ("GET", "/v1/chat/completions", 405)]:
        r = client.request(method, path)
        assert r.status_code == status and r.json()["error"]["code"] == status, (method, path, r.text)
    index = client.get("/")
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html" if with_page else "application/json")


def test_serve_captures_every_cuda_graph_before_it_takes_a_request(monkeypatch, capsys):
    """`tinyvllm serve` asks the engine for all its CUDA graphs up front (LLMEngine.capture_graphs: a GPU's first
    request at a new batch size would otherwise wait for a capture and a compile), before it reads a request."""
    import io
    import sys
    from tinyvllm.cli import parse_args
    from tinyvllm.cli import serve
    events = []
    real = LLMEngine.capture_graphs

    def capture(self, log=None):
        events.append("capture")
        log("captured decode CUDA graphs for [1, 2] sequences in 0.0 s")  # the line a GPU would print
        return real(self, log)

    class Stdin(io.StringIO):
        def __iter__(self):
            events.append("read")
            return super().__iter__()

    monkeypatch.setattr(LLMEngine, "capture_graphs", capture)
    monkeypatch.setattr(sys, "stdin", Stdin('{"prompt": "Hi", "max_tokens": 1}\n'))
    args = parse_args(["serve", "--jsonl", "--num-blocks", "32", "--block-size", "4"])
    assert serve.run(args) == 0
    assert events[:2] == ["capture", "read"]
    assert "tinyvllm serve: captured decode CUDA graphs" in capsys.readouterr().err


class FakeClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def step(t: float, tokens: int, running: int, waiting: int = 0, kv: float = 0.0, ttfts=()) -> StepReport:
    """A StepReport at `t`: one request sampled `tokens` tokens; one finished request per TTFT in `ttfts`."""
    state = EngineState(num_running=running, num_waiting=waiting, kv_usage=kv, num_blocks=16, block_size=4)
    updates = [Update("r", list(range(tokens)))]
    updates += [Update(f"done{i}", [], finished=True, finish_reason="length", num_prompt_tokens=3,
                       metrics=RequestMetrics(f"done{i}", 0.0, 3, ttft=ttft, e2e=ttft))
                for i, ttft in enumerate(ttfts)]
    return StepReport(t, state, updates, num_batched_tokens=tokens, num_preempted=0)


def test_the_series_has_a_row_per_whole_second_with_its_tokens_and_the_state_after_its_last_step():
    clock = FakeClock(1000.0)
    stats = LiveStats(clock=clock)
    for report in (step(1000.2, 1, running=1, kv=0.25), step(1000.7, 1, running=1, kv=0.25),
                   step(1002.1, 1, running=2, waiting=1, kv=0.5), step(1002.9, 2, running=2, kv=0.75)):
        stats.on_step(report)
    clock.now = 1004.3  # seconds 1000 to 1003 are over; 1001 and 1003 had no step: the state stays, no tokens
    series = stats.snapshot(EngineState(), "m", 4.3, 0)["series"]
    assert series["output_tokens_per_s"] == [2, 0, 3, 0]
    assert series["running"] == [1, 1, 2, 2]
    assert series["waiting"] == [0, 0, 0, 0]
    assert series["kv_cache_usage"] == [0.25, 0.25, 0.75, 0.75]
    clock.now = 1006.0
    assert stats.snapshot(EngineState(), "m", 6.0, 0)["series"]["running"] == [1, 1, 2, 2, 2, 2]


def test_the_series_keeps_only_its_last_seconds():
    clock = FakeClock(500.0)
    stats = LiveStats(series_seconds=5, clock=clock)
    for k in range(20):
        stats.on_step(step(500.5 + k, tokens=k, running=k % 3))
    clock.now = 520.0
    series = stats.snapshot(EngineState(), "m", 20.0, 0)["series"]
    assert series["output_tokens_per_s"] == [15, 16, 17, 18, 19]
    assert series["running"] == [0, 1, 2, 0, 1]
    assert len(stats._series._samples) <= 5  # bounded memory, not just a bounded answer
    clock.now = 1000.0  # long idle: the last state carries on
    series = stats.snapshot(EngineState(), "m", 500.0, 0)["series"]
    assert series["output_tokens_per_s"] == [0] * 5 and series["running"] == [1] * 5


def test_the_ttft_histogram_counts_finished_requests_by_bucket():
    stats = LiveStats(clock=FakeClock(0.0))
    stats.on_step(step(0.1, 1, running=1, ttfts=(0.0015, 0.3, 0.3, 7.0, 500.0)))
    histogram = stats.snapshot(EngineState(), "m", 0.1, 0)["ttft_histogram"]
    counts = dict(zip(histogram["le_ms"] + [None], histogram["counts"]))
    assert {le: n for le, n in counts.items() if n} == {2: 1, 500: 2, 10_000: 1, None: 1}
    assert histogram["le_ms"] == sorted(histogram["le_ms"]) and len(histogram["counts"]) == len(histogram["le_ms"]) + 1
