"""Scoring machinery without a model: answer parsing, the continuation trie, confidence intervals, the
runner's too-long handling and the written report (a fake backend stands in for the engine)."""
import csv
import json
import math

import pytest

from tinyvllm.evaluation import runner
from tinyvllm.evaluation.backends import Failure, Generation
from tinyvllm.evaluation.report import task_summary, wilson_interval, write_report
from tinyvllm.evaluation.runner import EvalConfig, prepare_task, run_task, select
from tinyvllm.evaluation.scoring import ContinuationTrie, best_choice, parse_answer_letter, top_two_margin
from tinyvllm.evaluation.tasks import Question

A, B, C, D = range(4)


@pytest.mark.parametrize("text, expected", [
    ("The best answer is B.", B), ("the best answer is (C)", C), ("The best answer is **D**", D),
    ("The best answer is: A", A), ("Answer: A", A), ("The answer is D", D), ("B", B), ("(B)", B),
    ("C) because it is", C), (" B. Paris", B),
    ("The best answer is A. No wait, the best answer is C.", C),   # the last conclusion counts
    ("The best answer is E", None), ("I think it is a cat", None), ("An Apple a day", None),
    ("Answer: Apple", None), ("The best answer is", None), ("", None), ("ABCD", None),
])
def test_parse_answer_letter(text, expected):
    assert parse_answer_letter(text) == expected


def test_trie_single_token_continuations_are_one_request():
    trie = ContinuationTrie([(10,), (11,), (12,), (13,)])
    assert trie.nodes == {(): (10, 11, 12, 13)} and trie.deeper_nodes == []
    assert trie.scores({(): {10: -1.0, 11: -0.5, 12: -3.0, 13: -2.0}}) == [-1.0, -0.5, -3.0, -2.0]


def test_trie_multi_token_continuations_sum_their_tokens():
    # the demo vocabulary: " A" = [220, 32], " B" = [220, 33], " D" = [263]
    trie = ContinuationTrie([(220, 32), (220, 33), (263,)])
    assert trie.nodes == {(): (220, 263), (220,): (32, 33)} and trie.deeper_nodes == [(220,)]
    logprobs = {(): {220: -0.25, 263: -2.0}, (220,): {32: -1.5, 33: -0.125}}
    assert trie.scores(logprobs) == [-1.75, -0.375, -2.0]


def test_best_choice_and_margin():
    assert best_choice([-2.0, -1.0, -1.0, -3.0]) == 1  # ties: the first, as np.argmax
    assert top_two_margin([-2.0, -1.0, -1.5, -3.0]) == 0.5


def test_wilson_interval_against_hand_computation():
    # 7 of 10, z = 1.959964, z^2 = 3.841459: center = (0.7 + z^2/20) / (1 + z^2/10) = 0.892073 / 1.384146
    # = 0.644493, half = z sqrt(0.021 + z^2/400) / (1 + z^2/10) = 1.959964 * 0.174939 / 1.384146 = 0.247715
    # -> [0.396778, 0.892209] (Newcombe 1998, table I, gives 0.3968-0.8922)
    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.396778, abs=2e-6) and high == pytest.approx(0.892209, abs=2e-6)
    assert wilson_interval(0, 5)[0] == 0.0 and 0 < wilson_interval(0, 5)[1] < 1
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


class FakeTokenizer:
    """One token per character (ids = code points); BOS 1 with special tokens."""
    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(ch) for ch in text]

    def apply_chat_template(self, messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class FakeBackend:
    name = "fake"

    def __init__(self):
        self.jobs = []

    def loglikelihoods(self, jobs, on_done):
        self.jobs = jobs
        for j in reversed(range(len(jobs))):            # any order: results land by index
            if j == 1:
                on_done(j, Failure("boom"))
            else:
                on_done(j, [-1.0, -0.5 - j, -2.0, -0.25])  # D wins

    def generate(self, jobs, max_tokens, stop, on_done):
        self.jobs = jobs
        for j in range(len(jobs)):
            on_done(j, Generation(" C." if j % 2 else " (none)", 3))

    def stats(self):
        return {"prefix_cache_hit_rate": 0.5}


def tiny_task(monkeypatch):
    questions = [Question("mmlu", f"s{i % 2}/{i}", f"s{i % 2}", "Q" * (3 + 40 * (i == 4)), ("a", "b", "c", "d"), i % 4)
                 for i in range(6)]
    monkeypatch.setitem(runner.TASKS, "mmlu", lambda: questions)
    return questions


def test_loglikelihood_run_reports_too_long_and_errors(monkeypatch, tmp_path):
    tiny_task(monkeypatch)
    config = EvalConfig(max_context=120)
    prepared = prepare_task("mmlu", config, FakeTokenizer())
    selected = select([prepared], config)["mmlu"]
    backend = FakeBackend()
    run = run_task(prepared, selected, config, backend, FakeTokenizer())
    statuses = [r.status for r in run.results]
    # prompts are 102 tokens (BOS + 101 characters) + 2 for " A": question 4's is 40 characters longer
    assert statuses == ["ok", "error", "ok", "ok", "too_long", "ok"]
    assert [len(job.prompt_ids) for job in backend.jobs] == [len(prepared.prompt_ids[i]) for i in (0, 1, 2, 3, 5)]
    assert backend.jobs[0].continuations == [(32, 65), (32, 66), (32, 67), (32, 68)]  # " A".." D" after the prompt
    assert [r.prediction for r in run.results] == [3, None, 3, 3, None, 3]
    summary = task_summary(run, config)
    assert (summary["n"], summary["correct"], summary["num_too_long"], summary["num_errors"]) == (4, 1, 1, 1)
    assert summary["too_long_ids"] == ["s0/4"] and summary["errors"] == [{"id": "s1/1", "error": "boom"}]
    assert summary["subjects"]["s1"]["n"] == 2 and summary["length_histograms"]["prompt_subset"][-1] == 1  # the too-long one

    report = {"backend": "fake", "command": "tinyvllm eval", "config": {"max_context": 120}, "selection": "all",
              "tasks": {"mmlu": summary}}
    written = write_report(report, [run], tmp_path, plot=False, log=print)
    assert {p.name for p in written} == {"results.json", "items.csv", "summary.txt"}
    items = json.loads((tmp_path / "results.json").read_text())["items"]
    assert [(i["id"], i["status"], i["answer"], i["prediction"]) for i in items][:2] == [
        ("s0/0", "ok", "A", "D"), ("s1/1", "error", "B", None)]
    rows = list(csv.DictReader(open(tmp_path / "items.csv")))
    assert len(rows) == 6 and rows[3]["correct"] == "True" and float(rows[0]["score_D"]) == -0.25
    assert "too long 1" in (tmp_path / "summary.txt").read_text()


def test_generative_run_parses_letters(monkeypatch):
    tiny_task(monkeypatch)
    config = EvalConfig(mode="generative", max_gen_tokens=4, max_context=400)
    prepared = prepare_task("mmlu", config, FakeTokenizer())
    backend = FakeBackend()
    run = run_task(prepared, list(range(6)), config, backend, FakeTokenizer())
    assert prepared.texts[0].endswith("<assistant>The best answer is") and config.stop == (".",)
    assert [r.status for r in run.results] == ["unparseable", "ok"] * 3
    assert [r.prediction for r in run.results] == [None, C] * 3 and run.results[1].response == "The best answer is C."
    assert task_summary(run, config)["num_unparseable"] == 3


def test_histogram_png_with_matplotlib(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional: without it eval writes no PNG (says so)")
    tiny_task(monkeypatch)
    config = EvalConfig(mode="generative", max_gen_tokens=4, max_context=400)
    prepared = prepare_task("mmlu", config, FakeTokenizer())
    run = run_task(prepared, list(range(6)), config, FakeBackend(), FakeTokenizer())
    report = {"backend": "fake", "command": "tinyvllm eval", "config": {"max_context": 400}, "selection": "all",
              "tasks": {"mmlu": task_summary(run, config)}}
    written = write_report(report, [run], tmp_path, plot=True, log=print)
    png = tmp_path / "lengths_mmlu.png"
    assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_no_png_without_matplotlib_says_so(monkeypatch, tmp_path):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    tiny_task(monkeypatch)
    config = EvalConfig()
    prepared = prepare_task("mmlu", config, FakeTokenizer())
    run = run_task(prepared, list(range(6)), config, FakeBackend(), FakeTokenizer())
    report = {"backend": "fake", "command": "c", "config": {"max_context": 4096}, "selection": "all",
              "tasks": {"mmlu": task_summary(run, config)}}
    notices = []
    written = write_report(report, [run], tmp_path, plot=True, log=notices.append)
    assert not list(tmp_path.glob("*.png")) and len(written) == 3
    assert notices == ["matplotlib is not installed: no PNG histograms (the text ones are in summary.txt)"]
