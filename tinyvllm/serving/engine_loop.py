"""The engine loop: one thread owns the LLMEngine and steps it while there is work.

    loop = EngineLoop(engine); loop.start()
    loop.submit(prompt, params, sink, request_id)   # any thread; sink(updates) is called on the loop's thread
    loop.abort(request_id)                          # any thread; its KV blocks are freed before the next step
    loop.stop(timeout)                              # stop accepting, finish for up to timeout s, abort the rest

Submissions and aborts go into an inbox guarded by a condition variable. The thread takes the whole inbox
between steps (a new request joins the running batch at the next step: continuous batching across
clients), steps the engine, and hands each sink the Updates of its requests, once per step. With nothing
to do it waits on the condition: no spinning. A finished request is released from the engine's tables
once its last Update is handed out, so memory stays flat however many requests the loop serves.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from tinyvllm.engine.engine import LLMEngine, RequestOutput
from tinyvllm.errors import TinyVLLMError
from tinyvllm.engine.metrics import RequestMetrics
from tinyvllm.log import log_to_stderr
from tinyvllm.engine.sampling_params import SamplingParams

STEP_SAMPLES_KEPT = 10_000  # the engine's per-step metrics samples a long-lived loop keeps


class LoopClosed(TinyVLLMError):
    """The loop no longer takes requests: it is shutting down, or its engine failed."""


class QueueFull(TinyVLLMError):
    """More requests are waiting than the loop's max_waiting allows."""


class DuplicateRequestId(TinyVLLMError, ValueError):
    """A request id that is still in flight."""


@dataclass(frozen=True)
class Update:
    """What one step did for one request. The fields under `finished` are set only on its last Update."""
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None            # "stop" | "length" | "abort" | "error"
    error: str | None = None
    num_prompt_tokens: int = 0
    new_logprobs: list[dict[int, float]] | None = None          # one dict per new token (logprobs API)
    prompt_logprobs: list[dict[int, float] | None] | None = None  # one per prompt token, once prefilled
    # finished only:
    token_ids: list[int] | None = None
    text: str | None = None                     # the whole output, stop strings cut
    metrics: RequestMetrics | None = None


Sink = Callable[[list[Update]], None]


@dataclass(frozen=True)
class EngineState:
    """The engine as of the loop's last step (read from any thread)."""
    num_running: int = 0
    num_waiting: int = 0          # in the scheduler's queue (preempted ones included)
    kv_usage: float = 0.0         # fraction of KV blocks in use
    num_blocks: int = 0
    block_size: int = 0
    num_steps: int = 0
    prefix_query_tokens: int = 0  # cumulative, as the block manager counts them
    prefix_hit_tokens: int = 0
    alive: bool = True


@dataclass(frozen=True)
class StepReport:
    """Handed to observers after each step, on the loop's thread."""
    t: float                      # time.perf_counter() at the end of the step
    state: EngineState
    updates: list[Update]
    num_batched_tokens: int
    num_preempted: int


@dataclass
class AddCommand:
    """A request for the engine thread to add at its next step (EngineLoop.submit)."""
    request_id: str
    prompt: object
    params: SamplingParams
    sink: Sink


@dataclass
class AbortCommand:
    """A request for the engine thread to abort at its next step."""
    request_id: str


@dataclass
class Inbox:
    """The commands submitted since the engine thread last took them, in order (a subclass that steps the engine
    itself, debugger/serve_debug.py's SteppedEngineLoop, reads them too)."""
    commands: list = field(default_factory=list)
    num_adds: int = 0


class EngineLoop:
    release_finished = True   # forget finished requests (a debugger stepping the engine keeps them to show)

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None, observers=(), log=log_to_stderr,
                 recorder=None):
        """`max_waiting`: submit() raises QueueFull while this many requests wait (None: no limit).
        `observers`: objects with on_step(StepReport), called on the loop's thread after every step.
        `recorder`: a recording.Recorder that gets every request, abort and answer (closed when the loop ends)."""
        self.engine = engine
        self.recorder = recorder
        self.max_waiting = max_waiting
        self.observers = list(observers)
        self.log = log
        self.error: BaseException | None = None    # why the loop's thread died, if it did
        self._cond = threading.Condition()
        self._inbox = Inbox()
        self._live: set[str] = set()                # submitted and not yet finished (guarded by _cond)
        self._sinks: dict[str, Sink] = {}           # the loop thread's own
        self._accepting = True
        self._stopping = False
        self._deadline = float("inf")
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        engine.metrics.keep_last_steps(STEP_SAMPLES_KEPT)
        self.state = self._engine_state()

    # ---- any thread -----------------------------------------------------------------------------
    def start(self) -> EngineLoop:
        assert self._thread is None, "the loop runs once"
        self._thread = threading.Thread(target=self._run, name="tinyvllm-engine-loop", daemon=True)
        self._thread.start()
        return self

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    def submit(self, prompt, params: SamplingParams, sink: Sink, request_id: str | None = None,
               block: bool = False) -> str:
        """Queue a prompt (text, token ids or chat messages) for the engine; returns its request id.
        Raises QueueFull when max_waiting requests already wait (or, with `block`, waits for room),
        LoopClosed when the loop is shutting down, DuplicateRequestId for an id still in flight."""
        request_id = self.new_request_id() if request_id is None else request_id
        with self._cond:
            while True:
                if not self._accepting or self.error is not None:
                    raise LoopClosed("the server is shutting down" if self.error is None
                                     else f"the engine stopped: {type(self.error).__name__}: {self.error}")
                if self.max_waiting is None or self.num_waiting < self.max_waiting:
                    break
                if not block:
                    raise QueueFull(f"{self.num_waiting} requests are waiting (--max-waiting {self.max_waiting})")
                self._cond.wait()
            if request_id in self._live:
                raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
            self._live.add(request_id)
            self._inbox.commands.append(AddCommand(request_id, prompt, params, sink))
            self._inbox.num_adds += 1
            self._cond.notify_all()
        return request_id

    def abort(self, request_id: str) -> None:
        """Abort a request if it is still in flight (a no-op otherwise); its sink gets a last Update."""
        with self._cond:
            if request_id in self._live:
                self._inbox.commands.append(AbortCommand(request_id))
                self._cond.notify_all()

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: the scheduler's queue as of the last step, plus the inbox."""
        return self.state.num_waiting + self._inbox.num_adds

    @property
    def num_in_flight(self) -> int:
        return len(self._live)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    def begin_stop(self, timeout: float | None = None) -> None:
        """Stop accepting; let the requests in flight finish for up to `timeout` seconds (None: until they
        are done), then abort the rest (their sinks see finish_reason "abort"); the thread then ends."""
        with self._cond:
            self._accepting = False
            self._stopping = True
            deadline = time.monotonic() + timeout if timeout is not None else float("inf")
            self._deadline = min(self._deadline, deadline)
            self._cond.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """begin_stop(timeout), and wait for the thread to end."""
        self.begin_stop(timeout)
        if self._thread is not None:
            self._thread.join()

    # ---- the loop's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._run_once():
                pass
        except BaseException as e:  # a bug or a device failure: fail every request in flight, say why
            self.error = e
            self.log(f"engine loop stopped: {type(e).__name__}: {e}")
            self._fail_all(f"the engine stopped: {type(e).__name__}: {e}")
        finally:
            if self.recorder is not None:
                self.recorder.close()
            self.state = self._engine_state(alive=False)
            with self._cond:
                self._cond.notify_all()

    def _run_once(self) -> bool:
        """Apply the inbox, step once if there is work; False when the loop should end."""
        engine = self.engine
        with self._cond:
            while not (self._inbox.commands or self._stopping or engine.has_unfinished_requests()):
                self._cond.wait()
            inbox, self._inbox = self._inbox, Inbox()
            past_deadline = self._stopping and time.monotonic() >= self._deadline
        if past_deadline:
            # A pipelined decode step launched before the deadline holds tokens already computed: report them
            # first, so a request whose last token it is ends as it would have with eager steps.
            settled = engine.settle()
            if settled:
                self._dispatch(settled)
            with self._cond:
                inbox.commands += [AbortCommand(r) for r in self._live]
        self._apply(inbox.commands, engine.add_request)
        if inbox.num_adds:
            with self._cond:  # the requests moved from the inbox to the scheduler's queue
                self.state = self._engine_state()
        if not engine.has_unfinished_requests():
            return not self._stopping
        outputs = engine.step()
        self._dispatch(outputs)
        return True

    def _apply(self, commands: list, add) -> None:
        """Apply inbox commands to the engine; `add(prompt, params, request_id=...)` queues a request."""
        for command in commands:
            if isinstance(command, AddCommand):
                try:
                    add(command.prompt, command.params, request_id=command.request_id)
                except TinyVLLMError as e:  # the engine refused it outright: it never ran
                    with self._cond:
                        self._live.discard(command.request_id)
                    self._record("refused", command.request_id, str(e))
                    self._call(command.sink, [Update(command.request_id, [], finished=True, finish_reason="error",
                                                     error=str(e), token_ids=[], text="")])
                    continue
                self._sinks[command.request_id] = command.sink
                self._record("request", command.request_id)
            else:
                if command.request_id in self._sinks:  # still in the engine: not finished, not refused
                    self._record("abort", command.request_id)
                self.engine.abort_request(command.request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        by_sink: dict[int, tuple[Sink, list[Update]]] = {}
        updates, finished = [], []
        for out in outputs:
            update = self._update(out)
            updates.append(update)
            sink = self._sinks.get(out.request_id)
            if sink is not None:
                by_sink.setdefault(id(sink), (sink, []))[1].append(update)
            if out.finished:
                self._record("finished", update)
                finished.append(out.request_id)
                self._sinks.pop(out.request_id, None)
                if self.release_finished:
                    self.engine.release_request(out.request_id)
        schedule = self.engine.last_schedule
        with self._cond:
            self._live.difference_update(finished)
            self.state = self._engine_state()
            self._cond.notify_all()  # submitters blocked on max_waiting
        for sink, batch in by_sink.values():
            self._call(sink, batch)
        report = StepReport(time.perf_counter(), self.state, updates,
                            schedule.num_batched_tokens if schedule else 0,
                            len(schedule.preempted) if schedule else 0)
        for observer in self.observers:
            try:
                observer.on_step(report)
            except Exception as e:  # an observer's bug must not stop serving
                self.log(f"engine loop: observer {type(observer).__name__} failed: {type(e).__name__}: {e}")

    def _update(self, out: RequestOutput) -> Update:
        """A plain, thread-safe copy of what the engine reported (RequestOutput reads engine state lazily)."""
        n_new = len(out.new_token_ids)
        logprobs = getattr(out, "logprobs", None)
        common = dict(request_id=out.request_id, new_token_ids=list(out.new_token_ids), finished=out.finished,
                      finish_reason=out.finish_reason, error=out.error,
                      num_prompt_tokens=len(out.prompt_token_ids),
                      new_logprobs=list(logprobs[len(logprobs) - n_new:]) if logprobs is not None else None,
                      prompt_logprobs=getattr(out, "prompt_logprobs", None))
        if not out.finished:
            return Update(**common)
        return Update(**common, token_ids=list(out.token_ids), text=out.text, metrics=out.metrics)

    def _record(self, kind: str, *args) -> None:
        if self.recorder is None:
            return
        try:
            getattr(self.recorder, kind)(self.engine, *args)
        except Exception as e:  # a full disk must not stop serving; say so once per failure
            self.log(f"engine loop: recording failed: {type(e).__name__}: {e}")

    def _call(self, sink: Sink, updates: list[Update]) -> None:
        try:
            sink(updates)
        except Exception as e:  # a consumer that went away (closed event loop) must not stop serving
            self.log(f"engine loop: dropping updates of {updates[0].request_id}: {type(e).__name__}: {e}")

    def _fail_all(self, message: str) -> None:
        with self._cond:
            live, self._live = self._live, set()
            inbox, self._inbox = self._inbox, Inbox()
        sinks = dict(self._sinks)
        sinks.update({c.request_id: c.sink for c in inbox.commands if isinstance(c, AddCommand)})
        for request_id in live:
            if request_id in sinks:
                update = Update(request_id, [], finished=True, finish_reason="error", error=message, token_ids=[],
                                text="")
                if request_id in self._sinks:  # the engine had it: its arrival is recorded
                    self._record("finished", update)
                self._call(sinks[request_id], [update])
        self._sinks.clear()

    def _engine_state(self, alive: bool = True) -> EngineState:
        e, bm = self.engine, self.engine.block_manager
        return EngineState(e.scheduler.num_running, e.scheduler.num_waiting, bm.usage, bm.num_blocks, bm.block_size,
                           e.num_steps, bm.prefix_query_tokens, bm.prefix_hit_tokens, alive)
