"""Item 6: the local lm-evaluation-harness task that scripts/lm_eval_check.py writes renders exactly
tinyvllm eval's prompts; the full check (lm_eval against `tinyvllm serve`) runs where both exist."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

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
def test_lm_eval_through_tinyvllm_serve_agrees(tmp_path):
    from lm_eval_check import main
    from tinyvllm.demo import DEMO_MODEL_DIR
    assert main(["--model", str(DEMO_MODEL_DIR), "--limit", "8", "--seed", "3", "--max-context", "140",
                 "--serve-args", "--num-blocks 64", "--out", str(tmp_path)]) == 0
