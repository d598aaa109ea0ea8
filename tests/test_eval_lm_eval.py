"""Item 6: the local lm-evaluation-harness task that scripts/lm_eval_check.py writes renders exactly
tinyvllm eval's prompts; the full check (lm_eval against `tinyvllm serve`) runs where both exist."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: lm-eval against a server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from lm_eval_check import TASK, write_lm_eval_task  # noqa: E402

from tinyvllm.evaluation.prompts import mmlu_prompt  # noqa: E402
from tinyvllm.evaluation.tasks import Question, load_mmlu  # noqa: E402


def test_local_task_renders_the_same_prompts(tmp_path):
    yaml = pytest.importorskip("yaml")
    jinja2 = pytest.importorskip("jinja2")
    test = load_mmlu()
    questions = [test[0], test[5000], next(q for q in test if q.question != q.question.strip()),
                 Question("mmlu", "x/0", "high_school_us_history", " Q?\n", (" a ", "b\n", "c", "d"), 3)]
    config = yaml.safe_load(write_lm_eval_task(questions, tmp_path).read_text())
    assert config["task"] == TASK and config["doc_to_choice"] == ["A", "B", "C", "D"]
    rows = [json.loads(line) for line in Path(config["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()]
    env = jinja2.Environment(keep_trailing_newline=True)  # lm-eval's utils.apply_template renders like this
    for q, row in zip(questions, rows):
        text = env.from_string(config["description"]).render(**row) + env.from_string(config["doc_to_text"]).render(**row)
        assert text == mmlu_prompt(q) and row["answer"] == q.answer and row["id"] == q.id


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                    reason="lm-eval is optional, not a reference of the suite (pip install \"lm-eval[api]\")")
def test_lm_eval_through_tinyvllm_serve_agrees(tmp_path, capsys):
    """lm_eval local-completions against `tinyvllm serve` scores the shortest MMLU question (95 prompt
    tokens with the demo tokenizer; in the simulator the echo of every prompt position's logprob is the slow
    part, ~2 minutes) as `tinyvllm eval` does: same answer, same accuracy, each choice's log-likelihood within
    1e-4. scripts/lm_eval_check.py's recorded runs (docs/eval.md) cover more questions."""
    from lm_eval_check import main
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    subset = tmp_path / "subset.txt"
    subset.write_text("mmlu:clinical_knowledge/182\n")
    rc = main(["--model", str(DEMO_MODEL_DIR), "--subset", str(subset), "--max-context", "128",
               "--serve-args", "--num-blocks 64", "--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "lm_eval_check.json").read_text())
    assert rc == 0 and report["passed"], capsys.readouterr().out[-3000:]
    assert report["questions"] == report["scored_by_lm_eval"] == report["counted_by_lm_eval"] == 1
    assert report["accuracy_lm_eval"] == report["accuracy_tinyvllm_eval"]
    assert report["max_score_diff"] <= 1e-4
