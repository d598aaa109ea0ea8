"""A streaming client for any OpenAI-compatible server (tinyvllm serve, vLLM, ...), timed as `vllm bench serve`
times one: each request is a streamed POST /v1/completions, sent at its arrival time, at most
`max_concurrency` in flight; its clock starts when it is sent.

    TTFT   until the first chunk that carries output (text or token ids)
    ITL    between successive chunks that carry output (a chunk of several tokens is one gap, as in vLLM)
    E2E    until the stream's `data: [DONE]`
    TPOT   (E2E - TTFT) / (output tokens - 1)

Output tokens are the usage chunk's completion_tokens (stream_options.include_usage), else the token ids the
chunks carried, else the number of chunks. A request fails on a connection error, an HTTP status other than
200, an error event in the stream, a chunk that is not JSON, or a stream that ends before [DONE] or without
output; its message is kept.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

COMPLETIONS_PATH = "/v1/completions"
CONNECT_TIMEOUT_S = 10.0


@dataclass
class HttpRequest:
    prompt: list[int] | str
    max_tokens: int
    arrival: float = 0.0                   # seconds after the run starts


@dataclass
class HttpResult:
    """One request's outcome; times in seconds from when it was sent."""
    ok: bool = False
    error: str | None = None
    sent: float = 0.0                      # perf_counter when it was sent
    ttft: float | None = None
    e2e: float | None = None
    output_times: list[float] = field(default_factory=list)   # arrival of each chunk with output
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None     # when the server sends them (return_token_ids)
    usage_output_tokens: int | None = None
    prompt_tokens: int | None = None       # the usage chunk's, when sent
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def output_tokens(self) -> int:
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return len(self.token_ids) if self.token_ids is not None else len(self.output_times)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.output_times, self.output_times[1:])]

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        return (self.e2e - self.ttft) / (n - 1) if self.ok and n > 1 else None


@dataclass
class HttpRun:
    results: list[HttpResult | None]       # in request order; None: not sent, or cut off at max_seconds
    duration: float                        # first send to the last request's end
    peak_concurrency: int
    stopped_early: bool


def completion_payload(r: HttpRequest, model: str | None, return_token_ids: bool = False) -> dict:
    """Greedy, exactly max_tokens tokens (ignore_eos: a vLLM extension tinyvllm has too), streamed with usage."""
    payload = {"prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0.0, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}}
    if model is not None:
        payload["model"] = model
    if return_token_ids:                   # tinyvllm's and recent vLLM's extension; only when asked for
        payload["return_token_ids"] = True
    return payload


def _error_text(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


async def stream_completion(client, payload: dict) -> HttpResult:
    import httpx
    r = HttpResult(sent=time.perf_counter())
    data = ""
    try:
        async with client.stream("POST", COMPLETIONS_PATH, json=payload) as response:
            if response.status_code != 200:
                r.error = f"HTTP {response.status_code}: {_error_text(await response.aread())}"
                return r
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    r.e2e = time.perf_counter() - r.sent
                    break
                _take_chunk(r, json.loads(data), time.perf_counter() - r.sent)
                if r.error:
                    return r
    except httpx.HTTPError as e:
        r.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return r
    except ValueError:
        r.error = f"a chunk is not JSON: {data[:80]!r}"
        return r
    if r.e2e is None:
        r.error = "the stream ended before data: [DONE]"
    elif r.ttft is None:
        r.error = "the stream carried no output"
    r.ok = r.error is None
    return r


def _take_chunk(r: HttpResult, chunk: dict, t: float) -> None:
    if not isinstance(chunk, dict):
        r.error = f"a chunk is not a JSON object: {str(chunk)[:80]}"
        return
    if chunk.get("error"):
        error = chunk["error"]
        r.error = "error event: " + (error.get("message", str(error)) if isinstance(error, dict) else str(error))
        return
    if chunk.get("usage"):
        r.usage_output_tokens = chunk["usage"].get("completion_tokens")
        r.prompt_tokens = chunk["usage"].get("prompt_tokens")
    for choice in chunk.get("choices") or []:
        text, ids = choice.get("text") or "", choice.get("token_ids")
        if text or ids:
            r.ttft = t if r.ttft is None else r.ttft
            r.output_times.append(t)
        r.text_parts.append(text)
        if ids:
            r.token_ids = r.token_ids if r.token_ids is not None else []
            r.token_ids.extend(ids)
        r.finish_reason = choice.get("finish_reason") or r.finish_reason


async def _run(base_url: str, requests: list[HttpRequest], model: str | None, max_concurrency: int | None,
               max_seconds: float, return_token_ids: bool, progress) -> HttpRun:
    import httpx
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    timeout = httpx.Timeout(max_seconds, connect=CONNECT_TIMEOUT_S)
    results: list[HttpResult | None] = [None] * len(requests)
    in_flight = peak = 0
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(i: int, client):
        nonlocal in_flight, peak
        async with gate:
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                results[i] = await stream_completion(client, completion_payload(requests[i], model, return_token_ids))
            finally:
                in_flight -= 1
                progress(sum(r is not None for r in results))

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.perf_counter()
        deadline = start + max_seconds
        tasks = []
        for i in sorted(range(len(requests)), key=lambda i: requests[i].arrival):
            wait = start + requests[i].arrival - time.perf_counter()
            if start + requests[i].arrival >= deadline:
                break
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(i, client)))
        pending = set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - start
    return HttpRun(results, duration, peak, stopped_early=len(tasks) < len(requests) or bool(pending))


def run_requests(base_url: str, requests: list[HttpRequest], model: str | None = None,
                 max_concurrency: int | None = None, max_seconds: float = 300.0, return_token_ids: bool = False,
                 progress=lambda done: None) -> HttpRun:
    """Send every request at its arrival time; stop waiting (and cancel what runs) after max_seconds."""
    return asyncio.run(_run(base_url.rstrip("/"), requests, model, max_concurrency, max_seconds, return_token_ids,
                            progress))


def probe_server(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> dict:
    """GET /v1/models: {"model": the first model's id, "max_model_len": its context or None}; {"error": ...}
    when the server cannot be asked (the run then goes on, and its requests fail and are counted)."""
    import httpx
    try:
        response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout, trust_env=False)
        if response.status_code != 200:
            return {"error": f"GET /v1/models: HTTP {response.status_code}: {_error_text(response.content)}"}
        card = response.json()["data"][0]
        return {"model": card["id"], "max_model_len": card.get("max_model_len")}
    except httpx.HTTPError as e:
        return {"error": f"GET /v1/models: {type(e).__name__}: {e}"}
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return {"error": f"GET /v1/models: unexpected answer ({type(e).__name__}: {e})"}
