"""Compare every stage of tinyvllm's forward pass with a golden file made by HF transformers.

The error of a stage is measured relative to the stage's scale, so one number works for embeddings
(~0.02) and logits (~10) alike:
    max_abs = max |ours - golden|        max_rel = max_abs / max |golden|
A stage passes when max_rel <= rtol (docs/internals.md, "Tolerances", says why the default is what it is).
Greedy continuations must agree token for token.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tinyvllm.errors import TinyVLLMError
from tinyvllm.engine.engine import LLMEngine
from tinyvllm.runner.stages import Stage
from tinyvllm.engine.sampling_params import SamplingParams

# The demo model's goldens ship inside the package (goldens/demo.npz in a checkout is a link to them).
DEFAULT_GOLDENS = Path(__file__).resolve().parent / "goldens" / "demo.npz"
DEFAULT_RTOL = 1e-4


@dataclass
class Goldens:
    path: Path
    meta: dict
    prompts: list[dict[str, np.ndarray]]

    @classmethod
    def load(cls, path: str | Path) -> "Goldens":
        path = Path(path)
        if not path.is_file():
            raise TinyVLLMError(f"golden file not found: {path} (goldens/make_goldens.py makes one)")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            meta = json.loads(str(arrays.pop("meta")))
        except Exception as e:  # a truncated or foreign file: say which and why
            raise TinyVLLMError(f"cannot read golden file {path}: {e}") from e
        prompts: dict[int, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            prefix, _, stage = key.partition(".")
            if not (prefix.startswith("p") and prefix[1:].isdigit() and stage):
                raise TinyVLLMError(f"golden file {path}: unexpected entry {key!r}")
            prompts.setdefault(int(prefix[1:]), {})[stage] = value
        if not prompts or any("input_ids" not in p for p in prompts.values()):
            raise TinyVLLMError(f"golden file {path}: every prompt needs input_ids")
        return cls(path, meta, [prompts[i] for i in sorted(prompts)])


@dataclass
class StageResult:
    prompt: int
    stage: str
    max_abs: float
    max_rel: float
    passed: bool
    note: str = ""


@dataclass
class GreedyResult:
    prompt: int
    golden: list[int]
    ours: list[int]

    @property
    def agreeing_prefix(self) -> int:
        n = 0
        for a, b in zip(self.golden, self.ours):
            if a != b:
                break
            n += 1
        return n

    @property
    def passed(self) -> bool:
        return self.ours == self.golden


@dataclass
class GoldenReport:
    stages: list[StageResult] = field(default_factory=list)
    greedy: list[GreedyResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.stages) and all(g.passed for g in self.greedy)

    @property
    def first_failure(self) -> StageResult | None:
        return next((s for s in self.stages if not s.passed), None)


def compare_stage(ours: np.ndarray, golden: np.ndarray, rtol: float) -> tuple[float, float, bool, str]:
    if ours.size != golden.size:
        return float("inf"), float("inf"), False, f"shape {ours.shape} vs golden {golden.shape}"
    ours = ours.reshape(golden.shape).astype(np.float64)
    golden = golden.astype(np.float64)
    if not np.isfinite(ours).all():
        return float("inf"), float("inf"), False, f"{int((~np.isfinite(ours)).sum())} non-finite values"
    max_abs = float(np.abs(ours - golden).max())
    scale = float(np.abs(golden).max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return max_abs, max_rel, max_rel <= rtol, ""


def check_goldens(engine: LLMEngine, goldens: Goldens, rtol: float = DEFAULT_RTOL,
                  check_greedy: bool = True, on_result=None) -> GoldenReport:
    """Queue every golden prompt (greedy, EOS ignored), step the engine's first step stage by stage and
    compare each prompt's rows of every stage; then run to the end and compare the greedy tokens."""
    report = GoldenReport()

    def record(result):
        (report.greedy if isinstance(result, GreedyResult) else report.stages).append(result)
        if on_result:
            on_result(result)

    n_new = max((len(g["greedy_ids"]) for g in goldens.prompts if "greedy_ids" in g), default=1)
    params = SamplingParams(temperature=0.0, max_tokens=n_new if check_greedy else 1, ignore_eos=True)
    request_ids = {engine.add_request(g["input_ids"].tolist(), params): p  # engine-made ids: checks can repeat
                   for p, g in enumerate(goldens.prompts)}
    for r in request_ids:
        if engine.request(r).error:
            raise TinyVLLMError(f"golden prompt {request_ids[r]}: {engine.request(r).error}")
    stages = engine.step_stages(all_logits=True)
    outputs = []
    try:
        while True:
            stage = next(stages)
            for result in compare_scheduled_rows(engine, stage, goldens, request_ids, rtol):
                record(result)
    except StopIteration as done:
        outputs = done.value
    missing = set(request_ids.values()) - {r.prompt for r in report.stages}
    if missing:
        raise TinyVLLMError(f"golden prompts {sorted(missing)} were not prefilled in the first step: "
                            f"raise --max-num-batched-tokens / --max-num-seqs")
    final = {o.request_id: o for o in outputs if o.finished}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    if check_greedy:
        for request_id, p in request_ids.items():
            golden = goldens.prompts[p]
            if "greedy_ids" in golden:
                golden_ids = golden["greedy_ids"].tolist()
                record(GreedyResult(p, golden_ids, final[request_id].token_ids[:len(golden_ids)]))
    return report


def compare_scheduled_rows(engine: LLMEngine, stage: Stage, goldens: Goldens, request_ids: dict[str, int],
                           rtol: float):
    """Compare the rows of one stage that belong to golden prompts against the golden file."""
    row = 0
    output = None
    for s in engine.last_schedule.scheduled:
        p = request_ids.get(s.seq.data.request_id)
        rows = slice(row, row + s.num_new_tokens)
        row += s.num_new_tokens
        if p is None:
            continue
        golden = goldens.prompts[p].get(stage.name)
        if golden is None:
            yield StageResult(p, stage.name, float("nan"), float("nan"), True, "no golden")
            continue
        output = stage.to_host() if output is None else output
        ours = output[rows]
        golden_rows = golden[s.start:s.end]
        max_abs, max_rel, passed, note = compare_stage(ours, golden_rows, rtol)
        if s.start > 0:
            note = (note + "; " if note else "") + f"positions {s.start}..{s.end - 1} (prefix cache)"
        yield StageResult(p, stage.name, max_abs, max_rel, passed, note)
