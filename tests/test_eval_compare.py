"""The tinyvllm-vs-HF comparison rule of scripts/eval_compare_hf.py: the same answers except near ties."""
from tinyvllm.evaluation.compare import compare_runs, format_comparison
from tinyvllm.evaluation.runner import PreparedTask, TaskRun
from tinyvllm.evaluation.scoring import TOO_LONG, ItemResult, best_choice


def run(rows):
    results = []
    for i, (answer, scores) in enumerate(rows):
        r = ItemResult("mmlu", f"s/{i}", "s", answer)
        if scores is None:
            r.status = TOO_LONG
        else:
            r.scores, r.prediction = scores, best_choice(scores)
        results.append(r)
    return TaskRun(PreparedTask("mmlu", [], [], []), list(range(len(rows))), results, 1.0, {})


def test_same_answers_pass_and_near_ties_may_flip():
    ref = run([(0, [-1.0, -2.0, -3.0, -4.0]), (1, [-1.0, -1.002, -3.0, -4.0]), (2, None)])
    ours = run([(0, [-1.001, -2.0, -3.0, -4.0]), (1, [-1.003, -1.001, -3.0, -4.0]), (2, None)])
    c = compare_runs(ours, ref, margin=5e-3, score_tol=2e-2)
    assert c["passed"] and c["agree"] == 1 and len(c["differ"]) == 1 and c["unexplained"] == 0
    assert c["compared"] == 2 and c["too_long"] == 1 and abs(c["max_score_diff"] - 0.003) < 1e-12
    assert c["accuracy_ours"] == 1.0 and c["accuracy_ref"] == 0.5
    assert "| mmlu | 3 | 2 (1) | 1 | 1 (1) |" in format_comparison([c], "tinyvllm", "HF")


def test_a_clear_difference_or_a_large_score_error_fails():
    ref = run([(0, [-1.0, -2.0, -3.0, -4.0])])
    assert not compare_runs(run([(0, [-2.1, -2.0, -3.0, -4.0])]), ref, 5e-3, 2e-2)["passed"]  # flips a clear win
    assert not compare_runs(run([(0, [-1.0, -2.0, -3.05, -4.0])]), ref, 5e-3, 2e-2)["passed"]  # same answer, off
    assert not compare_runs(run([(0, None)]), ref, 5e-3, 2e-2)["passed"]                       # one side missing
