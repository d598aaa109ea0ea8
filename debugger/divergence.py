"""Where two runs of one request part (the debugger's `D` view; no UI here).

    rows = StageRows()                                  # fed every stage a stepped engine runs
    a, b = Run.of("batched", engine, rows, "0"), Run.of("alone", other_engine, other_rows, "0")
    report = compare("0", a, b, stage_names(num_layers))
    report.lines()                                      # what the view says; report.table: its stage table

Two runs are compared per token position, not per step (their steps need not match: a request alone gets other
chunks than among others): at every position both computed, each stage's row of that request, in forward-pass
order, bit for bit (np.array_equal on float32). The first (position, stage) that differs is where they part; at that
position `table` gives every stage's max |a - b| and max rel, and each run's kernel. The output tokens and the
logits behind each are compared too, and at the first token that differs (or, while the tokens agree, the first
whose logits differ) each run's top-1 / top-2 logit margin says whether a near tie flipped or the change is a
confident one.

What is compared (Comparison.report(session, request id)):
  AloneComparison      the request against itself run alone: a fresh engine with the session engine's EngineConfig
                       (batch_invariant included), given only that request (its prompt ids, its sampling
                       parameters and seed), stepped until it has what the session's run has (--compare-alone)
  PrecisionComparison  the other precision: the lockstep shadow of precision_shadow.py (--compare-precision)
  RecordingComparison  two recordings' answers (debug --replay FILE --against FILE2): recordings hold no stage
                       tensors and no logprobs, so tokens only; the margins are FILE's as this replay computes them
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tinyvllm.engine.engine import LLMEngine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.forward import stage_names

from debugger.rows import as_rows, label_parts, row_labels

NEAR_TIE = 0.1   # nats of top-1 over top-2: the runner-up's probability is above exp(-0.1), 90 % of the top token's


# ---- what a run computed -----------------------------------------------------------------------------------
class StageRows:
    """Every row a stepped engine computed, by request and position: rows[request id][position][stage] =
    (row, kernel). A position computed again (a preempted request's recompute) keeps its latest rows."""

    def __init__(self):
        self.rows: dict[str, dict[int, dict[str, tuple[np.ndarray, str]]]] = {}

    def observe(self, stage: str, kernel: str, values: np.ndarray, labels: tuple[str, ...]) -> None:
        """One stage's output; `labels`: rows.row_labels of its step (() when its rows are not per token)."""
        table = as_rows(values)
        if len(labels) != table.shape[0]:
            return
        for label, row in zip(labels, table):
            request_id, position = label_parts(label)
            self.rows.setdefault(request_id, {}).setdefault(position, {})[stage] = (np.array(row), kernel)


@dataclass(frozen=True)
class Margin:
    """A logits row's top-1 and top-2 tokens (ties to the lower id, as the engine's argmax) and logit[top1] -
    logit[top2], which is also their logprobs' difference (the same log-sum-exp is subtracted from both)."""
    top1: int
    top2: int
    margin: float

    @classmethod
    def of(cls, logits: np.ndarray) -> Margin:
        row = np.asarray(logits, np.float64).ravel()
        assert row.size >= 2, "a margin needs two tokens"
        top1 = int(np.argmax(row))
        rest = row.copy()
        rest[top1] = -np.inf
        top2 = int(np.argmax(rest))
        return cls(top1, top2, float(row[top1] - row[top2]))

    @property
    def near_tie(self) -> bool:
        return self.margin < NEAR_TIE

    def describe(self) -> str:
        return f"top-1 {self.top1} over {self.top2} by {self.margin:.3e}"


@dataclass
class Run:
    """One run of one request: its prompt length, its output tokens so far, and its rows by position (empty when
    none were recorded: then only tokens compare)."""
    label: str
    prompt_len: int
    tokens: list[int]
    rows: dict[int, dict[str, tuple[np.ndarray, str]]] = field(default_factory=dict)

    @classmethod
    def of(cls, label: str, engine: LLMEngine, rows: StageRows | None, request_id: str) -> Run:
        request = engine.request(request_id)
        tokens = list(request.seq.output_token_ids) if request.seq is not None else []
        return cls(label, len(request.prompt_token_ids), tokens,
                   rows.rows.get(request_id, {}) if rows is not None else {})

    def logits(self, token: int) -> np.ndarray | None:
        """The logits that output token `token` was sampled from (at the position before it), if recorded."""
        entry = self.rows.get(self.prompt_len - 1 + token, {}).get("logits")
        return None if entry is None else entry[0]

    @property
    def last_position(self) -> int:
        return max(self.rows, default=-1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@dataclass(frozen=True)
class StageDiff:
    """One stage's row at one position in both runs: max |a - b|, that over max |a|, and each run's kernel."""
    stage: str
    max_abs: float
    max_rel: float
    identical: bool
    kernels: tuple[str, str]

    @classmethod
    def of(cls, stage: str, a: tuple[np.ndarray, str], b: tuple[np.ndarray, str]) -> StageDiff:
        a64, b64 = np.asarray(a[0], np.float64), np.asarray(b[0], np.float64)
        max_abs = float(np.abs(a64 - b64).max(initial=0.0))
        scale = float(np.abs(a64).max(initial=0.0))
        max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
        return cls(stage, max_abs, max_rel, same_bits(a[0], b[0]), (a[1], b[1]))


# ---- the comparison ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DivergenceReport:
    request_id: str
    labels: tuple[str, str]
    prompt_len: int
    positions: int                       # positions both runs computed
    rows_compared: int                   # (position, stage) rows compared bit for bit
    first: tuple[int, str] | None        # the first (position, stage) whose rows differ
    table: tuple[StageDiff, ...]         # at that position: every stage both computed, in order
    tokens_compared: int
    first_token: int | None              # the first output token that differs
    tokens_there: tuple[int | None, int | None]   # each run's token there
    logits_token: int | None             # the first output token whose logits differ (up to first_token)
    margin_token: int | None             # where the margins are taken: first_token, else logits_token
    margins: tuple[Margin | None, Margin | None]
    note: str = ""                       # what could not be compared, and why

    @property
    def identical(self) -> bool:
        """Every row and token compared is the same bits (and something was compared)."""
        return (self.first is None and self.first_token is None and self.logits_token is None
                and self.rows_compared + self.tokens_compared > 0)

    def where(self, position: int) -> str:
        if position < self.prompt_len:
            return f"position {position} (prompt)"
        return f"position {position} (output token {position - self.prompt_len} fed back)"

    def headline(self) -> str:
        a, b = self.labels
        if self.identical:
            what = f"{self.rows_compared} rows at {self.positions} positions and " if self.rows_compared else ""
            return f"request {self.request_id}: {a} vs {b}: identical ({what}{self.tokens_compared} tokens)"
        if self.first is not None:
            position, stage = self.first
            diff = next(d for d in self.table if d.stage == stage)
            return (f"request {self.request_id}: {a} vs {b} first differ at {self.where(position)}, {stage}: "
                    f"max |diff| {diff.max_abs:.3e}")
        if self.first_token is not None:
            return f"request {self.request_id}: {a} vs {b} first differ at output token {self.first_token}"
        if self.logits_token is not None:
            return f"request {self.request_id}: {a} vs {b}: logits first differ at output token {self.logits_token}"
        return f"request {self.request_id}: {a} vs {b}: nothing to compare yet"

    def lines(self) -> list[str]:
        a, b = self.labels
        lines = [self.headline()]
        if self.rows_compared:
            lines.append(f"compared bit for bit: {self.rows_compared} stage rows at {self.positions} positions")
        if self.first is not None:
            diff = next(d for d in self.table if d.stage == self.first[1])
            if diff.kernels[0] != diff.kernels[1]:
                lines.append(f"kernels there: {a} {diff.kernels[0]}, {b} {diff.kernels[1]}")
        if self.first_token is not None:
            ta, tb = self.tokens_there
            lines.append(f"tokens: first differ at output token {self.first_token}: {a} {_token(ta)}, {b} {_token(tb)}")
        elif self.tokens_compared:
            lines.append(f"tokens: the same over {self.tokens_compared}")
        if self.logits_token is not None:
            lines.append(f"logits: first differ at output token {self.logits_token}")
        if self.margin_token is not None:
            lines.append(f"top-1 / top-2 margins at output token {self.margin_token}: " + "; ".join(
                f"{label} " + (m.describe() if m is not None else "not recorded")
                for label, m in zip(self.labels, self.margins)) + f" -> {self.verdict()}")
        if self.note:
            lines.append(self.note)
        return lines

    def verdict(self) -> str:
        """At margin_token: whether the top token changed, and whether that was a near tie."""
        ma, mb = self.margins
        if ma is None or mb is None:
            return "no logits to judge by"
        flipped = ma.top1 != mb.top1
        if not flipped:
            return "the same top token (the logits moved, the choice did not)"
        if ma.near_tie and mb.near_tie:
            return f"a near tie that flipped (both margins < {NEAR_TIE:g})"
        return "a confident change (a margin >= {:g})".format(NEAR_TIE)


def _token(token: int | None) -> str:
    return "none (ended)" if token is None else str(token)


def compare(request_id: str, a: Run, b: Run, order: list[str], note: str = "") -> DivergenceReport:
    positions = sorted(set(a.rows) & set(b.rows))
    first, compared = None, 0
    for position in positions:
        ra, rb = a.rows[position], b.rows[position]
        for stage in order:
            if stage in ra and stage in rb:
                compared += 1
                if first is None and not same_bits(ra[stage][0], rb[stage][0]):
                    first = (position, stage)
    table = ()
    if first is not None:
        ra, rb = a.rows[first[0]], b.rows[first[0]]
        table = tuple(StageDiff.of(s, ra[s], rb[s]) for s in order if s in ra and s in rb)
    n = min(len(a.tokens), len(b.tokens))
    first_token = next((k for k in range(n) if a.tokens[k] != b.tokens[k]), None)
    there = ((a.tokens[first_token], b.tokens[first_token]) if first_token is not None else (None, None))
    last = n if first_token is None else first_token + 1
    logits_token = next((k for k in range(last) if (la := a.logits(k)) is not None
                         and (lb := b.logits(k)) is not None and not same_bits(la, lb)), None)
    margin_token = first_token if first_token is not None else logits_token
    margins = (None, None)
    if margin_token is not None:
        margins = tuple(None if (logits := run.logits(margin_token)) is None else Margin.of(logits)
                        for run in (a, b))
    return DivergenceReport(request_id, (a.label, b.label), a.prompt_len, len(positions), compared, first, table,
                            n, first_token, there, logits_token, margin_token, margins, note)


# ---- what is compared --------------------------------------------------------------------------------------
Cancelled = Callable[[], bool]


class AloneRun:
    """One request of `main`, alone in a fresh engine of the same model and EngineConfig, stepped as an engine
    steps on its own (logits for the rows that sample only; the session may ask for every prompt row's, for
    goldens: those positions then have no logits to compare)."""

    def __init__(self, main: LLMEngine, request_id: str):
        request = main.request(request_id)
        params = dataclasses.replace(request.params, seed=request.seed)   # the seed the engine chose, if it chose
        self.engine = LLMEngine(main.model, main.config, log=lambda message: None)
        self.engine.add_request(list(request.prompt_token_ids), params, request_id=request_id)
        self.rows = StageRows()
        self.request_id = request_id

    def advance(self, target: Run, cancelled: Cancelled | None = None) -> None:
        """Step until this run has target's tokens and positions (or has finished)."""
        def behind() -> bool:
            run = Run.of("alone", self.engine, self.rows, self.request_id)
            return len(run.tokens) < len(target.tokens) or run.last_position < target.last_position
        while self.engine.has_unfinished_requests() and behind() and not (cancelled is not None and cancelled()):
            stages = self.engine.step_stages()
            try:
                while True:
                    stage = next(stages)
                    values = stage.to_host()
                    self.rows.observe(stage.name, stage.kernel, values,
                                      row_labels(self.engine.last_schedule, as_rows(values).shape[0]))
            except StopIteration:
                pass


def _engine_with(session, request_id: str) -> LLMEngine:
    if request_id not in session.request_ids:
        raise TinyVLLMError(f"request {request_id} has not entered the engine yet: step until it has")
    return session.engine


class AloneComparison:
    """The picked request against itself run alone (--compare-alone); each request's alone run is kept and stepped
    further as the session's run goes on (and dropped when the session resets its engine)."""
    kind = "alone"

    def __init__(self):
        self._engine = None
        self._runs: dict[str, AloneRun] = {}

    def report(self, session, request_id: str, cancelled: Cancelled | None = None) -> DivergenceReport:
        main = _engine_with(session, request_id)
        if main is not self._engine:
            self._engine, self._runs = main, {}
        ours = Run.of("batched", main, session.rows, request_id)
        if main.request(request_id).seq is None:
            return compare(request_id, ours, ours, [], f"request {request_id} never ran: "
                           f"{main.request(request_id).error}")
        alone = self._runs.get(request_id)
        if alone is None:
            alone = self._runs[request_id] = AloneRun(main, request_id)
        alone.advance(ours, cancelled)
        theirs = Run.of("alone", alone.engine, alone.rows, request_id)
        note = "" if session.rows is not None else "the session records no stage rows: tokens only"
        return compare(request_id, ours, theirs, stage_names(main.model.config.num_hidden_layers), note)


class PrecisionComparison:
    """The picked request in the session's precision against the lockstep shadow's (--compare-precision)."""
    kind = "precision"

    def report(self, session, request_id: str, cancelled: Cancelled | None = None) -> DivergenceReport:
        shadow, main = session.shadow, _engine_with(session, request_id)
        ours = Run.of(main.precision, main, session.rows, request_id)
        theirs = Run.of(shadow.engine.precision, shadow.engine, shadow.rows, request_id)
        note = f"the shadow stopped: {shadow.stopped}" if shadow.stopped else ""
        return compare(request_id, ours, theirs, stage_names(main.model.config.num_hidden_layers), note)


class RecordingComparison:
    """The replayed recording's answers against a second recording's (debug --replay FILE --against FILE2). A
    request of FILE is matched in FILE2 by its prompt token ids (the n-th request with that prompt in one, the
    n-th in the other): two recordings of the same workload give their requests other ids."""
    kind = "recordings"

    def __init__(self, first, second):
        self.first, self.second = first, second
        self.labels = (Path(first.path).name, Path(second.path).name)
        if self.labels[0] == self.labels[1]:
            self.labels = (first.path, second.path)

    def match(self, request_id: str):
        recorded = next((r for r in self.first.requests if r.request_id == request_id), None)
        if recorded is None:
            return None, None
        same_prompt = [r for r in self.first.requests if r.prompt_token_ids == recorded.prompt_token_ids]
        theirs = [r for r in self.second.requests if r.prompt_token_ids == recorded.prompt_token_ids]
        n = same_prompt.index(recorded)
        return recorded, theirs[n] if n < len(theirs) else None

    def report(self, session, request_id: str, cancelled: Cancelled | None = None) -> DivergenceReport:
        ours, theirs = self.match(request_id)
        if ours is None:
            raise TinyVLLMError(f"request {request_id} is not in {self.first.path}")
        if theirs is None:
            raise TinyVLLMError(f"{self.second.path} has no request with request {request_id}'s prompt")
        a = Run(self.labels[0], len(ours.prompt_token_ids), list(ours.token_ids or []))
        b = Run(self.labels[1], len(theirs.prompt_token_ids), list(theirs.token_ids or []))
        report = compare(request_id, a, b, [])
        note = "recordings hold no stage tensors and no logprobs: tokens compared"
        k = report.margin_token
        replayed = (Run.of("replay", session.engine, session.rows, request_id)
                    if request_id in session.request_ids else None)
        if k is not None and replayed is not None and replayed.tokens[:k + 1] == a.tokens[:k + 1] \
                and (logits := replayed.logits(k)) is not None:
            note += f"; {a.label}'s margin as this replay computes it (its tokens agree up to there)"
            report = dataclasses.replace(report, margins=(Margin.of(logits), None))
        elif k is not None:
            note += "; margins: step the replay past that token (its logits give the first recording's)"
        if ours.token_ids is None or theirs.token_ids is None:
            note += "; a recording ends before the request finished"
        return dataclasses.replace(report, note=note)


# ---- from the command line ---------------------------------------------------------------------------------
def comparison_for(args, session=None):
    """The comparison the debugger's flags ask for (at most one), or None. `session`: a replay's (--against)."""
    chosen = [flag for flag, on in (("--compare-alone", getattr(args, "compare_alone", False)),
                                    ("--compare-precision", getattr(args, "compare_precision", False)),
                                    ("--against", getattr(args, "against", None))) if on]
    if len(chosen) > 1:
        raise TinyVLLMError(f"compare one thing at a time: {' and '.join(chosen)} do not combine")
    if not chosen:
        return None
    if chosen == ["--compare-alone"]:
        return AloneComparison()
    if chosen == ["--compare-precision"]:
        return PrecisionComparison()
    if session is None or session.feed is None or not hasattr(session.feed, "queue"):
        raise TinyVLLMError("--against FILE2 compares with a replayed recording: tinyvllm debug --replay FILE "
                            "--against FILE2")
    from tinyvllm.serving.recording import read_recording
    return RecordingComparison(session.feed.queue.recording, read_recording(args.against))
