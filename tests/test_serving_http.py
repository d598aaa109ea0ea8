"""`tinyvllm serve` over real HTTP with the official openai client, on the demo model in the simulator.

One server per module (a uvicorn thread on a free port); every greedy answer is compared with what the
offline LLM.generate gives for the same prompt. The simulator makes a few engine steps per second, so
answers are 3-4 tokens long.
"""
import json
import threading
import time

import pytest

from tests.references import require

pytestmark = pytest.mark.slow  # end to end: a server over real HTTP with the openai client
openai = require("openai", "the serving tests' client: pip install -e '.[test-serving]'")
import httpx  # noqa: E402  (installed with openai)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tinyvllm import LLM, SamplingParams
from tinyvllm.model.loader import load_model
from tests.hf_chat_ids import CONVERSATIONS, assert_runs_hf_chat_ids
from tests.serving_helpers import ENGINE_OPTIONS, MODEL_NAME, quiet, start_server

MAX_TOKENS = 4
PROMPTS = ["The sun rose", "A small dog ran along the river", "Water", "The old library had",
           "Every morning the baker", "Snow fell on the quiet town"]
CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where is the river?"}]
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS}
EXTRA = {"ignore_eos": True, "return_token_ids": True}  # vLLM's extensions, through the client's extra_body
LOGPROB_IDS = [384, 32, 85, 368, 300]


@pytest.fixture(scope="module")
def model():
    return load_model(log=quiet)


@pytest.fixture(scope="module")
def offline(model):
    """Greedy outputs of LLM.generate for PROMPTS and CHAT, in one batch (before the server runs: the
    simulator must not run two engines' kernels at once)."""
    llm = LLM(model, log=quiet, **ENGINE_OPTIONS)
    outs = llm.generate(PROMPTS + [CHAT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    # one request at a time, as the test sends them: on a GPU the fast precision picks tiles and split-K by a step's row
    # count, so a logprob computed beside another prompt may differ in its last bits from one computed alone
    scored = [llm.generate([LOGPROB_IDS], SamplingParams(temperature=0, max_tokens=1, logprobs=2, prompt_logprobs=2))[0],
              llm.generate([CHAT], SamplingParams(temperature=0, max_tokens=2, logprobs=2, ignore_eos=True))[0]]
    return {"prompts": outs[:-1], "chat": outs[-1], "tokenizer": llm.tokenizer, "scored": scored}


@pytest.fixture(scope="module")
def server(model, offline):
    running = start_server(model)
    yield running
    running.stop()


def test_completions_equal_offline_batched_streamed_and_echoed(server, offline):
    client = server.openai()
    batch = [offline["tokenizer"].encode(p) for p in PROMPTS[:2]]  # a batch of token-id prompts
    reply = client.completions.create(model=MODEL_NAME, prompt=batch, extra_body=EXTRA, **GREEDY)
    for choice, expected in zip(reply.choices, offline["prompts"][:2]):
        assert (choice.text, choice.token_ids, choice.finish_reason) == (expected.text, expected.token_ids, "length")
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.completion_tokens == 2 * MAX_TOKENS and reply.usage.prompt_tokens == sum(map(len, batch))

    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPTS[2], echo=True, stream=True,
                                            stream_options={"include_usage": True}, extra_body=EXTRA, **GREEDY))
    expected = offline["prompts"][2]
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == PROMPTS[2] + expected.text
    assert [t for c in text_chunks for t in c.choices[0].token_ids] == expected.token_ids
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_chat_equals_offline_streamed_or_not(server, offline):
    client = server.openai()
    expected = offline["chat"]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, extra_body=EXTRA, **GREEDY)
    choice = reply.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", expected.text, "length")
    assert choice.token_ids == expected.token_ids and reply.prompt_token_ids == expected.prompt_token_ids
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)

    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, stream=True, stream_options={"include_usage": True},
        temperature=0, max_completion_tokens=MAX_TOKENS, extra_body=EXTRA))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert [t for c in chunks if c.choices for t in (c.choices[0].token_ids or [])] == expected.token_ids
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS and chunks[-1].usage.prompt_tokens == len(
        expected.prompt_token_ids)


def test_chat_runs_transformers_chat_ids(server):
    """The server renders and tokenizes a conversation itself (ServingContext.inputs): the ids it queues are
    transformers' apply_chat_template ids, one BOS (tests/hf_chat_ids.py)."""
    client = server.openai()

    def prompt_ids_of(conversations):
        replies = [client.chat.completions.create(model=MODEL_NAME, messages=c, temperature=0, max_tokens=1,
                                                  extra_body={"return_token_ids": True}) for c in conversations]
        assert all(r.usage.prompt_tokens == len(r.prompt_token_ids) for r in replies)  # what the engine ran
        return [r.prompt_token_ids for r in replies]
    assert_runs_hf_chat_ids(prompt_ids_of, CONVERSATIONS[:1])  # system, three turns, trimmed whitespace


def test_six_concurrent_streaming_clients_all_get_their_offline_tokens(server, offline):
    client = server.openai()
    start = threading.Barrier(len(PROMPTS))
    results, errors = {}, []

    def run(i):
        try:
            start.wait()
            stream = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[i], stream=True, extra_body=EXTRA,
                                               **GREEDY)
            chunks = [c.choices[0] for c in stream]
            results[i] = ("".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids],
                          chunks[-1].finish_reason)
        except Exception as e:  # reported below, with the client it happened to
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for i, expected in enumerate(offline["prompts"]):
        assert results[i] == (expected.text, expected.token_ids, "length"), PROMPTS[i]
    server.wait_idle()


def test_a_stop_string_ends_the_text_before_it_streamed_or_not(server, offline):
    expected = offline["prompts"][3]
    full = expected.text
    stop = full[len(full) // 2:len(full) // 2 + 2]  # two characters from the middle of the greedy text
    cut = full[:full.find(stop)]
    client = server.openai()
    reply = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[3], stop=[stop], extra_body={"ignore_eos": True},
                                      **GREEDY)
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == (cut, "stop")
    chunks = [c.choices[0] for c in client.completions.create(model=MODEL_NAME, prompt=PROMPTS[3], stop=stop,
                                                              stream=True, extra_body={"ignore_eos": True}, **GREEDY)]
    assert "".join(c.text for c in chunks) == cut and chunks[-1].finish_reason == "stop"


def test_clients_that_disconnect_midway_leave_no_kv_blocks_in_use(server, rng):
    before = server.state()["requests_finished"]["abort"]
    body = {"model": MODEL_NAME, "prompt": PROMPTS[4], "max_tokens": 60, "temperature": 0, "ignore_eos": True,
            "stream": True}
    read_chunks = [0, 1, 2, int(rng.integers(1, 4))]  # 0: gone right after the response headers
    errors = server.disconnect_midway("/v1/completions", body, read_chunks)
    assert not errors, errors
    state = server.wait_idle(timeout=60)
    assert state["requests_finished"]["abort"] == before + len(read_chunks)
    assert server.engine_loop.engine.block_manager.num_free_blocks == ENGINE_OPTIONS["num_blocks"]


BAD_REQUESTS = [  # (path, body, status, param)
    ("/v1/completions", "{", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", "", 400, None),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "word " * 400}, 400, "prompt"),           # longer than the context
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "unknown_field": 1}, 400, "unknown_field"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 9, "max_tokens": 2}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": ["a"]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream_options": {}}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
     400, "max_completion_tokens"),
    ("/v1/nowhere", {}, 404, None),
]


def test_a_flood_of_bad_requests_gets_4xx_while_a_stream_finishes(server, offline):
    first_chunk, result = threading.Event(), {}

    def stream():
        chunks = []
        for c in server.openai().completions.create(model=MODEL_NAME, prompt=PROMPTS[5], stream=True,
                                                    extra_body=EXTRA, **GREEDY):
            chunks.append(c.choices[0])
            first_chunk.set()
        result["tokens"] = [t for c in chunks for t in c.token_ids]

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert first_chunk.wait(timeout=120)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for path, body, status, param in BAD_REQUESTS * 2:
            content = body if isinstance(body, str) else json.dumps(body)
            r = http.post(path, content=content, headers={"content-type": "application/json"})
            assert r.status_code == status, (path, body, r.text)
            error = r.json()["error"]
            assert error["code"] == status and error["message"] and error["param"] == param, (body, error)
            assert "Traceback" not in r.text
        r = http.delete("/v1/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == 405
        assert http.get("/health").status_code == 200
    streamer.join(timeout=300)
    assert result["tokens"] == offline["prompts"][5].token_ids
    assert server.state()["http_errors"]["4xx"] >= 2 * len(BAD_REQUESTS) + 1


def test_metrics_parse_and_count_one_request_exactly(server, offline):
    def scrape():
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                assert s.labels["model_name"] == MODEL_NAME
                key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
                samples[key] = s.value
        return samples

    server.wait_idle()
    before = scrape()
    expected = offline["prompts"][0]
    server.openai().completions.create(model=MODEL_NAME, prompt=PROMPTS[0], extra_body=EXTRA, **GREEDY)
    after = scrape()
    delta = lambda key: after.get(key, 0) - before.get(key, 0)
    assert delta("tinyvllm:generation_tokens_total") == MAX_TOKENS
    assert delta("tinyvllm:prompt_tokens_total") == len(expected.prompt_token_ids)
    assert delta("tinyvllm:request_success_total,finished_reason=length") == 1
    assert delta("tinyvllm:time_to_first_token_seconds_count") == 1
    assert delta("tinyvllm:e2e_request_latency_seconds_count") == 1
    assert delta("tinyvllm:request_queue_time_seconds_count") == 1
    assert delta("tinyvllm:inter_token_latency_seconds_count") == MAX_TOKENS - 1
    assert delta("tinyvllm:request_generation_tokens_sum") == MAX_TOKENS
    assert delta("tinyvllm:prefix_cache_queries_total") == len(expected.prompt_token_ids)
    assert after["tinyvllm:num_requests_running"] == after["tinyvllm:num_requests_waiting"] == 0
    assert after["tinyvllm:kv_cache_usage_perc"] == 0
    state = server.state()
    assert state["output_tokens_total"] == after["tinyvllm:generation_tokens_total"]
    assert state["ttft_ms"]["count"] >= 1 and state["ttft_ms"]["p50"] > 0 and state["output_tokens_per_s"] >= 0


def test_models_health_version_tokenize_detokenize(server, offline):
    client = server.openai()
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME] and models[0].max_model_len == 257  # 64 blocks x 4 + 1
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        from tinyvllm import __version__
        assert http.get("/version").json() == {"version": __version__}
        tok = offline["tokenizer"]
        r = http.post("/tokenize", json={"prompt": PROMPTS[0]}).json()
        assert r["tokens"] == tok.encode(PROMPTS[0]) and r["count"] == len(r["tokens"])
        r = http.post("/tokenize", json={"messages": CHAT}).json()
        assert r["tokens"] == offline["chat"].prompt_token_ids
        assert http.post("/detokenize", json={"tokens": tok.encode("The sun", add_special_tokens=False)}).json() == {
            "prompt": "The sun"}
        assert http.post("/detokenize", json={"tokens": [10**6]}).status_code == 400
        assert http.post("/tokenize", json={}).status_code == 400


def test_logprobs_are_the_engines_in_openai_shapes(server, offline):
    client = server.openai()
    text = offline["tokenizer"].decode
    top2 = lambda entry: dict(sorted(((text([t], skip_special_tokens=False), lp) for t, lp in entry.items()),
                                     key=lambda kv: -kv[1])[:2])
    # completions, echo: what lm-evaluation-harness's local-completions sends for loglikelihoods
    expected = offline["scored"][0]
    reply = client.completions.create(model=MODEL_NAME, prompt=LOGPROB_IDS, max_tokens=1, temperature=0, echo=True,
                                      logprobs=2)
    lp = reply.choices[0].logprobs
    ids = LOGPROB_IDS + expected.token_ids
    entries = list(expected.prompt_logprobs) + list(expected.logprobs)
    assert lp.tokens == [text([t], skip_special_tokens=False) for t in ids]
    assert lp.token_logprobs == [None] + [e[t] for t, e in zip(ids[1:], entries[1:])]
    assert lp.top_logprobs == [None] + [top2(e) for e in entries[1:]]
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(ids))]
    assert reply.choices[0].text == text(LOGPROB_IDS) + expected.text
    # chat
    expected = offline["scored"][1]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=2, temperature=0,
                                          logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert [(c.token, c.logprob) for c in content] == [(text([t], skip_special_tokens=False), e[t])
                                                       for t, e in zip(expected.token_ids, expected.logprobs)]
    assert [{t.token: t.logprob for t in c.top_logprobs} for c in content] == [top2(e) for e in expected.logprobs]
    # streamed: the same entries, a step at a time
    chunks = [c for c in client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=2, temperature=0,
                                                         logprobs=True, top_logprobs=2, stream=True,
                                                         extra_body={"ignore_eos": True}) if c.choices]
    assert [(c.token, c.logprob) for ch in chunks if ch.choices[0].logprobs
            for c in ch.choices[0].logprobs.content] == [(c.token, c.logprob) for c in content]
