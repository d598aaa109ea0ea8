"""Compare every stage of tinyvllm's forward pass with a golden file made by HF transformers.

The error of a stage is measured relative to the stage's scale, so one number works for embeddings
(~0.02) and logits (~10) alike:
    max_abs = max |ours - golden|        max_rel = max_abs / max |golden|
A stage passes when max_rel <= rtol (README.md says why the default is what it is).
Greedy continuations must agree token for token.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import TinyVLLMError
from .generate import generate_greedy
from .model import LoadedModel
from .model_runner import ForwardBatch

DEFAULT_GOLDENS = Path(__file__).resolve().parent.parent / "goldens" / "demo.npz"
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


def stage_errors(model: LoadedModel, input_ids: np.ndarray, golden: dict[str, np.ndarray],
                 prompt_index: int, rtol: float):
    """Drive the stepping forward pass over one prompt and compare each stage as it is produced."""
    ids = np.asarray(input_ids, dtype=np.int32)
    kv = model.runner.kv_cache
    slot = kv.allocate_slot()
    try:
        batch = ForwardBatch(ids, np.arange(len(ids)), np.full(len(ids), slot), np.array([len(ids) - 1]))
        for stage in model.runner.forward_stages(batch, all_logits=True):
            if stage.name not in golden:
                yield StageResult(prompt_index, stage.name, float("nan"), float("nan"), True, "no golden")
                continue
            max_abs, max_rel, passed, note = compare_stage(stage.to_host(), golden[stage.name], rtol)
            yield StageResult(prompt_index, stage.name, max_abs, max_rel, passed, note)
    finally:
        kv.free_slot(slot)


def check_goldens(model: LoadedModel, goldens: Goldens, rtol: float = DEFAULT_RTOL,
                  check_greedy: bool = True, on_result=None) -> GoldenReport:
    report = GoldenReport()
    for p, golden in enumerate(goldens.prompts):
        ids = golden["input_ids"]
        if len(ids) >= model.max_seq_len:
            raise TinyVLLMError(f"golden prompt {p} has {len(ids)} tokens; the context holds {model.max_seq_len}")
        for result in stage_errors(model, ids, golden, p, rtol):
            report.stages.append(result)
            if on_result:
                on_result(result)
    if check_greedy:
        with_greedy = [(p, g) for p, g in enumerate(goldens.prompts) if "greedy_ids" in g]
        if with_greedy:
            n = max(len(g["greedy_ids"]) for _, g in with_greedy)
            completions = generate_greedy(model, [g["input_ids"].tolist() for _, g in with_greedy], n,
                                          stop_on_eos=False)
            for (p, g), c in zip(with_greedy, completions):
                golden_ids = g["greedy_ids"].tolist()
                result = GreedyResult(p, golden_ids, c.token_ids[:len(golden_ids)])
                report.greedy.append(result)
                if on_result:
                    on_result(result)
    return report
