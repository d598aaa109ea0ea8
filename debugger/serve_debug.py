"""`tinyvllm serve --debug` and `tinyvllm debug --replay FILE`: the debugger steps an engine whose requests
come from outside it (HTTP clients, or a recorded session).

    feed = SteppedEngineLoop(engine)        # the serving EngineLoop without its thread: session.feed = feed
    session.step_stage()                    # before a step, the requests that arrived enter the engine
                                            # (feed.admit); after it, each client gets its tokens (after_step)

A feed is what a debugger Session asks, between steps, for requests to let in (`admit`), and tells what each
step produced (`after_step`); it also names each request's client and stream state for the scheduler panel.
SteppedEngineLoop is the HTTP server's EngineLoop (the same inbox, sinks, metrics observers and recorder),
except that nothing steps on its own: HTTP handlers submit into its inbox from uvicorn's thread, and the
debugger's worker thread lets them in when it steps. A client waiting on a paused server is never timed
out here; when one goes away, its request is aborted as soon as no step is in progress (at once while
paused), which frees its KV blocks. ReplayFeed lets a recording's requests in at their recorded steps.
"""
from __future__ import annotations

import contextvars
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from debugger.session import RequestView, describe_params
from tinyvllm.errors import TinyVLLMError
from tinyvllm.serving.engine_loop import EngineLoop, Update, AbortCommand, AddCommand, Inbox
from tinyvllm.serving.replay import RequestResult

_HTTP_CLIENT: contextvars.ContextVar = contextvars.ContextVar("tinyvllm_http_client", default=None)
MAX_BODY_PEEK = 1 << 20   # bytes of a request body read for its "stream" field


# ---- who sent a request ------------------------------------------------------------------------------
@dataclass
class HttpClient:
    address: str                 # host:port
    stream: bool | None = None   # the body's "stream" field, once the body has been read


class ClientTagger:
    """ASGI middleware: the handler of each HTTP request sees its client (address, whether it asked to
    stream) in a context variable, which SteppedEngineLoop.submit reads. Nothing else changes."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host, port = scope.get("client") or ("?", 0)
        client = HttpClient(f"{host}:{port}")
        body = bytearray()

        async def peek():
            message = await receive()
            if message["type"] == "http.request" and len(body) < MAX_BODY_PEEK:
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    client.stream = _asks_to_stream(bytes(body))
            return message

        token = _HTTP_CLIENT.set(client)
        try:
            await self.app(scope, peek, send)
        finally:
            _HTTP_CLIENT.reset(token)


def _asks_to_stream(body: bytes) -> bool:
    try:
        return json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        return False


@dataclass
class ClientRecord:
    """One request as its client sees it."""
    client: str | None
    stream: bool | None
    prompt_text: str
    num_prompt_tokens: int
    params: object
    in_engine: bool = False
    tokens_sent: int = 0
    finish_reason: str | None = None
    gone: bool = False           # the client went away before its answer was complete

    def describe(self) -> str:
        sent = f"{self.tokens_sent} sent"
        if self.gone:
            return "client gone · " + ("aborted" if self.finish_reason else "abort at the step's end")
        if self.finish_reason:
            return f"done · {sent}"
        if not self.in_engine:
            return "arrived · enters at the next step"
        if self.stream:
            return f"streaming · {sent}"
        return f"waiting for the whole answer · {self.tokens_sent} made" if self.stream is False else sent


# ---- feeds -------------------------------------------------------------------------------------------
class Feed:
    """What a debugger Session asks of a source of requests (see the module docstring); this one has none."""
    serves_forever = False        # `c` waits for more requests instead of stopping when all are done
    done = False                  # every request it will ever give has run (a replay at its end)
    num_requests = 0              # how many it gives in all (a replay's), 0 when that is not known

    def admit(self, session, adds: bool = True) -> list[str]:
        return []

    def after_step(self, session, outputs) -> None:
        pass

    def pending_views(self) -> tuple[RequestView, ...]:
        return ()

    def client_of(self, request_id: str) -> str | None:
        return None

    def stream_state(self, request_id: str) -> str:
        return ""

    def status(self) -> str:
        return ""

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def toggle_recording(self) -> str:
        return "recording is for serve --debug (its clients' requests)"

    def report(self) -> str | None:
        return None

    def record_edit(self, session, edit) -> None:
        """The session made a value edit (value_edit.ValueEdit) in the stage it stands at."""

    def edits_due(self, session, stage: str) -> list:
        """Value edits to apply to `stage`'s output, which the session has just recorded (a replay's)."""
        return []


class SteppedEngineLoop(EngineLoop, Feed):
    """An EngineLoop that a debugger Session steps (no thread of its own); see the module docstring."""
    release_finished = False      # the debugger shows finished requests
    serves_forever = True

    def __init__(self, engine, max_waiting: int | None = None, observers=(), log=None, recorder=None,
                 model: str | None = None):
        super().__init__(engine, max_waiting, observers, log=log or (lambda message: None), recorder=recorder)
        self.model = model            # as the user named it, for recordings' headers
        self.url = ""
        self.on_change = lambda: None  # any thread: the inbox changed (the debugger refreshes its panels)
        self.records: dict[str, ClientRecord] = {}
        self.recording_path: str | None = None
        self._open = False

    # ---- any thread -----------------------------------------------------------------------------------
    def start(self) -> SteppedEngineLoop:
        self._open = True
        return self

    @property
    def alive(self) -> bool:
        return self._open and self.error is None

    def submit(self, prompt, params, sink, request_id: str | None = None, block: bool = False) -> str:
        request_id = self.new_request_id() if request_id is None else request_id
        client = _HTTP_CLIENT.get()
        ids = prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else None
        text = self.engine.tokenizer.decode(ids) if ids is not None else str(prompt)
        record = ClientRecord(client.address if client else None, client.stream if client else None, text,
                              len(ids) if ids is not None else 0, params)
        with self._cond:
            if request_id not in self._live:
                self.records[request_id] = record
        try:
            request_id = super().submit(prompt, params, sink, request_id, block)
        except BaseException:
            with self._cond:
                if self.records.get(request_id) is record:
                    del self.records[request_id]
            raise
        self.on_change()
        return request_id

    def abort(self, request_id: str) -> None:
        with self._cond:
            record = self.records.get(request_id)
            if request_id in self._live and record is not None and record.finish_reason is None:
                record.gone = True
        super().abort(request_id)
        self.on_change()

    def wait(self, timeout: float) -> None:
        with self._cond:
            if not self._inbox.commands:
                self._cond.wait(timeout)

    # ---- the stepping thread (under the session's lock) -------------------------------------------------
    def admit(self, session, adds: bool = True) -> list[str]:
        """Apply the inbox: new requests enter the engine (unless not `adds`: then only the aborts of
        clients that went away apply, those still in the inbox answered at once). Returns the ids let in."""
        dropped = []
        with self._cond:
            if adds:
                commands, self._inbox = self._inbox.commands, Inbox()
            else:
                commands = [c for c in self._inbox.commands if isinstance(c, AbortCommand)]
                gone = {c.request_id for c in commands}
                dropped = [c for c in self._inbox.commands if isinstance(c, AddCommand) and c.request_id in gone]
                kept = [c for c in self._inbox.commands if not isinstance(c, AbortCommand) and c not in dropped]
                self._inbox = Inbox(kept, len(kept))
                self._live.difference_update(c.request_id for c in dropped)
                commands = [c for c in commands if c.request_id not in {d.request_id for d in dropped}]
        for c in dropped:   # never reached the engine: it ends here
            self.records[c.request_id].finish_reason = "abort"
            self._call(c.sink, [Update(c.request_id, [], finished=True, finish_reason="abort", token_ids=[], text="")])
        if not commands:
            return []
        self._apply(commands, session.add_request)
        for c in commands:
            if isinstance(c, AbortCommand) and c.request_id in self.records and c.request_id in self._sinks:
                self.records[c.request_id].finish_reason = self.engine.request(c.request_id).finish_reason
        admitted = [c.request_id for c in commands if isinstance(c, AddCommand) and c.request_id in self._sinks]
        for request_id in admitted:
            self.records[request_id].in_engine = True
        with self._cond:
            self.state = self._engine_state()
        return admitted

    def after_step(self, session, outputs) -> None:
        """Hand each client its tokens (the serving loop's dispatch), then apply the aborts that waited
        for the step to end."""
        for out in outputs:
            record = self.records.get(out.request_id)
            if record is not None:
                record.tokens_sent += len(out.new_token_ids)
                if out.finished:
                    record.finish_reason = out.finish_reason
        self._dispatch(outputs)
        self.admit(session, adds=False)

    def close(self) -> None:
        """The debugger quit: every request still in flight ends with finish_reason "abort" (its client gets
        its answer so far), nothing more is accepted, the recording is closed."""
        with self._cond:
            self._accepting = False
            self._open = False
            inbox, self._inbox = self._inbox, Inbox()
            waiting = [c for c in inbox.commands if isinstance(c, AddCommand)]
            self._live.difference_update(c.request_id for c in waiting)
        for c in waiting:
            self._call(c.sink, [Update(c.request_id, [], finished=True, finish_reason="abort", token_ids=[], text="")])
        in_engine = [r for r in list(self._live) if r in self._sinks]
        for request_id in in_engine:
            self._record("abort", request_id)
            self.engine.abort_request(request_id)
        if in_engine:
            self._dispatch([o for o in self.engine.step() if o.finished])  # only the aborts: nothing else runs
        if self.recorder is not None:
            self.recorder.close()
        self.state = self._engine_state(alive=False)

    # ---- what the debugger shows ------------------------------------------------------------------------
    def pending_views(self) -> tuple[RequestView, ...]:
        with self._cond:
            waiting = [c for c in self._inbox.commands if isinstance(c, AddCommand)]
        views = []
        for c in waiting:
            r = self.records.get(c.request_id)
            if r is None:
                continue
            views.append(RequestView(c.request_id, r.prompt_text, "arrived", r.num_prompt_tokens, 0, (), "", None,
                                     None, None, None, None, None, r.client, describe_params(c.params), r.describe()))
        return tuple(views)

    def client_of(self, request_id: str) -> str | None:
        record = self.records.get(request_id)
        return record.client if record is not None else None

    def stream_state(self, request_id: str) -> str:
        record = self.records.get(request_id)
        return record.describe() if record is not None else ""

    def status(self) -> str:
        parts = [f"serving {self.url}" if self.url else "serving"]
        if self.recorder is not None:
            parts.append(f"recording {self.recording_path}")
        return " · ".join(parts)

    def record_edit(self, session, edit) -> None:
        if self.recorder is not None:
            self.recorder.edit(self.engine, edit.stage, edit.select, edit.expr)

    def toggle_recording(self, path: str | Path | None = None) -> str:
        """Start recording to `path` (default: the first free tinyvllm-session[-N].jsonl here), or stop."""
        from tinyvllm.serving.recording import Recorder
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            recorder.close()
            return f"recording stopped: {self.recording_path} (tinyvllm debug --replay {self.recording_path})"
        path = Path(path) if path is not None else free_path(Path("tinyvllm-session.jsonl"))
        self.recorder = Recorder.open(path, self.engine, model=self.model)
        self.recording_path = str(path)
        return (f"recording to {path}: requests from now on (those in flight are not in it); w stops")


def free_path(path: Path) -> Path:
    """`path`, or path-2, path-3, ... : the first that does not exist."""
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


class ReplayFeed(Feed):
    """A recording's requests, let in at their recorded engine steps (replay.ReplayQueue), for the debugger."""

    def __init__(self, recording, engine):
        from tinyvllm.serving.replay import ReplayQueue
        self.queue = ReplayQueue(recording)
        self._recorded = {r.request_id: r for r in recording.requests}
        self.engine = engine
        self.first_step = engine.num_steps
        self.started = time.perf_counter()
        self.edits_applied = 0    # of the recording's value edits

    @property
    def done(self) -> bool:
        return not self.queue.has_arrivals and not self.engine.has_unfinished_requests()

    @property
    def num_requests(self) -> int:
        return len(self.queue.recording.requests)

    def admit(self, session, adds: bool = True) -> list[str]:
        """The requests and aborts due before this step, into the engine and, through the session, into its
        precision shadow (which must see every request and abort at the same step to stay in lockstep)."""
        if not adds:
            return []
        aborts_due = list(self.queue.aborts)
        queued = self.queue.admit(session.engine, session.add_request)
        for _step, _line, request_id in aborts_due[:len(aborts_due) - len(self.queue.aborts)]:  # the ones applied
            session.mirror_abort(request_id)
        return queued

    def edits_due(self, session, stage: str) -> list:
        """The recorded edits of this stage in this step (recorded step = engine.num_steps + the queue's offset)."""
        from debugger.value_edit import ValueEdit
        step = self.engine.num_steps + self.queue.offset
        due = [ValueEdit(session.engine.num_steps, e.stage, e.select, e.expr)
               for e in self.queue.recording.edits if e.step == step and e.stage == stage]
        self.edits_applied += len(due)
        return due

    def after_step(self, session, outputs) -> None:
        self.queue.on_outputs(session.engine, outputs)

    def pending_views(self) -> tuple[RequestView, ...]:
        views = []
        for r in self.queue.arrivals:
            due = max(r.step - self.queue.offset, self.engine.num_steps)
            views.append(RequestView(r.request_id, self.engine.tokenizer.decode(r.prompt_token_ids), "due",
                                     len(r.prompt_token_ids), 0, (), "", None, None, None, None, None, None, None,
                                     describe_params(self.queue.params[r.request_id]), f"enters before step {due}"))
        return tuple(views)

    def stream_state(self, request_id: str) -> str:
        recorded = self._recorded.get(request_id)
        if recorded is None:
            return ""
        if request_id not in self.queue.finished:
            return f"recorded {len(recorded.token_ids or [])} tokens"
        replayed, reason = self.queue.finished[request_id][:2]
        result = RequestResult(request_id, recorded.token_ids, replayed, recorded.finish_reason, reason)
        if result.recorded is None:
            return "not recorded to the end"
        return ("match" if result.matched else f"DIVERGED at token {result.diverged_at}"
                if result.diverged_at is not None else "DIVERGED (finish reason)")

    def _report(self, finished_only: bool = False):
        """The replay report; `finished_only`: of the requests that have finished (the others have nothing to
        compare yet, and would read as diverged at token 0)."""
        report = self.queue.report(self.engine, time.perf_counter() - self.started,
                                   self.engine.num_steps - self.first_step)
        if finished_only:
            report.results = [r for r in report.results if r.request_id in self.queue.finished]
        return report

    def status(self) -> str:
        done = len(self.queue.finished)
        return f"replaying {self.queue.recording.path}: {done}/{self.num_requests} finished" + (" · v: report" if done else "")

    def summary(self) -> str:
        report = self._report(finished_only=True)
        compared = sum(r.recorded is not None for r in report.results)
        unfinished = self.num_requests - len(report.results)
        return (f"replay: {report.num_matched}/{compared} requests match token for token, {len(report.diverged)} "
                f"diverged" + (f", {unfinished} not finished yet" if unfinished else ""))

    def report(self) -> str:
        """Each finished request against its recorded answer; before the end, only those, and says so."""
        from tinyvllm.serving.replay import format_report
        if self.done:
            missed = len(self.queue.recording.edits) - self.edits_applied
            return format_report(self._report()) + (
                f"\n{missed} recorded value edit(s) never applied: their step and stage did not run in the replay"
                if missed else "")
        report = self._report(finished_only=True)
        compared = sum(r.recorded is not None for r in report.results)
        headline = (f"{len(report.results)} of {self.num_requests} requests finished so far: "
                    f"{report.num_matched}/{compared} match; run to the end (c) to verify the rest")
        return headline + ("\n\n" + format_report(report) if report.results else "")

    @property
    def diverged(self) -> bool:
        """A finished request's tokens differ from the recorded answer."""
        return bool(self._report(finished_only=True).diverged)


# ---- the commands --------------------------------------------------------------------------------------
class ServerThread:
    """uvicorn serving an engine loop's HTTP API from a background thread (no signal handlers, no logging
    setup: the terminal belongs to the debugger)."""

    def __init__(self, engine_loop, sock, model_name: str, api_key: str | None = None, access_log: bool = False):
        import uvicorn
        from tinyvllm.serving.app import create_app
        from tinyvllm.serving.server import BACKSTOP_S, STATIC_DIR, clean_exit_server
        from tinyvllm.serving.context import ServingContext
        self.ctx = ServingContext.create(engine_loop, model_name, api_key)
        app = ClientTagger(create_app(self.ctx, static_dir=STATIC_DIR))
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=access_log, lifespan="off",
                                timeout_graceful_shutdown=BACKSTOP_S)
        self.server = clean_exit_server(config)
        self.sock = sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="tinyvllm-http")

    def start(self, timeout: float = 60) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise TinyVLLMError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.sock.close()


def serving_session(engine, model: str | None, goldens=None, max_waiting: int | None = None, options=None):
    """A debugger Session whose feed is a SteppedEngineLoop on `engine` (no requests of its own)."""
    from debugger.session import Session
    feed = SteppedEngineLoop(engine, max_waiting=max_waiting, model=model)
    session = Session(engine, goldens, initial_prompts=[], options=options)
    session.feed = feed
    return session, feed


def run(args) -> int:
    """tinyvllm serve --debug: HTTP in the background, the debugger in the foreground; 0 when it quits."""
    from debugger.app import DebuggerApp
    from tinyvllm.engine.args import build_engine
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
    from tinyvllm.serving.server import listen, served_model_name
    from debugger.divergence import comparison_for
    from debugger.session import SessionOptions
    if args.jsonl:
        raise TinyVLLMError("--debug serves HTTP; it does not go with --jsonl")
    comparison = comparison_for(args)
    sock = listen(args.host, args.port)  # before the model loads: a busy port fails at once
    engine = build_engine(args, reference=True)
    goldens = Goldens.load(DEFAULT_GOLDENS) if args.model is None else None
    session, feed = serving_session(engine, args.model, goldens, args.max_waiting,
                                    SessionOptions(record_rows=comparison is not None))
    session.divergence = comparison
    if args.record:
        feed.toggle_recording(args.record)
    model_name = served_model_name(args.model, args.served_model_name)
    server = ServerThread(feed, sock, model_name, args.api_key, args.access_log)
    feed.url = server.url
    feed.start()
    server.start()
    print(f"tinyvllm serve --debug: model {model_name!r} on {server.url}; the debugger steps it",
          file=sys.stderr, flush=True)
    app = DebuggerApp(session)
    try:
        app.run()
    finally:
        session.close()   # every client still waiting gets finish_reason "abort"
        server.stop()
    if feed.recording_path:
        print(f"tinyvllm serve --debug: recorded to {feed.recording_path}", file=sys.stderr)
    if app.failure is not None:
        raise app.failure
    return app.return_code or 0


def replay_session(path: str, model: str | None = None, goldens=None, options=None):
    """(Session, ReplayFeed) for a recording: its model (or `model`) and engine configuration."""
    from debugger.session import Session
    from tinyvllm.engine.engine import LLMEngine
    from tinyvllm.serving.recording import read_recording
    from tinyvllm.serving.replay import engine_config_for
    recording = read_recording(path)
    engine = LLMEngine(model or recording.header.get("model"), engine_config_for(recording),
                       log=lambda message: None)
    feed = ReplayFeed(recording, engine)
    session = Session(engine, goldens, initial_prompts=[], options=options)
    session.feed = feed
    return session, feed


def run_debug_replay(args) -> int:
    from debugger.app import DebuggerApp
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
    from debugger.divergence import comparison_for
    from debugger.session import SessionOptions
    goldens = None if args.no_goldens or args.model else Goldens.load(args.goldens or DEFAULT_GOLDENS)
    compares = bool(getattr(args, "compare_alone", False) or getattr(args, "against", None))
    options = SessionOptions(record_rows=compares, compare_precision=bool(getattr(args, "compare_precision", False)))
    session, feed = replay_session(args.replay, args.model, goldens, options)
    session.divergence = comparison_for(args, session)
    app = DebuggerApp(session)
    app.run()
    if app.failure is not None:
        raise app.failure
    print(feed.report())
    return 1 if feed.diverged else (app.return_code or 0)
