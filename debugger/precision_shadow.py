"""The other precision in lockstep (`tinyvllm debug --compare-precision`): a shadow engine on the same model and
requests, its `step_stages()` advanced to the stage the debugger's engine just ran, and the two outputs compared.

The shadow only reads what the main engine was given (prompts, sampling parameters, request ids, aborts: a
replay's feed aborts through the session, as it adds); the main engine never sees the shadow. Comparison stops for good, and says why, when the two stop being comparable: they sampled
a different token (the precisions diverged), scheduled a different batch, or the shadow failed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tinyvllm.engine.engine import LLMEngine
from tinyvllm.errors import TinyVLLMError

from debugger.divergence import StageRows
from debugger.rows import as_rows, row_labels


def other_precision(precision: str) -> str:
    return "fast" if precision == "fp32" else "fp32"


@dataclass(frozen=True)
class PrecisionDiff:
    """One stage's output in the main precision against the other's: max |main - other|, that over max |main|,
    and max |main - other| per row of as_rows(output)."""
    label: str                          # "fp32 vs fast": the main engine's precision first
    stage: str
    max_abs: float
    max_rel: float
    row_max_abs: tuple[float, ...]

    @classmethod
    def of(cls, label: str, stage: str, main: np.ndarray, other: np.ndarray) -> PrecisionDiff:
        main64, other64 = np.asarray(main, np.float64), np.asarray(other, np.float64)
        delta = np.abs(main64 - other64)
        max_abs, scale = float(delta.max(initial=0.0)), float(np.abs(main64).max(initial=0.0))
        max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
        return cls(label, stage, max_abs, max_rel, tuple(float(r) for r in as_rows(delta).max(axis=1, initial=0.0)))

    def describe(self) -> str:
        return f"{self.label} at {self.stage}: max abs {self.max_abs:.3e} · max rel {self.max_rel:.3e}"


def _schedule_key(engine: LLMEngine) -> tuple:
    schedule = engine.last_schedule
    return tuple((s.seq.data.request_id, s.start, s.end) for s in schedule.scheduled) if schedule else ()


class PrecisionShadow:
    def __init__(self, main: LLMEngine):
        other = other_precision(main.precision)
        config = dataclasses.replace(main.config, precision=other)
        try:
            self.engine = LLMEngine(main.model, config, log=lambda message: None)
        except TinyVLLMError as e:
            raise TinyVLLMError(f"--compare-precision needs a {other} engine too: {e}") from e
        self.label = f"{main.precision} vs {self.engine.precision}"
        self.stopped = ""      # why comparing stopped ("" while it goes on)
        self.rows = StageRows()   # the shadow's rows by request and position (divergence.py compares them)
        self._stages = None

    @property
    def active(self) -> bool:
        return not self.stopped

    def add_request(self, prompt, params, request_id: str) -> None:
        if self.active:
            self._guard(lambda: self.engine.add_request(prompt, params, request_id=request_id))

    def abort_request(self, request_id: str) -> None:
        if self.active:
            self._guard(lambda: self.engine.abort_request(request_id))

    def begin_step(self, all_logits: bool) -> None:
        self._stages = self.engine.step_stages(all_logits=all_logits) if self.active else None

    def compare(self, main: LLMEngine, step: int, stage_name: str, values: np.ndarray) -> PrecisionDiff | None:
        """Advance the shadow to `stage_name` and compare its output with the main engine's `values`."""
        if not self.active or self._stages is None:
            return None

        def advance():
            for stage in self._stages:
                if stage.name == stage_name:
                    return stage.kernel, stage.to_host()
            self._stop(f"the {self.engine.precision} engine's step {step} has no stage {stage_name}")
        advanced = self._guard(advance)
        if advanced is None:
            return None
        kernel, other = advanced
        if _schedule_key(main) != _schedule_key(self.engine):
            return self._stop(f"the two engines scheduled different batches at step {step}")
        if np.shape(other) != np.shape(values):
            return self._stop(f"{stage_name} shapes differ at step {step}: {np.shape(values)} vs {np.shape(other)}")
        self.rows.observe(stage_name, kernel, other, row_labels(self.engine.last_schedule, as_rows(other).shape[0]))
        return PrecisionDiff.of(self.label, stage_name, values, other)

    def end_step(self, step: int, outputs) -> None:
        """Finish the shadow's step (sampling); stop comparing if it sampled other tokens than `outputs`."""
        if not self.active or self._stages is None:
            return
        stages, self._stages = self._stages, None

        def drain():
            try:
                while True:
                    next(stages)
            except StopIteration as done:
                return done.value or []
        theirs = self._guard(drain)
        if theirs is None:
            return
        ours = {o.request_id: list(o.new_token_ids) for o in outputs}
        other = {o.request_id: list(o.new_token_ids) for o in theirs}
        for request_id, tokens in ours.items():
            if other.get(request_id) != tokens:
                theirs_text = " ".join(map(str, other.get(request_id, []))) or "none"
                self._stop(f"precisions diverged at step {step} (req {request_id}: token "
                           f"{' '.join(map(str, tokens)) or 'none'} vs {theirs_text}); comparison stopped")
                return

    def _guard(self, action):
        try:
            return action()
        except Exception as e:  # the shadow must never take the main engine's session down
            self._stop(f"the {self.engine.precision} engine failed: {type(e).__name__}: {e}")
            return None

    def _stop(self, why: str) -> None:
        if not self.stopped:
            self.stopped = why
        self._stages = None
        return None
