"""`tinyvllm serve --jsonl`: requests on stdin, one JSON object a line; results on stdout, one a line.

    in:   {"id": "a", "prompt": "The sun rose", "max_tokens": 8}
          {"id": 7, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "seed": 1}
    out:  {"id": "a", "finished": true, "text": "...", "token_ids": [...], "finish_reason": "length",
           "prompt_tokens": 6, "metrics": {"queue_ms": ..., "ttft_ms": ..., "tpot_ms": ..., "e2e_ms": ...}}
    --stream, before each result:  {"id": "a", "finished": false, "delta": "...", "delta_token_ids": [...]}
    a line that cannot run:        {"id": <its id, or null>, "line": 3, "error": "..."}

A request runs as soon as its line is read, batched with the ones in flight (continuous batching);
results come in the order requests finish. Sampling fields are the HTTP API's (temperature, top_p,
top_k, seed, max_tokens, min_tokens, stop, stop_token_ids, ignore_eos), checked the same way. "id" is
optional: a line without one is "line-N" (N its line number, from 1), a namespace of its own so that it
never collides with an explicit id (an explicit string of that form is refused). At EOF the loop drains
what is in flight and exits 0; SIGINT / SIGTERM stop reading and abort what has not finished within the
shutdown timeout. Logs go to stderr only.
"""
from __future__ import annotations

import json
import re
import signal
import threading
from typing import Iterable, TextIO

from pydantic import Field, ValidationError, model_validator

from tinyvllm.serving.detokenizer import IncrementalDetokenizer
from tinyvllm.serving.engine_loop import DuplicateRequestId, EngineLoop, LoopClosed, Update
from tinyvllm.serving.inputs import RequestInputs
from tinyvllm.serving.protocol import ApiError, ChatMessage, Int, SamplingFields, TokenIds, validation_error


DEFAULT_ID = "line-{}"
_DEFAULT_ID_FORM = re.compile(r"line-[0-9]+")


class JsonlRequest(SamplingFields):
    id: str | int | None = None
    prompt: str | TokenIds | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    max_tokens: Int | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError('give exactly one of "prompt" and "messages"')
        return self

    def engine_prompt(self):
        if self.messages is None:
            return self.prompt
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


class JsonlWriter:
    """Writes result, delta and error lines; the engine loop's sink (called on its thread) and the reader's
    error channel, so every write holds a lock and flushes."""

    def __init__(self, out: TextIO, decode, stream: bool):
        self.out, self.decode, self.stream = out, decode, stream
        self._lock = threading.Lock()
        self._requests: dict[str, tuple[object, IncrementalDetokenizer]] = {}   # request id -> (user id, ...)

    def write(self, obj: dict) -> None:
        line = json.dumps(obj, ensure_ascii=False)
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def error(self, user_id, line: int, message: str) -> None:
        self.write({"id": user_id, "line": line, "error": message})

    def expect(self, request_id: str, user_id, stop: tuple[str, ...]) -> None:
        with self._lock:
            self._requests[request_id] = (user_id, IncrementalDetokenizer(self.decode, stop))

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._requests.pop(request_id, None)

    def in_flight(self, user_id) -> bool:
        with self._lock:
            return any(uid == user_id and type(uid) is type(user_id) for uid, _ in self._requests.values())

    def __call__(self, updates: list[Update]) -> None:
        for u in updates:
            with self._lock:
                user_id, detok = self._requests[u.request_id]
            if self.stream and u.new_token_ids:
                # the last update's text comes from the engine's final text (stop strings cut)
                delta = detok.finish(u.text) if u.finished else detok.add(u.new_token_ids)
                self.write({"id": user_id, "finished": False, "delta": delta, "delta_token_ids": u.new_token_ids})
            if u.finished:
                self.forget(u.request_id)
                self.write(self._result(user_id, u))

    @staticmethod
    def _result(user_id, u: Update) -> dict:
        result = {"id": user_id, "finished": True, "text": u.text, "token_ids": u.token_ids,
                  "finish_reason": u.finish_reason, "prompt_tokens": u.num_prompt_tokens}
        if u.error:
            result["error"] = u.error
        m = u.metrics
        if m is not None:
            result["metrics"] = {"queue_ms": _ms(m.queue_time), "ttft_ms": _ms(m.ttft), "tpot_ms": _ms(m.tpot),
                                 "e2e_ms": _ms(m.e2e)}
        return result


class _Interrupted(Exception):
    pass


def run(engine_loop: EngineLoop, lines: Iterable[str], out: TextIO, stream: bool = False,
        shutdown_timeout: float = 10.0, log=print) -> int:
    """Serve every line of `lines` through the (not yet started) engine loop; 0 when all were answered."""
    inputs = RequestInputs(engine_loop.engine)
    writer = JsonlWriter(out, engine_loop.engine.tokenizer.decode, stream)
    engine_loop.start()
    interrupted = _catch_signals()
    try:
        for n, line in enumerate(lines, 1):
            if line.strip():
                _submit(line, n, engine_loop, inputs, writer)
        log("jsonl: end of input, finishing the requests in flight")
        engine_loop.stop(timeout=None)
    except _Interrupted:
        log(f"jsonl: interrupted, finishing the requests in flight for up to {shutdown_timeout:g} s")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        engine_loop.stop(timeout=shutdown_timeout)
    finally:
        interrupted()
    if engine_loop.error is not None:
        log(f"jsonl: the engine failed: {engine_loop.error}")
        return 1
    return 0


def _submit(line: str, n: int, engine_loop: EngineLoop, inputs: RequestInputs, writer: JsonlWriter) -> None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return writer.error(None, n, f"not JSON: {e.msg} at column {e.colno}")
    if not isinstance(obj, dict):
        return writer.error(None, n, f"expected a JSON object, got {type(obj).__name__}")
    default_id = DEFAULT_ID.format(n)
    user_id = obj.get("id", default_id)
    try:
        request = JsonlRequest.model_validate(obj)
        prompt_text, ids = inputs.prepare_prompt(request.engine_prompt(),
                                                 "prompt" if request.messages is None else "messages")
        params = inputs.sampling_params(request, len(ids), request.max_tokens)
    except ValidationError as e:
        return writer.error(user_id if isinstance(user_id, (str, int)) else None, n, validation_error(e.errors()).message)
    except ApiError as e:
        return writer.error(user_id, n, e.message)
    user_id = request.id if request.id is not None else default_id
    if request.id is not None and isinstance(request.id, str) and _DEFAULT_ID_FORM.fullmatch(request.id):
        return writer.error(user_id, n, f'id {user_id!r}: ids of the form "line-N" are reserved for lines '
                                        f'without an id')
    if writer.in_flight(user_id):
        return writer.error(user_id, n, f"id {user_id!r} is already in flight")
    request_id = f"line-{n}"
    writer.expect(request_id, user_id, params.stop)
    try:
        engine_loop.submit(ids, params, writer, request_id=request_id, block=True)
    except (LoopClosed, DuplicateRequestId) as e:
        writer.forget(request_id)
        writer.error(user_id, n, str(e))


def _catch_signals():
    """SIGINT / SIGTERM raise _Interrupted in the reading thread; returns a function restoring the old handlers."""
    def handler(signum, frame):
        raise _Interrupted()

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(s, h) for s, h in old.items()]
