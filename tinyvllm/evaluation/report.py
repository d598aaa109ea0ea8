"""The report: accuracy per task and per subject with 95 % confidence intervals, counts of what was not
scored, speed, length histograms; written as results.json, items.csv (one row per question, so two runs
can be diffed), summary.txt and lengths_<task>.png.

Confidence intervals are Wilson score intervals (95 %, z = 1.959964): unlike the normal approximation
p +- z sqrt(p (1 - p) / n) they stay inside [0, 1] and do not collapse to a point at 0 or n correct, which
matters for small subjects and subsets. Accuracy counts every evaluated question (scored, or answered but
unparseable = wrong); too-long and failed questions are not in it and are counted and listed separately.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from pathlib import Path

from tinyvllm.evaluation.histograms import format_histograms, histogram, length_edges, plot_histograms
from tinyvllm.evaluation.runner import EvalConfig, TaskRun
from tinyvllm.evaluation.scoring import ERROR, TOO_LONG, UNPARSEABLE, ItemResult
from tinyvllm.evaluation.tasks import LETTERS

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
CI_METHOD = "Wilson score interval, 95 %"


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval for `correct` successes in `n` trials."""
    if n == 0:
        return (math.nan, math.nan)
    p = correct / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, center - half), min(1.0, center + half))


def accuracy(results: list[ItemResult]) -> dict:
    evaluated = [r for r in results if r.evaluated]
    n, correct = len(evaluated), sum(r.correct for r in evaluated)
    low, high = wilson_interval(correct, n)
    return {"n": n, "correct": correct, "accuracy": correct / n if n else math.nan, "ci95": [low, high]}


def task_summary(run: TaskRun, config: EvalConfig) -> dict:
    p, results = run.prepared, run.results
    subjects = {}
    for r in results:
        subjects.setdefault(r.subject, []).append(r)
    per_subject = {s: accuracy(rs) for s, rs in sorted(subjects.items())}
    scored_subjects = [a["accuracy"] for a in per_subject.values() if a["n"]]
    evaluated = [r for r in results if r.evaluated]
    prompt_tokens = sum(r.prompt_tokens for r in evaluated)
    output_tokens = sum(r.output_tokens for r in evaluated)
    seconds = run.seconds
    edges = length_edges(config.max_context)
    lengths = p.lengths
    measured = [n for n in lengths if n is not None]  # all, or those the selection needed (runner.prepare_task)
    histograms = {"edges": edges, "prompt_full": histogram(measured, edges),
                  "prompt_full_label": "full set" if len(measured) == len(lengths) else "sampled from",
                  "prompt_subset": histogram([lengths[i] for i in run.selected], edges)}
    if config.mode == "generative":
        histograms["output_edges"] = length_edges(config.max_gen_tokens, first=1)
        histograms["output_subset"] = histogram([r.output_tokens for r in evaluated], histograms["output_edges"])
    return {
        "task": p.task, "mode": config.mode, "num_fewshot": p.num_fewshot,
        "num_questions": len(p.questions), "num_selected": len(results),
        **accuracy(results), "ci_method": CI_METHOD,
        "macro_accuracy": sum(scored_subjects) / len(scored_subjects) if scored_subjects else math.nan,
        "num_unparseable": sum(r.status == UNPARSEABLE for r in results),
        "num_too_long": sum(r.status == TOO_LONG for r in results),
        "too_long_ids": [r.id for r in results if r.status == TOO_LONG],
        "num_errors": sum(r.status == ERROR for r in results),
        "errors": [{"id": r.id, "error": r.error} for r in results if r.status == ERROR],
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "seconds": seconds,
        "prompt_tokens_per_s": prompt_tokens / seconds if seconds > 0 else math.nan,
        "tokens_per_s": (prompt_tokens + output_tokens) / seconds if seconds > 0 else math.nan,
        "questions_per_s": len(evaluated) / seconds if seconds > 0 else math.nan,
        "subjects": per_subject, "length_histograms": histograms, "backend": run.backend_stats,
        "notes": p.notes,
    }


def item_rows(runs: list[TaskRun]) -> list[dict]:
    rows = []
    for run in runs:
        for r in run.results:
            row = asdict(r)
            row["answer"] = LETTERS[r.answer]
            row["prediction"] = None if r.prediction is None else LETTERS[r.prediction]
            row["correct"] = r.correct
            rows.append(row)
    return rows


def write_report(report: dict, runs: list[TaskRun], out: Path, plot: bool, log) -> list[Path]:
    """results.json (summary + items), items.csv, summary.txt and, with matplotlib, one PNG per task."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    items = item_rows(runs)
    path = out / "results.json"
    path.write_text(json.dumps({**report, "items": items}, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    written.append(path)
    path = out / "items.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        columns = ["task", "id", "subject", "status", "answer", "prediction", "correct", "prompt_tokens",
                   "output_tokens", *(f"score_{letter}" for letter in LETTERS), "error"]
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for item in items:
            scores = item["scores"] or [None] * len(LETTERS)
            writer.writerow({**item, **{f"score_{letter}": "" if s is None else repr(s)
                                        for letter, s in zip(LETTERS, scores)}})
    written.append(path)
    path = out / "summary.txt"
    path.write_text(format_summary(report) + "\n", encoding="utf-8")
    written.append(path)
    if plot:
        for name, summary in report["tasks"].items():
            h = summary["length_histograms"]
            columns = {h["prompt_full_label"]: h["prompt_full"], "subset": h["prompt_subset"]}
            panels = [(f"{name}: prompt tokens", h["edges"], columns)]
            if "output_subset" in h:
                panels.append((f"{name}: output tokens", h["output_edges"], {"subset": h["output_subset"]}))
            path = out / f"lengths_{name}.png"
            if plot_histograms(path, panels):
                written.append(path)
            else:
                log("matplotlib is not installed: no PNG histograms (the text ones are in summary.txt)")
                break
    return written


def format_summary(report: dict) -> str:
    lines = [f"tinyvllm eval: {report['backend']}", f"  {report['command']}"]
    for name, s in report["tasks"].items():
        low, high = s["ci95"]
        lines += ["", f"{name}: {s['mode']}, {s['num_fewshot']}-shot, {s['num_selected']} of {s['num_questions']} "
                      f"questions ({report['selection']})",
                  f"  accuracy {_pct(s['accuracy'])} ({s['correct']}/{s['n']}), 95 % CI [{_pct(low)}, {_pct(high)}] "
                  f"({s['ci_method']}); macro average over subjects {_pct(s['macro_accuracy'])}",
                  f"  unparseable {s['num_unparseable']} (counted wrong), too long {s['num_too_long']} "
                  f"(over {report['config']['max_context']} tokens, not run), errors {s['num_errors']}",
                  f"  {s['prompt_tokens']} prompt + {s['output_tokens']} output tokens in {s['seconds']:.1f} s: "
                  f"{s['prompt_tokens_per_s']:.0f} prompt tok/s, {s['questions_per_s']:.2f} questions/s"
                  + (f"; prefix-cache hit rate {_pct(s['backend']['prefix_cache_hit_rate'])}"
                     if "prefix_cache_hit_rate" in s["backend"] else "")]
        lines += [f"  note: {note}" for note in s["notes"]]
        lines += [f"  error {e['id']}: {e['error']}" for e in s["errors"][:5]]
        lines.append(f"  {'subject':<40} {'n':>5} {'accuracy':>9}  95 % CI")
        for subject, a in s["subjects"].items():
            if a["n"]:
                lines.append(f"  {subject:<40} {a['n']:>5} {_pct(a['accuracy']):>9}  "
                             f"[{_pct(a['ci95'][0])}, {_pct(a['ci95'][1])}]")
        h = s["length_histograms"]
        lines.append(format_histograms("prompt tokens", h["edges"],
                                       {h["prompt_full_label"]: h["prompt_full"], "subset": h["prompt_subset"]}))
        if "output_subset" in h:
            lines.append(format_histograms("output tokens", h["output_edges"], {"subset": h["output_subset"]}))
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f} %"
