"""The debugger's stepping logic, without any UI: one LLMEngine driven one forward-pass stage at a time.

    session.step_stage()                       -> StageRecord | StepRecord | None (nothing left to run)
    session.step_layer() / step_decode() / continue_to_end() / run_until(Breakpoint.parse("layer 1"))
                                               -> RunResult (why it stopped, the last event)

Everything goes through `engine.step_stages()`, the engine's own step as a generator: there is no second
forward pass here. A step's first `next()` runs the scheduler; each later `next()` runs one stage; the
generator's return is the step's outputs (tokens sampled, stop rules applied). Each stage's output is
compared with the golden file for every request whose prompt ids are a golden prompt's, over the prompt
positions this step computed (goldens hold prompt positions only, so decode steps have none: absent, not
a pass). `view()` gives the UI an immutable snapshot, built on the thread that drives the engine.
With SessionOptions.compare_precision a PrecisionShadow (precision_shadow.py) steps an engine of the other
precision in lockstep and each StageRecord carries its difference; the stepped engine never sees it.
With SessionOptions.record_rows (and with compare_precision) every stage's rows are kept by request and position
(`session.rows`) for the divergence view (divergence.py: where two runs of a request part).

`session.edit("row 0 = x * 0")` sets part of the current stage's output (value_edit.py) before the next stage
reads it: the stage's record shows the edited values, its step's StepRecord and the timeline list the edit, and a
recording (`record_to`, debug --record; or serve --debug's feed) keeps it, for debug --replay to apply it again
(ReplayFeed).

Latencies shown (TTFT, ITL) are in engine time: only the time spent inside the session's stepping counts,
not the time the debugger sat paused between commands (the engine's own metrics count wall time); with a
precision shadow, its stages' time too.
"""
from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tinyvllm.engine.engine import LLMEngine
from tinyvllm.golden_check import DEFAULT_RTOL, Goldens, StageResult, compare_scheduled_rows
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.runner.forward import stage_names

from debugger.divergence import StageRows
from debugger.precision_shadow import PrecisionDiff, PrecisionShadow
from debugger.rows import as_rows, row_labels
from debugger.value_edit import EditError, ValueEdit


# ---- tensors --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorStats:
    """min / max / mean / std over the finite values (None when there are none), and what is not finite."""
    shape: tuple[int, ...]
    dtype: str
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int

    @classmethod
    def of(cls, array: np.ndarray) -> TensorStats:
        values = np.asarray(array)
        finite = values[np.isfinite(values)].astype(np.float64)
        nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        if finite.size == 0:
            return cls(values.shape, str(values.dtype), None, None, None, None, nan, inf)
        return cls(values.shape, str(values.dtype), float(finite.min()), float(finite.max()),
                   float(finite.mean()), float(finite.std()), nan, inf)

    def describe(self, width: int | None = None) -> str:
        """One line; when it would be wider than `width`, a shorter one (4 significant digits)."""
        def number(x, digits=6):
            return "-" if x is None else f"{x:.{digits}g}"
        line = (f"shape {self.shape} {self.dtype}  min {number(self.min)}  max {number(self.max)}  "
                f"mean {number(self.mean)}  std {number(self.std)}  NaN {self.nan}  Inf {self.inf}")
        if width is None or len(line) <= width:
            return line
        return (f"{self.shape} {self.dtype} min {number(self.min, 4)} max {number(self.max, 4)} "
                f"mean {number(self.mean, 4)} std {number(self.std, 4)} NaN {self.nan} Inf {self.inf}")


# ---- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GoldenRow:
    """One golden prompt's rows of one stage: status "pass", "fail" or "absent" (nothing to compare)."""
    step: int
    stage: str
    prompt: int
    request_id: str
    max_abs: float
    max_rel: float
    status: str
    note: str = ""

    @classmethod
    def of(cls, step: int, request_id: str, r: StageResult) -> GoldenRow:
        status = "absent" if r.note == "no golden" else "pass" if r.passed else "fail"
        return cls(step, r.stage, r.prompt, request_id, r.max_abs, r.max_rel, status, r.note)


@dataclass(frozen=True)
class StageRecord:
    step: int                 # scheduler step (0 = the first)
    index: int                # position of the stage within its step
    name: str
    kernel: str
    layer: int | None
    seconds: float
    values: np.ndarray        # host copy of the output
    stats: TensorStats
    golden: tuple[GoldenRow, ...]
    row_labels: tuple[str, ...] = ()   # per row of as_rows(values): "0:26" (request 0, position 26)
    precision: PrecisionDiff | None = None   # against the other precision's engine (--compare-precision)
    edits: tuple[ValueEdit, ...] = ()        # value edits made to this output (values shows the result)


@dataclass(frozen=True)
class StepRecord:
    step: int
    seconds: float                     # engine time: inside the session's commands (pauses left out)
    num_batched_tokens: int
    new_tokens: dict[str, list[int]]   # request id -> tokens this step sampled
    finished: tuple[str, ...]          # request ids that finished in this step
    new_text: dict[str, str] = field(default_factory=dict)   # request id -> those tokens decoded
    edits: tuple[ValueEdit, ...] = ()  # value edits made in this step, in order

    def describe(self) -> str:
        """`req 0: 390 ' the', req 1: 17 'x'; finished 0` (what the step sampled, readable)."""
        sampled = ", ".join(f"req {r}: {' '.join(map(str, ids))} {self.new_text.get(r, '')!r}"
                            for r, ids in self.new_tokens.items()) or "nothing sampled"
        edited = f"; {len(self.edits)} value edit{'s' if len(self.edits) > 1 else ''}" if self.edits else ""
        return sampled + (f"; finished {', '.join(self.finished)}" if self.finished else "") + edited


@dataclass(frozen=True)
class ArrivalRecord:
    """Requests that entered the engine from a feed (HTTP clients, a replay) before step `step`."""
    step: int
    request_ids: tuple[str, ...]
    clients: tuple[str | None, ...]      # who sent each (None: not a client's)

    def describe(self) -> str:
        return ", ".join(r + (f" from {c}" if c else "") for r, c in zip(self.request_ids, self.clients))


@dataclass(frozen=True)
class ScheduleFacts:
    """What the scheduler did at the start of the current step, for the serving breakpoints."""
    kv_before: float = 0.0                    # KV usage before the step was scheduled
    kv_now: float = 0.0
    preempted: tuple[str, ...] = ()
    prefix_hits: tuple[tuple[str, int], ...] = ()   # (request id, tokens from the prefix cache) of new prefills


@dataclass(frozen=True)
class TimelineEntry:
    step: int
    name: str                 # a stage name, "schedule" or "step done"
    kernel: str               # the kernel, or what happened
    seconds: float | None = None


@dataclass(frozen=True)
class RunResult:
    reason: str               # "stopped" (reached what was asked), "breakpoint", "idle" (nothing to run), "cancelled"
    event: StageRecord | StepRecord | ArrivalRecord | None
    num_events: int
    detail: str = ""


# ---- breakpoints ----------------------------------------------------------------------------------
BREAKPOINT_HELP = ("layer N | stage NAME (globs ok) | finished [ID glob | from CLIENT] | golden [THRESHOLD] | "
                   "arrival [CLIENT] | kv FRACTION|PCT% | preemption | prefix-hit | slow MS")


@dataclass(frozen=True)
class Breakpoint:
    """`layer N` (entering layer N), `stage NAME` (a name or glob, e.g. layers.*.mlp; a bare name works
    too), `finished [ID]` (a request finished; ID may be a glob, e.g. cmpl-*), `finished from CLIENT` (a
    request of that client, host or host:port, finished), `golden [THRESHOLD]` (a golden error above the
    threshold, relative; default: the session's rtol); for serving: `arrival [CLIENT]` (a request entered
    the engine), `kv X` (KV usage rose above X: 0.8 or 80%), `preemption`, `prefix-hit` (a new prefill
    took blocks from the prefix cache), `slow MS` (a step took longer than MS milliseconds of engine time)."""
    kind: str
    value: object = None

    @classmethod
    def parse(cls, spec: str) -> Breakpoint:
        words = spec.split()
        if not words:
            raise ValueError(f"empty breakpoint: try {BREAKPOINT_HELP}")
        kind, args = words[0].lower(), words[1:]
        try:
            if kind == "layer" and len(args) == 1:
                return cls("layer", int(args[0]))
            if kind == "stage" and len(args) == 1:
                return cls("stage", args[0])
            if kind == "finished" and len(args) == 2 and args[0] == "from":
                return cls("finished_from", args[1])
            if kind == "finished" and len(args) <= 1 and args != ["from"]:
                return cls("finished", args[0] if args else None)
            if kind == "golden" and len(args) <= 1:
                return cls("golden", float(args[0]) if args else None)
            if kind in ("arrival", "arrive", "arrived") and len(args) <= 1:
                return cls("arrival", args[0] if args else None)
            if kind == "kv" and len(args) == 1:
                text = args[0]
                fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
                if 0 <= fraction < 1:
                    return cls("kv", fraction)
            if kind in ("preemption", "preempt", "preempted") and not args:
                return cls("preemption")
            if kind in ("prefix-hit", "prefix", "cache-hit") and not args:
                return cls("prefix_hit")
            if kind == "slow" and len(args) == 1:
                ms = float(args[0].removesuffix("ms"))
                if ms > 0:
                    return cls("slow", ms / 1000)
        except ValueError:
            pass
        if len(words) == 1 and (words[0] in ("embedding", "final_norm", "logits") or "." in words[0]):
            return cls("stage", words[0])
        raise ValueError(f"cannot read breakpoint {spec!r}: try {BREAKPOINT_HELP}")

    def describe(self) -> str:
        """The spec again, as a user would write it."""
        value = self.value
        if self.kind == "finished_from":
            return f"finished from {value}"
        if self.kind == "kv":
            return f"kv {value * 100:g}%"
        if self.kind == "slow":
            return f"slow {value * 1000:g}ms"
        if self.kind == "prefix_hit":
            return "prefix-hit"
        return self.kind + ("" if value is None else f" {value}")

    def hit(self, event, rtol: float, facts: ScheduleFacts | None = None,
            client_of: Callable[[str], str | None] | None = None) -> str | None:
        """What was hit, or None. `facts`: the current step's schedule (serving kinds, at its first stage);
        `client_of(request id)`: who sent a request (None: nobody, e.g. added by hand)."""
        client_of = client_of or (lambda request_id: None)
        if isinstance(event, StageRecord):
            if self.kind == "layer" and event.layer == self.value:
                return f"entered layer {self.value} ({event.name})"
            if self.kind == "stage" and fnmatch.fnmatchcase(event.name, str(self.value)):
                return f"stage {event.name}"
            if self.kind == "golden":
                threshold = rtol if self.value is None else self.value
                bad = [g for g in event.golden if g.status == "fail" or
                       (g.status == "pass" and g.max_rel > threshold)]
                if bad:
                    return f"golden error at {event.name}: prompt {bad[0].prompt} rel {bad[0].max_rel:.3e}"
            if event.index == 0 and facts is not None:
                return self._schedule_hit(facts)
        if isinstance(event, StepRecord):
            if self.kind == "finished":
                ids = [r for r in event.finished if self.value is None or fnmatch.fnmatchcase(r, str(self.value))]
                if ids:
                    return f"request {ids[0]} finished"
            if self.kind == "finished_from":
                ids = [r for r in event.finished if _same_client(client_of(r), str(self.value))]
                if ids:
                    return f"request {ids[0]} from {client_of(ids[0])} finished"
            if self.kind == "slow" and event.seconds > self.value:
                return f"step {event.step} took {event.seconds * 1000:.1f} ms (> {self.value * 1000:g} ms)"
        if isinstance(event, ArrivalRecord) and self.kind == "arrival":
            arrived = [(r, c) for r, c in zip(event.request_ids, event.clients)
                       if self.value is None or _same_client(c, str(self.value))]
            if arrived:
                return "arrival: " + ", ".join(r + (f" from {c}" if c else "") for r, c in arrived)
        return None

    def _schedule_hit(self, facts: ScheduleFacts) -> str | None:
        if self.kind == "kv" and facts.kv_before <= self.value < facts.kv_now:
            return f"KV usage rose above {self.value * 100:g}%: {facts.kv_before * 100:.1f}% -> {facts.kv_now * 100:.1f}%"
        if self.kind == "preemption" and facts.preempted:
            return f"preempted {', '.join(facts.preempted)}"
        if self.kind == "prefix_hit" and facts.prefix_hits:
            return "prefix-cache hit: " + ", ".join(f"{r} reuses {n} tokens" for r, n in facts.prefix_hits)
        return None


def _same_client(client: str | None, wanted: str) -> bool:
    """`wanted` is a host (any port) or host:port."""
    return client is not None and (client == wanted or client.rsplit(":", 1)[0] == wanted)


def describe_params(p: SamplingParams) -> str:
    """Sampling parameters in a few characters: `greedy max 8`, `T0.8 p0.9 k20 seed 3 max 16`."""
    parts = ["greedy"] if p.temperature == 0 else [f"T{p.temperature:g}"]
    if p.temperature != 0 and p.top_p < 1:
        parts.append(f"p{p.top_p:g}")
    if p.temperature != 0 and p.top_k > 0:
        parts.append(f"k{p.top_k}")
    if p.seed is not None:
        parts.append(f"seed {p.seed}")
    if p.max_tokens is not None:
        parts.append(f"max {p.max_tokens}")
    return " ".join(parts)


# ---- views for the UI -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestView:
    request_id: str
    prompt: str
    state: str                    # waiting | preempted | prefill | chunked | decode | finished | error
    num_prompt_tokens: int
    num_computed_tokens: int
    output_token_ids: tuple[int, ...]
    output_text: str
    finish_reason: str | None
    error: str | None
    ttft: float | None            # engine time (module docstring): pauses in the debugger left out
    itl_mean: float | None
    golden_prompt: int | None
    greedy_agree: tuple[int, int] | None   # (tokens agreeing with the golden greedy ids, tokens compared)
    client: str | None = None     # who sent it (serving: host:port), None when added in the debugger
    params: str = ""              # its sampling parameters, short (describe_params)
    stream: str = ""              # what its client has received (serving: queued, streaming 3 sent, gone, ...)


@dataclass(frozen=True)
class BlockView:
    num_blocks: int
    block_size: int
    states: tuple[str, ...]        # per block: free | used | shared (ref count > 1) | cached (free, reusable)
    ref_counts: tuple[int, ...]
    just_allocated: frozenset[int]  # newly referenced since the current (or last) step began
    just_freed: frozenset[int]
    tables: tuple[tuple[str, tuple[int, ...]], ...]   # (request id, logical -> physical block ids)
    usage: float
    prefix_hit_rate: float


@dataclass(frozen=True)
class GoldenView:
    source: str | None            # the golden file, None without one
    rtol: float
    rows: tuple[GoldenRow, ...]   # the current (or last) step's comparisons
    first_failure: GoldenRow | None
    absent_reason: str            # why this step has nothing to compare ("" when it has)
    precision: PrecisionDiff | None = None   # the current stage against the other precision (--compare-precision)
    precision_note: str = ""      # with --compare-precision: why there is no comparison (e.g. they diverged)


@dataclass(frozen=True)
class SessionView:
    step: int                     # the step in progress, or the next one
    in_step: bool
    stage: StageRecord | None     # the latest stage
    stages_done: int              # in the current step
    stages_per_step: int
    requests: tuple[RequestView, ...]
    blocks: BlockView
    golden: GoldenView
    timeline: tuple[TimelineEntry, ...]
    idle: bool                    # no request left to run
    breakpoints: tuple[str, ...] = ()   # the standing breakpoints `continue` stops at
    serving: str = ""             # the feed's one-line status (server address, recording), "" without one
    edits: tuple[ValueEdit, ...] = ()   # every value edit made since the session (re)started


@dataclass
class SessionOptions:
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=8,
                                                                          ignore_eos=True))
    rtol: float = DEFAULT_RTOL
    compare_precision: bool = False   # step a shadow engine of the other precision in lockstep (PrecisionShadow)
    record_rows: bool = False         # keep every stage's rows by request and position (divergence.StageRows)


class Session:
    def __init__(self, engine: LLMEngine, goldens: Goldens | None = None, initial_prompts: list | None = None,
                 options: SessionOptions | None = None):
        """`initial_prompts` (text or token ids) are queued now and after every reset; default: the first
        golden prompt, or nothing without goldens."""
        self.goldens = goldens
        self.options = options or SessionOptions()
        if initial_prompts is None:
            initial_prompts = [goldens.prompts[0]["input_ids"].tolist()] if goldens else []
        self.initial_prompts = list(initial_prompts)
        self._model, self._engine_config = engine.model, engine.config
        self._lock = threading.RLock()
        self.breakpoints: list[Breakpoint] = []   # standing ones: continue_to_end and serve stop at any of them
        self.feed = None    # a source of requests stepped in by the session (serving: serve_debug.SteppedEngineLoop)
        self.recorder = None   # a serving.recording.Recorder of this session's own requests (record_to)
        self.divergence = None   # what the D view compares a request with (a divergence.py Comparison), if anything
        self._closed = False
        self._start(engine)

    # ---- requests and reset ----------------------------------------------------------------------
    def reset(self) -> None:
        """A fresh engine (empty KV pool, no requests) on the same weights, with the initial prompts queued."""
        with self._lock:
            if self.feed is not None:
                raise ValueError("reset is off while the engine serves requests (it would drop its clients)")
            if self.recorder is not None:
                raise ValueError("reset is off while recording (a recording follows one engine from its start)")
            self._start(LLMEngine(self._model, self._engine_config, log=lambda message: None))

    def _start(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.shadow = PrecisionShadow(engine) if self.options.compare_precision else None
        self.rows = StageRows() if self.options.record_rows or self.options.compare_precision else None
        self.num_layers = engine.model.config.num_hidden_layers
        self.step_index = 0
        self.stage_index = 0
        self.current: StageRecord | None = None
        self.timeline: list[TimelineEntry] = []
        self.golden_rows: list[GoldenRow] = []
        self.first_failure: GoldenRow | None = None
        self.request_ids: list[str] = []
        self.golden_prompt_of: dict[str, int] = {}
        self._stages = None
        self._stage = None                            # the current Stage (its device output: value edits)
        self.edits: list[ValueEdit] = []
        self._step_edits: list[ValueEdit] = []
        self._all_logits = False
        self._step_busy = 0.0                         # seconds inside step_stage calls in the current step
        self._kv_before, self.facts = 0.0, None       # the current step's ScheduleFacts (after its first stage)
        self._spans: list[tuple[float, float]] = []   # wall (start, end) of every step_stage call
        self._span_starts: list[float] = []
        self._active_before: list[float] = []         # engine seconds before each span
        self._refs_before = tuple(engine.block_manager.ref_counts())
        for prompt in self.initial_prompts:
            self.add_request(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a prompt; it joins at the next scheduler step. Returns its request id."""
        with self._lock:
            request_id = self.engine.add_request(prompt, params or self.options.params, request_id=request_id)
            if self.shadow is not None:
                self.shadow.add_request(prompt, params or self.options.params, request_id)
            self.request_ids.append(request_id)
            if self.recorder is not None:
                self._record_request(request_id)
            ids = self.engine.request(request_id).prompt_token_ids
            for p, golden in enumerate(self.goldens.prompts if self.goldens else []):
                if golden["input_ids"].tolist() == ids:
                    self.golden_prompt_of[request_id] = p
                    break
            return request_id

    def mirror_abort(self, request_id: str) -> None:
        """The feed aborted `request_id` in the engine between steps: the precision shadow aborts it too."""
        with self._lock:
            if self.shadow is not None:
                self.shadow.abort_request(request_id)

    def record_to(self, path, model: str | None = None) -> None:
        """Record this session as a serving recording (debug --record FILE): its requests, their answers and its
        value edits, for debug --replay FILE to step again. From the start: the initial prompts are its first
        requests."""
        from tinyvllm.serving.recording import Recorder
        with self._lock:
            assert self.step_index == 0 and not self.in_step and self.feed is None, "record from the start"
            self.recorder = Recorder.open(path, self.engine, model=model)
            for request_id in self.request_ids:
                self._record_request(request_id)

    def _record_request(self, request_id: str) -> None:
        """As the serving loop records: a request the engine queued, or one it refused as it was added."""
        error = self.engine.request(request_id).error
        if error:
            self.recorder.refused(self.engine, request_id, error)
        else:
            self.recorder.request(self.engine, request_id)

    def rejection(self, request_id: str) -> str | None:
        """Why the engine refused a request as it was added (unknown token ids, too long, ...), else None:
        a refused request never runs; it only finishes with its error at the next step."""
        with self._lock:
            return self.engine.request(request_id).error

    def close(self) -> None:
        """No more steps (a worker thread still running stops at its next stage); the feed, if any, ends its
        requests (serve --debug: each client gets finish_reason "abort")."""
        with self._lock:
            self._closed = True
            self._stages = None
            if self.recorder is not None:
                self.recorder.close()
            if self.feed is not None and hasattr(self.feed, "close"):
                self.feed.close()

    def apply_feed_aborts(self) -> None:
        """Abort now the requests whose clients went away (between steps only: a half-done step keeps its
        batch until it ends)."""
        with self._lock:
            if self.feed is not None and not self.in_step:
                self.feed.admit(self, adds=False)

    def prompt_from_text(self, text: str) -> str | list[int]:
        """What the add-request box accepts: text, token ids as [1, 2, 3], or `golden N`."""
        text = text.strip()
        if re.fullmatch(r"\[[\d,\s]*\]", text):
            return [int(t) for t in re.findall(r"\d+", text)]
        golden = re.fullmatch(r"golden\s+(\d+)", text)
        if golden and self.goldens:
            p = int(golden.group(1))
            if p >= len(self.goldens.prompts):
                raise ValueError(f"the golden file has prompts 0..{len(self.goldens.prompts) - 1}")
            return self.goldens.prompts[p]["input_ids"].tolist()
        return text

    # ---- stepping ----------------------------------------------------------------------------------
    @property
    def in_step(self) -> bool:
        return self._stages is not None

    @property
    def idle(self) -> bool:
        return not self.in_step and not self.engine.has_unfinished_requests()

    def step_stage(self) -> StageRecord | StepRecord | None:
        """Run one stage (the first of a new step if none is in progress), or finish the step once its
        stages are done (sampling, stop rules). None when no request is left."""
        with self._lock:
            start = time.perf_counter()
            try:
                if self._closed:
                    return None
                if self._stages is None:
                    if self.feed is not None:
                        self._admit()
                    if not self.engine.has_unfinished_requests():
                        return None
                    self._begin_step()
                try:
                    stage = next(self._stages)
                except StopIteration as done:
                    return self._end_step(done.value or [], start)
                return self._record_stage(stage)
            finally:
                end = time.perf_counter()
                self._add_span(start, end)
                self._step_busy += end - start

    # ---- engine time ---------------------------------------------------------------------------------
    def _add_span(self, start: float, end: float) -> None:
        before = self._active_before[-1] + self._spans[-1][1] - self._spans[-1][0] if self._spans else 0.0
        self._spans.append((start, end))
        self._span_starts.append(start)
        self._active_before.append(before)

    def engine_clock(self, t: float) -> float:
        """Engine seconds up to wall time t (perf_counter): the time inside step_stage calls before t."""
        i = bisect.bisect_right(self._span_starts, t) - 1
        if i < 0:
            return 0.0
        start, end = self._spans[i]
        return self._active_before[i] + min(t, end) - start

    def step_layer(self, cancelled=None, progress=None) -> RunResult:
        """Up to the end of the current layer (its `output` stage); outside layers, up to the logits."""
        return self._run(lambda e: isinstance(e, StepRecord) or e.name.endswith(".output") or e.name == "logits",
                         cancelled, progress)

    def step_decode(self, cancelled=None, progress=None) -> RunResult:
        """To the end of the current scheduler step (a whole step when none is in progress)."""
        return self._run(lambda e: isinstance(e, StepRecord), cancelled, progress)

    def continue_to_end(self, cancelled=None, progress=None) -> RunResult:
        """Until every request has finished, or a standing breakpoint (self.breakpoints) is hit."""
        return self._run(self._standing_hit, cancelled, progress, "breakpoint")

    def serve(self, cancelled=None, progress=None) -> RunResult:
        """Like continue_to_end, but with a feed it never runs out of work: idle, it waits for the next
        request (checking `cancelled` every 0.1 s). Stops at a standing breakpoint, or when cancelled."""
        return self._run(self._standing_hit, cancelled, progress, "breakpoint", serve=self.feed is not None)

    def run_until(self, breakpoint: Breakpoint, cancelled=None, progress=None) -> RunResult:
        return self._run(lambda e: self.check(breakpoint, e) or self._standing_hit(e), cancelled, progress,
                         "breakpoint")

    def check(self, breakpoint: Breakpoint, event) -> str | None:
        """What `breakpoint` hits at `event`, with this session's context (schedule facts, clients)."""
        return breakpoint.hit(event, self.options.rtol, self.facts, self.client_of)

    def _standing_hit(self, event) -> str | None:
        return next((hit for b in list(self.breakpoints) if (hit := self.check(b, event))), None)

    def client_of(self, request_id: str) -> str | None:
        return self.feed.client_of(request_id) if self.feed is not None else None

    def _run(self, stop: Callable, cancelled: Callable[[], bool] | None, progress: Callable | None,
             reason: str = "stopped", serve: bool = False) -> RunResult:
        """Step stages until `stop(event)`; between stages check `cancelled()` and report to `progress`.
        Between steps, requests from the feed enter the engine first (an ArrivalRecord event)."""
        last, count = None, 0
        while True:
            if cancelled is not None and cancelled():
                return RunResult("cancelled", last, count)
            event = self._admit() if not self.in_step and self.feed is not None else None
            if event is None:
                event = self.step_stage()
            if event is None:
                if not serve:
                    return RunResult("idle", last, count)
                self.feed.wait(0.1)
                continue
            last, count = event, count + 1
            if progress is not None:
                progress(event)
            hit = stop(event)
            if hit:
                return RunResult(reason, event, count, hit if isinstance(hit, str) else "")

    def _admit(self) -> ArrivalRecord | None:
        """Let the feed's waiting requests into the engine; an ArrivalRecord when any came."""
        with self._lock:
            arrived = self.feed.admit(self)
            if not arrived:
                return None
            record = ArrivalRecord(self.step_index, tuple(arrived), tuple(self.client_of(r) for r in arrived))
            self.timeline.append(TimelineEntry(self.step_index, "arrival", record.describe()))
            return record

    def _begin_step(self) -> None:
        # Golden rows need logits for every prompt position, so any golden request still short of the
        # end of its prompt asks for all of them this step.
        self._all_logits = any(
            (seq := self.engine.request(r).seq) is not None and not seq.is_finished
            and seq.num_computed_tokens < seq.num_prompt_tokens for r in self.golden_prompt_of)
        self._refs_before = tuple(self.engine.block_manager.ref_counts())
        self._kv_before, self.facts = self.engine.block_manager.usage, None
        self._stages = self.engine.step_stages(all_logits=self._all_logits)
        if self.shadow is not None:
            self.shadow.begin_step(self._all_logits)
        self._step_busy = 0.0
        self.stage_index = 0
        self.golden_rows = []
        self._step_edits = []

    def _record_stage(self, stage) -> StageRecord:
        if self.stage_index == 0:
            self.timeline.append(TimelineEntry(self.step_index, "schedule", self._describe_schedule()))
            self.facts = self._schedule_facts()
        values = stage.to_host()
        golden = tuple(self._compare(stage))
        self.golden_rows += golden
        precision = (self.shadow.compare(self.engine, self.step_index, stage.name, values)
                     if self.shadow is not None else None)
        if self.first_failure is None:
            self.first_failure = next((g for g in golden if g.status == "fail"), None)
        self.current = StageRecord(self.step_index, self.stage_index, stage.name, stage.kernel, stage.layer,
                                   stage.seconds, values, TensorStats.of(values), golden,
                                   self._row_labels(as_rows(values).shape[0]), precision)
        if self.rows is not None:
            self.rows.observe(stage.name, stage.kernel, values, self.current.row_labels)
        self.timeline.append(TimelineEntry(self.step_index, stage.name, stage.kernel, stage.seconds))
        self.stage_index += 1
        self._stage = stage
        for edit in self.feed.edits_due(self, stage.name) if self.feed is not None else ():
            try:
                self._apply_edit(edit)
            except EditError as e:
                raise EditError(f"the recorded edit {edit.describe()} cannot be applied: {e}") from None
        return self.current

    # ---- value edits (value_edit.py) -----------------------------------------------------------------
    def edit(self, text: str) -> ValueEdit:
        """Apply `SELECTION = EXPRESSION` to the current stage's output, before the next stage reads it; the edit
        (EditError says why it cannot be made)."""
        with self._lock:
            if not self.in_step or self._stage is None or self.stage_index == 0:
                raise EditError("no stage to edit: step to one first (s, l, or a breakpoint), then edit its output")
            edit = ValueEdit.parse(self.engine.num_steps, self._stage.name, text)
            self._apply_edit(edit)
            if self.feed is not None:
                self.feed.record_edit(self, edit)
            if self.recorder is not None:
                self.recorder.edit(self.engine, edit.stage, edit.select, edit.expr)
            return edit

    def _apply_edit(self, edit: ValueEdit) -> None:
        stage = self._stage
        why = self.engine.runner.forward_pass.edit_blocker(stage.name, self.engine.last_batch.num_tokens)
        if why is not None:
            raise EditError(f"{stage.name} cannot be edited here: {why}")
        values = edit.apply(self.current.values, self.engine.model.config.head_dim)
        assert stage.output.is_c_contiguous() and stage.output.shape == values.shape, stage.name
        stage.output.copy_to_device(values)
        golden = tuple(self._compare(stage))   # the golden panel describes the values as they now are
        self.golden_rows = [g for g in self.golden_rows if g.stage != stage.name] + list(golden)
        if self.first_failure is None:
            self.first_failure = next((g for g in golden if g.status == "fail"), None)
        self.current = dataclasses.replace(self.current, values=values, stats=TensorStats.of(values), golden=golden,
                                           edits=self.current.edits + (edit,))
        self.edits.append(edit)
        self._step_edits.append(edit)
        self.timeline.append(TimelineEntry(self.step_index, "value edit", f"{edit.stage} {edit.select} = {edit.expr}"))

    def _row_labels(self, rows: int) -> tuple[str, ...]:
        return row_labels(self.engine.last_schedule, rows)

    def _compare(self, stage):
        if not self.goldens or (stage.name == "logits" and not self._all_logits):
            return []
        # Only prefill rows inside the golden prompt have goldens.
        in_prompt = {s.seq.data.request_id for s in self.engine.last_schedule.scheduled
                     if s.end <= s.seq.num_prompt_tokens}
        request_ids = {r: p for r, p in self.golden_prompt_of.items() if r in in_prompt}
        prompt_to_request = {p: r for r, p in request_ids.items()}
        return [GoldenRow.of(self.step_index, prompt_to_request[r.prompt], r) for r in
                compare_scheduled_rows(self.engine, stage, self.goldens, request_ids, self.options.rtol)]

    def _schedule_facts(self) -> ScheduleFacts:
        schedule = self.engine.last_schedule
        hits = tuple((s.seq.data.request_id, s.seq.num_cached_tokens) for s in schedule.scheduled
                     if s.seq.num_cached_tokens > 0 and s.start == s.seq.num_cached_tokens)
        return ScheduleFacts(self._kv_before, self.engine.block_manager.usage,
                             tuple(seq.data.request_id for seq in schedule.preempted), hits)

    def _describe_schedule(self) -> str:
        parts = []
        for s in self.engine.last_schedule.scheduled:
            kind = "decode" if s.seq.num_output_tokens > 0 and s.num_new_tokens == 1 else "prefill"
            parts.append(f"req {s.seq.data.request_id} {kind} {s.start}..{s.end - 1}")
        preempted = [seq.data.request_id for seq in self.engine.last_schedule.preempted]
        return ", ".join(parts) + (f"; preempted {preempted}" if preempted else "")

    def _end_step(self, outputs, call_start: float) -> StepRecord:
        self._stages = self._stage = None
        if self.shadow is not None:
            self.shadow.end_step(self.step_index, outputs)
        schedule = self.engine.last_schedule
        decode = self.engine.tokenizer.decode
        record = StepRecord(self.step_index, self._step_busy + time.perf_counter() - call_start,
                            schedule.num_batched_tokens if schedule else 0,
                            {o.request_id: list(o.new_token_ids) for o in outputs},
                            tuple(o.request_id for o in outputs if o.finished),
                            {o.request_id: decode(list(o.new_token_ids)) for o in outputs},
                            tuple(self._step_edits))
        self.timeline.append(TimelineEntry(self.step_index, "step done", record.describe(), record.seconds))
        for out in outputs if self.recorder is not None else ():
            if out.finished:
                self.recorder.finished(self.engine, out)
        self.step_index += 1
        if self.feed is not None:
            self.feed.after_step(self, outputs)
        return record

    # ---- views -------------------------------------------------------------------------------------
    def view(self) -> SessionView:
        with self._lock:
            return SessionView(self.step_index, self.in_step, self.current,
                               self.stage_index if self.in_step else 0, len(stage_names(self.num_layers)),
                               tuple(self._request_view(r) for r in self.request_ids)
                               + (self.feed.pending_views() if self.feed is not None else ()),
                               self._block_view(), self._golden_view(), tuple(self.timeline), self.idle,
                               tuple(b.describe() for b in self.breakpoints),
                               self.feed.status() if self.feed is not None else "", tuple(self.edits))

    def _request_view(self, request_id: str) -> RequestView:
        request = self.engine.request(request_id)
        seq = request.seq
        output = tuple(seq.output_token_ids) if seq else ()
        m = self.engine.metrics.request_metrics(request_id)
        ttft, itls = self._engine_latencies(m)
        p = self.golden_prompt_of.get(request_id)
        greedy = None
        if p is not None and "greedy_ids" in self.goldens.prompts[p] and output:
            golden = self.goldens.prompts[p]["greedy_ids"].tolist()[:len(output)]
            agree = next((i for i, (a, b) in enumerate(zip(golden, output)) if a != b), len(golden))
            greedy = (agree, len(golden))
        prompt = request.prompt
        if prompt is None:  # given as token ids
            prompt = self.engine.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        return RequestView(
            request_id, prompt, "error" if request.error else seq.state, len(request.prompt_token_ids),
            seq.num_computed_tokens if seq else 0, output,
            request.text if request.text is not None else self.engine.tokenizer.decode(list(output)),
            request.finish_reason, request.error,
            ttft, float(np.mean(itls)) if itls else None, p, greedy, self.client_of(request_id),
            describe_params(request.params), self.feed.stream_state(request_id) if self.feed is not None else "")

    def _engine_latencies(self, m) -> tuple[float | None, list[float]]:
        """TTFT and ITLs in engine time (the debugger's pauses left out), from the engine's wall timestamps."""
        if m.ttft is None:
            return None, []
        times = [m.arrival_time + m.ttft]
        for gap in m.itls:
            times.append(times[-1] + gap)
        clock = [self.engine_clock(t) for t in [m.arrival_time] + times]
        return clock[1] - clock[0], [b - a for a, b in zip(clock[1:], clock[2:])]

    def _block_view(self) -> BlockView:
        bm = self.engine.block_manager
        refs = tuple(bm.ref_counts())
        states = tuple("shared" if r > 1 else s for r, s in zip(refs, bm.block_states()))
        allocated = frozenset(i for i, (a, b) in enumerate(zip(self._refs_before, refs)) if a == 0 and b > 0)
        freed = frozenset(i for i, (a, b) in enumerate(zip(self._refs_before, refs)) if a > 0 and b == 0)
        tables = tuple((r, tuple(seq.block_table)) for r in self.request_ids
                       if (seq := self.engine.request(r).seq) is not None and seq.block_table)
        return BlockView(bm.num_blocks, bm.block_size, states, refs, allocated, freed, tables, bm.usage,
                         bm.prefix_hit_rate)

    def _golden_view(self) -> GoldenView:
        if not self.goldens:
            reason = "no golden file"
        elif not self.golden_prompt_of:
            reason = "no request's prompt is a golden prompt"
        elif not self.golden_rows:
            reason = ("golden prompts are past prefill (goldens hold prompt positions only)"
                      if self.step_index or self.in_step else "no stage has run yet")
        else:
            reason = ""
        precision, note = None, ""
        if self.shadow is not None:
            precision = self.current.precision if self.current is not None and not self.shadow.stopped else None
            note = self.shadow.stopped or ("" if precision else f"{self.shadow.label}: no stage has run yet")
        return GoldenView(self.goldens.path.name if self.goldens else None, self.options.rtol,
                          tuple(self.golden_rows), self.first_failure, reason, precision, note)
