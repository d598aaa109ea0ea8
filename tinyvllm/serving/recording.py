"""A serving session as JSONL: what arrived, when, and what the server answered (`tinyvllm serve --record FILE`).

    {"type": "header", "format": "tinyvllm-recording", "version": 1, "model": DIR, "engine_config": {...}, ...}
    {"type": "request", "id": ID, "t": 0.41, "step": 12, "endpoint": "completions", "prompt_token_ids": [...],
     "prompt_text": "...", "params": {... "seed": the seed the engine used}, "seed_from": "client" | "engine"}
    {"type": "abort", "id": ID, "t": ..., "step": 15}               (a client went away, or the shutdown timeout)
    {"type": "finished", "id": ID, "t": ..., "step": 20, "token_ids": [...], "text": "...", "finish_reason": ...}
    {"type": "refused", "id": ID, "t": ..., "step": ..., "error": ...}  (the engine refused it: it never ran)
    {"type": "edit", "t": ..., "step": 3, "stage": "layers.0.q", "select": "row 0", "expr": "x * 0"}
        (a value edit made in the debugger, serve --debug: debugger/value_edit.py; debug --replay applies it again
        after that stage of that step, the headless replay cannot and says so)

`step` is LLMEngine.num_steps when the line was written: a request recorded at step k was queued before the
engine's step k ran (the engine loop adds its inbox between steps), which is what replay.py reproduces. The
engine loop calls the Recorder on its own thread; a lock keeps lines whole if another thread writes too, and
every line is flushed, so a crashed server leaves a readable recording up to its last line.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tinyvllm.errors import TinyVLLMError

FORMAT = "tinyvllm-recording"
VERSION = 1
LINE_TYPES = ("header", "request", "abort", "finished", "refused", "edit")
ENDPOINTS = {"cmpl": "completions", "chatcmpl": "chat.completions", "line": "jsonl"}


class BadRecording(TinyVLLMError, ValueError):
    """A recording that cannot be read; the message starts with file:line."""


def endpoint_of(request_id: str) -> str:
    """Which front end made the request, from its id's prefix (cmpl-..., chatcmpl-..., line-N)."""
    return ENDPOINTS.get(request_id.split("-", 1)[0], "engine")


class Recorder:
    def __init__(self, out: TextIO, engine, model: str | None = None, close: bool = False):
        """Writes the header at once. `model`: as the user named it (None: the demo model)."""
        self._out, self._close = out, close
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._decode = engine.tokenizer.decode
        self._ids: set[str] = set()   # requests this recording saw arrive (one started mid-session skips the others)
        self._write({"type": "header", "format": FORMAT, "version": VERSION,
                     "model": None if model is None else str(model), "model_dir": str(engine.model.model_dir),
                     "engine_config": dataclasses.asdict(engine.config), "max_model_len": engine.max_model_len,
                     "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})

    @classmethod
    def open(cls, path: str | Path, engine, model: str | None = None) -> Recorder:
        try:
            out = open(path, "w", encoding="utf-8")
        except OSError as e:
            raise TinyVLLMError(f"cannot write the recording {path}: {e.strerror}") from e
        return cls(out, engine, model, close=True)

    # ---- called by the engine loop, on its thread ------------------------------------------------------
    def request(self, engine, request_id: str) -> None:
        """A request the engine has just queued (before its next step)."""
        r = engine.request(request_id)
        self._ids.add(request_id)
        params = dataclasses.asdict(r.params) | {"seed": r.seed}
        self._write({"type": "request", "id": request_id, "t": self._t(), "step": engine.num_steps,
                     "endpoint": endpoint_of(request_id), "prompt_token_ids": list(r.prompt_token_ids),
                     "prompt_text": r.prompt if r.prompt is not None else self._decode(r.prompt_token_ids),
                     "params": params, "seed_from": "engine" if r.params.seed is None else "client"})

    def abort(self, engine, request_id: str) -> None:
        if request_id not in self._ids:
            return
        self._write({"type": "abort", "id": request_id, "t": self._t(), "step": engine.num_steps})

    def finished(self, engine, update) -> None:
        """`update`: the engine loop's last Update of a request."""
        if update.request_id not in self._ids:
            return
        self._write({"type": "finished", "id": update.request_id, "t": self._t(), "step": engine.num_steps,
                     "token_ids": list(update.token_ids or []), "text": update.text or "",
                     "finish_reason": update.finish_reason, "error": update.error})

    def refused(self, engine, request_id: str, error: str) -> None:
        self._ids.add(request_id)
        self._write({"type": "refused", "id": request_id, "t": self._t(), "step": engine.num_steps, "error": error})

    def edit(self, engine, stage: str, select: str, expr: str) -> None:
        """A value edit of `stage`'s output in the step now running (engine.num_steps)."""
        self._write({"type": "edit", "t": self._t(), "step": engine.num_steps, "stage": stage, "select": select,
                     "expr": expr})

    def close(self) -> None:
        with self._lock:
            if self._close and not self._out.closed:
                self._out.close()

    def _t(self) -> float:
        return round(time.perf_counter() - self._t0, 6)

    def _write(self, obj: dict) -> None:
        line = json.dumps(obj, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            if not self._out.closed:
                self._out.write(line)
                self._out.flush()


# ---- reading ---------------------------------------------------------------------------------------------
@dataclass
class RecordedRequest:
    request_id: str
    t: float
    step: int
    prompt_token_ids: list[int]
    params: dict                      # SamplingParams fields, the seed the engine used included
    endpoint: str = "engine"
    line: int = 0                     # where it is in the file
    abort_step: int | None = None     # when it was aborted, if it was
    token_ids: list[int] | None = None  # the recorded answer (None: the recording ends before it finished)
    text: str | None = None
    finish_reason: str | None = None
    finish_step: int | None = None    # LLMEngine.num_steps after the step that finished it


def check_recording_path(path: str | Path) -> None:
    """Refuse a recording path whose directory is missing or not writable: called before a model loads, so that
    serve --record and debug --record fail at once rather than after the load (Recorder.open still reports a write
    that fails later)."""
    if not os.access(Path(path).resolve().parent, os.W_OK):
        raise TinyVLLMError(f"cannot write the recording {path}: its directory is missing or not writable")


@dataclass(frozen=True)
class RecordedEdit:
    """A value edit: SELECT = EXPR on `stage`'s output in step `step` (the debugger's value_edit.py reads them)."""
    step: int
    stage: str
    select: str
    expr: str
    line: int = 0


@dataclass
class Recording:
    path: str
    header: dict
    requests: list[RecordedRequest]   # in arrival order
    edits: list[RecordedEdit] = field(default_factory=list)   # in the order they were made

    @property
    def engine_config(self) -> dict:
        return dict(self.header.get("engine_config") or {})


def read_recording(path: str | Path) -> Recording:
    """Parse and check a recording; BadRecording names file:line and what is wrong."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise BadRecording(f"cannot read the recording {path}: {e.strerror}") from e
    header, requests, by_id, edits = None, [], {}, []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadRecording(f"{where}: not JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(obj, dict) or obj.get("type") not in LINE_TYPES:
            raise BadRecording(f"{where}: expected an object with \"type\" one of {', '.join(LINE_TYPES)}")
        kind = obj["type"]
        if header is None:
            if kind != "header" or obj.get("format") != FORMAT:
                raise BadRecording(f"{where}: not a tinyvllm recording (the first line must be its header, "
                                   f"format {FORMAT!r})")
            if obj.get("version") != VERSION:
                raise BadRecording(f"{where}: recording format version {obj.get('version')!r}, this tinyvllm "
                                   f"reads version {VERSION}")
            header = obj
            continue
        if kind == "edit":
            edits.append(RecordedEdit(_step(obj, where), _field(obj, "stage", str, where),
                                      _field(obj, "select", str, where), _field(obj, "expr", str, where), n))
            continue
        request_id = _field(obj, "id", str, where)
        if kind == "request":
            if request_id in by_id:
                raise BadRecording(f"{where}: request id {request_id!r} recorded twice")
            ids = _field(obj, "prompt_token_ids", list, where)
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise BadRecording(f"{where}: prompt_token_ids must be a non-empty list of integers >= 0")
            r = RecordedRequest(request_id, float(_field(obj, "t", (int, float), where)),
                                _step(obj, where), ids, _field(obj, "params", dict, where),
                                obj.get("endpoint", "engine"), n)
            by_id[request_id] = r
            requests.append(r)
        elif kind in ("abort", "finished"):
            r = by_id.get(request_id)
            if r is None:
                raise BadRecording(f"{where}: {kind} of request {request_id!r}, which was not recorded before")
            if kind == "abort":
                r.abort_step = _step(obj, where)
            else:
                token_ids = _field(obj, "token_ids", list, where)
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
                    raise BadRecording(f"{where}: token_ids must be a list of integers")
                r.token_ids, r.text, r.finish_reason = token_ids, obj.get("text"), obj.get("finish_reason")
                r.finish_step = _step(obj, where)
    if header is None:
        raise BadRecording(f"{path}: empty: not a tinyvllm recording")
    return Recording(path, header, requests, edits)


def _field(obj: dict, name: str, kind, where: str):
    value = obj.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else "a number"
        raise BadRecording(f"{where}: field {name!r} must be {names}, got {value!r}")
    return value


def _step(obj: dict, where: str) -> int:
    step = _field(obj, "step", int, where)
    if step < 0:
        raise BadRecording(f"{where}: field 'step' must be >= 0, got {step}")
    return step
