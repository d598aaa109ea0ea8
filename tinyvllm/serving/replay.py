"""Replay a recorded serving session (recording.py) in-process and compare the tokens with what the server answered.

    recording = read_recording("session.jsonl")
    report = replay(recording, LLMEngine(model, engine_config_for(recording)))
    print(format_report(report))                 # per request: match, or diverged at token i

Each recorded request is queued with its recorded prompt token ids and sampling parameters (with the seed the
engine chose then) just before the engine step it arrived at, and aborted before the step it was aborted at;
the engine is stepped until everything has finished. With the same model and engine configuration the
batches are the same step by step, so greedy and seeded sampling give the same tokens. With another
configuration the requests may run in other batches (another floating-point summation order, other
preemptions) and diverge: the report says which and at which token. When the replaying engine is idle
before the next recorded arrival step (it finished sooner than the server did), the rest of the arrivals
shift earlier by the difference, keeping their step distances.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.serving.recording import BadRecording, RecordedRequest, Recording


@dataclass
class RequestResult:
    request_id: str
    recorded: list[int] | None          # None: the recording ended before the request finished
    replayed: list[int]
    recorded_reason: str | None
    replayed_reason: str | None
    error: str | None = None            # the replaying engine's, if the request failed there
    recorded_steps: tuple[int, int | None] = (0, None)   # (arrival step, finish step) in the recording
    replayed_steps: tuple[int, int | None] = (0, None)   # the same in the replay (arrival steps shifted)

    @property
    def diverged_at(self) -> int | None:
        """Index of the first token that differs (the shorter length when one is a prefix of the other);
        None when the tokens agree."""
        if self.recorded is None:
            return None
        for i, (a, b) in enumerate(zip(self.recorded, self.replayed)):
            if a != b:
                return i
        return None if len(self.recorded) == len(self.replayed) else min(len(self.recorded), len(self.replayed))

    @property
    def matched(self) -> bool:
        return (self.recorded is not None and self.diverged_at is None
                and self.recorded_reason == self.replayed_reason)


@dataclass
class ReplayReport:
    results: list[RequestResult]
    seconds: float
    num_steps: int
    config_differences: dict[str, tuple] = field(default_factory=dict)  # field: (recorded, replayed)
    shifted_arrivals: int = 0           # arrivals queued before their recorded step (the engine was idle)
    edits_not_applied: int = 0          # the recording's value edits (debugger), which only debug --replay applies

    @property
    def num_matched(self) -> int:
        return sum(r.matched for r in self.results)

    @property
    def diverged(self) -> list[RequestResult]:
        return [r for r in self.results if r.recorded is not None and not r.matched]

    @property
    def output_tokens(self) -> int:
        return sum(len(r.replayed) for r in self.results)


def engine_config_for(recording: Recording, overrides: dict | None = None) -> EngineConfig:
    """The recorded EngineConfig, with `overrides` (field: value) on top; unknown fields raise."""
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    settings = {k: v for k, v in recording.engine_config.items() if k in known}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise TinyVLLMError(f"unknown engine setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return EngineConfig(**{**settings, **(overrides or {})})
    except TypeError as e:  # a value of the wrong type, e.g. --replay-set max_num_seqs=x
        raise TinyVLLMError(f"invalid engine setting in {overrides or recording.path}: {e}") from e


def sampling_params(request: RecordedRequest, path: str) -> SamplingParams:
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    try:
        return SamplingParams(**{k: v for k, v in request.params.items() if k in known})
    except (TypeError, ValueError, TinyVLLMError) as e:
        raise BadRecording(f"{path}:{request.line}: request {request.request_id!r}: {e}") from e


class ReplayQueue:
    """The recorded requests, let into an engine at their recorded steps: `admit()` before every step,
    `on_outputs()` after it, `report()` once it is all done (replay() below; the debugger steps the same)."""

    def __init__(self, recording: Recording):
        self.recording = recording
        self.params = {r.request_id: sampling_params(r, recording.path) for r in recording.requests}  # all checked first
        self.arrivals = sorted(recording.requests, key=lambda r: (r.step, r.line))
        self.aborts = sorted((r.abort_step, r.line, r.request_id) for r in recording.requests
                             if r.abort_step is not None)
        self.finished: dict[str, tuple] = {}
        self.arrived: dict[str, int] = {}
        self.offset = self.shifted = 0     # recorded step = engine.num_steps + offset

    @property
    def has_arrivals(self) -> bool:
        return bool(self.arrivals)

    def admit(self, engine: LLMEngine, add=None) -> list[str]:
        """Queue the requests due before the engine's next step (`add(prompt, params, request_id=...)`,
        default engine.add_request) and apply the aborts due; returns the ids queued. An idle engine jumps
        to the next arrival's step."""
        add = add or engine.add_request
        if self.arrivals and not engine.has_unfinished_requests() and self.arrivals[0].step > engine.num_steps + self.offset:
            self.offset = self.arrivals[0].step - engine.num_steps   # idle before the next arrival: jump to it
            self.shifted += 1
        queued = []
        while self.arrivals and self.arrivals[0].step <= engine.num_steps + self.offset:
            r = self.arrivals.pop(0)
            self.arrived[r.request_id] = engine.num_steps + self.offset
            add(list(r.prompt_token_ids), self.params[r.request_id], request_id=r.request_id)
            queued.append(r.request_id)
        while self.aborts and self.aborts[0][0] <= engine.num_steps + self.offset:
            engine.abort_request(self.aborts.pop(0)[2])
        return queued

    def on_outputs(self, engine: LLMEngine, outputs) -> None:
        for out in outputs:
            if out.finished and out.request_id in self.params:
                self.finished[out.request_id] = (list(out.token_ids), out.finish_reason, out.error,
                                                 engine.num_steps + self.offset)

    def report(self, engine: LLMEngine, seconds: float, num_steps: int) -> ReplayReport:
        """Each recorded request's tokens against the recorded answer (so far: unfinished ones say so)."""
        results = []
        for r in self.recording.requests:
            tokens, reason, error, finish_step = self.finished.get(r.request_id, ([], None, "never finished", None))
            results.append(RequestResult(r.request_id, r.token_ids, tokens, r.finish_reason, reason, error,
                                         (r.step, r.finish_step), (self.arrived.get(r.request_id, r.step), finish_step)))
        recorded_config = self.recording.engine_config
        differences = {k: (recorded_config.get(k), v) for k, v in dataclasses.asdict(engine.config).items()
                       if k in recorded_config and recorded_config[k] != v}
        return ReplayReport(results, seconds, num_steps, differences, self.shifted)


def replay(recording: Recording, engine: LLMEngine, on_step=None) -> ReplayReport:
    """Queue the recorded requests into `engine` (fresh: no requests of its own) at their recorded steps,
    step it until all finish, and compare tokens. `on_step(engine, outputs)` is called after every step."""
    queue = ReplayQueue(recording)
    first_step = engine.num_steps
    start = time.perf_counter()
    while queue.has_arrivals or engine.has_unfinished_requests():
        queue.admit(engine)
        if not engine.has_unfinished_requests():
            continue
        outputs = engine.step()
        queue.on_outputs(engine, outputs)
        if on_step is not None:
            on_step(engine, outputs)
    report = queue.report(engine, time.perf_counter() - start, engine.num_steps - first_step)
    report.edits_not_applied = len(recording.edits)
    return report


def format_report(report: ReplayReport) -> str:
    lines = []
    for r in report.results:
        if r.recorded is None:
            verdict = f"not compared: the recording ends before it finished ({len(r.replayed)} tokens replayed)"
        elif r.matched:
            verdict = f"match ({len(r.replayed)} tokens, {r.replayed_reason})"
        elif r.diverged_at is None:
            verdict = f"DIVERGED: same tokens, finish reason {r.recorded_reason} recorded, {r.replayed_reason} replayed"
        else:
            i = r.diverged_at
            token = lambda ids: ids[i] if i < len(ids) else "end"
            verdict = (f"DIVERGED at token {i}: recorded {token(r.recorded)}, replayed {token(r.replayed)} "
                       f"({len(r.recorded)} vs {len(r.replayed)} tokens)")
        if r.recorded is not None and r.replayed_steps != r.recorded_steps:
            verdict += (f" [arrival, finish step: {_steps(r.recorded_steps)} recorded, "
                        f"{_steps(r.replayed_steps)} replayed]")
        if r.error:
            verdict += f" [error: {r.error}]"
        lines.append(f"{r.request_id}: {verdict}")
    compared = sum(r.recorded is not None for r in report.results)
    rate = report.output_tokens / report.seconds if report.seconds > 0 else float("inf")
    lines.append(f"{report.num_matched}/{compared} requests match token for token; {len(report.diverged)} diverged")
    lines.append(f"{report.output_tokens} output tokens in {report.num_steps} steps, {report.seconds:.2f} s "
                 f"({rate:.1f} tok/s)")
    if report.config_differences:
        lines.append("engine configuration differs from the recording: " + ", ".join(
            f"{k} {a!r} -> {b!r}" for k, (a, b) in report.config_differences.items()))
    if report.edits_not_applied:
        lines.append(f"{report.edits_not_applied} value edit(s) recorded in the debugger are not applied here (the "
                     f"engine does not stop between stages): tinyvllm debug --replay FILE applies them")
    if report.shifted_arrivals:
        lines.append(f"{report.shifted_arrivals} arrival step(s) shifted earlier: the engine was idle before them")
    return "\n".join(lines)


def _steps(steps: tuple[int, int | None]) -> str:
    return f"{steps[0]}, {'-' if steps[1] is None else steps[1]}"


# ---- tinyvllm bench --replay -------------------------------------------------------------------------------
def add_bench_arguments(p) -> None:
    r = p.add_argument_group("replay a recorded serving session (tinyvllm serve --record FILE)")
    r.add_argument("--replay", metavar="FILE",
                   help="replay FILE's requests in-process at their recorded engine steps, with the recorded "
                        "engine configuration and model (unless --model): per-request token match and "
                        "throughput; exit 1 when a request diverged")
    r.add_argument("--replay-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="with --replay: change one engine setting (e.g. max_num_seqs=1; repeatable)")


def run_bench_replay(args) -> int:
    from tinyvllm.serving.recording import read_recording
    recording = read_recording(args.replay)
    config = engine_config_for(recording, dict(_setting(s) for s in args.replay_set))
    model = args.model or recording.header.get("model")
    engine = LLMEngine(model, config)
    report = replay(recording, engine)
    print(format_report(report))
    return 1 if report.diverged else 0


def _setting(text: str) -> tuple[str, object]:
    import json
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise TinyVLLMError(f"--replay-set expects FIELD=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value  # a bare string, e.g. batching=static
