"""Two runs of the same questions side by side (tinyvllm vs HF transformers): do they pick the same answers?

A question agrees when both picked the same choice. It may differ only where the reference's top two
choices are within `margin` nats of each other (a near tie, which float32 rounding can flip); any other
difference, a choice score that differs by more than `score_tol`, or a question one side scored and the
other did not (an error; too long for both is fine) fails the comparison. Accuracies are equal when no
question differs.
"""
from __future__ import annotations

from tinyvllm.evaluation.runner import TaskRun
from tinyvllm.evaluation.scoring import top_two_margin


def compare_runs(ours: TaskRun, ref: TaskRun, margin: float, score_tol: float) -> dict:
    assert [r.id for r in ours.results] == [r.id for r in ref.results], "the runs must score the same questions"
    differ, near_ties, max_diff, both, status_differs = [], [], 0.0, 0, []
    for a, b in zip(ours.results, ref.results):
        if a.status != b.status:
            status_differs.append({"id": a.id, "ours": a.status, "ref": b.status, "error": a.error or b.error})
        if a.scores is None or b.scores is None:
            continue
        both += 1
        diff = max(abs(x - y) for x, y in zip(a.scores, b.scores))
        max_diff = max(max_diff, diff)
        gap = top_two_margin(b.scores)
        if gap < margin:
            near_ties.append(a.id)
        if a.prediction != b.prediction:
            differ.append({"id": a.id, "ours": a.prediction, "ref": b.prediction, "ref_margin": gap,
                           "max_score_diff": diff, "near_tie": gap < margin})
    unexplained = [d for d in differ if not d["near_tie"]]
    accuracy = {name: sum(r.correct for r in run.results if r.evaluated) / max(1, sum(r.evaluated for r in run.results))
                for name, run in (("ours", ours), ("ref", ref))}
    return {
        "task": ours.prepared.task, "questions": len(ours.results), "compared": both,
        "too_long": sum(r.status == "too_long" for r in ours.results), "status_differs": status_differs,
        "agree": both - len(differ), "differ": differ, "unexplained": len(unexplained),
        "near_ties": len(near_ties), "max_score_diff": max_diff, "margin": margin, "score_tol": score_tol,
        "accuracy_ours": accuracy["ours"], "accuracy_ref": accuracy["ref"],
        "seconds_ours": ours.seconds, "seconds_ref": ref.seconds,
        "passed": both > 0 and not status_differs and not unexplained and max_diff <= score_tol,
    }


def format_comparison(rows: list[dict], ours: str, ref: str) -> str:
    """A markdown table, one row per task."""
    lines = [f"| task | questions | compared (too long) | agree | differ (near ties) | max abs score diff | "
             f"accuracy {ours} | accuracy {ref} | result |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['questions']} | {r['compared']} ({r['too_long']}) | {r['agree']} | {len(r['differ'])} "
                     f"({len(r['differ']) - r['unexplained']}) | {r['max_score_diff']:.2e} | "
                     f"{100 * r['accuracy_ours']:.2f} % | {100 * r['accuracy_ref']:.2f} % | "
                     f"{'PASS' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)
