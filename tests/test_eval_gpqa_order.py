"""--gpqa-order lm-eval shows GPQA's choices as lm-evaluation-harness's gpqa_diamond_zeroshot does: checked against
lm-eval's own process_docs (its tasks/gpqa/zeroshot/utils.py) run over the same rows after random.seed(0)."""
import importlib.util
import json
import random
import zipfile
from pathlib import Path

import pytest

from tests.references import require
from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.runner import EvalConfig
from tinyvllm.evaluation.tasks import DATA_DIR, GPQA_MEMBER, GPQA_PASSWORD, load_gpqa_diamond


def lm_eval_gpqa_utils():
    lm_eval = require("lm_eval")
    require("datasets")
    path = Path(lm_eval.__file__).parent / "tasks" / "gpqa" / "zeroshot" / "utils.py"
    spec = importlib.util.spec_from_file_location("lm_eval_gpqa_zeroshot_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lm_eval_order_matches_lm_evals_process_docs():
    utils = lm_eval_gpqa_utils()
    import datasets
    raw = zipfile.ZipFile(DATA_DIR / "gpqa" / "gpqa_diamond.zip").read(GPQA_MEMBER, pwd=GPQA_PASSWORD)
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    dataset = datasets.Dataset.from_list([
        {"Question": r["question"], "Correct Answer": r["correct_answer"],
         **{f"Incorrect Answer {i + 1}": a for i, a in enumerate(r["incorrect_answers"])}} for r in rows])
    random.seed(0)  # what lm-eval's evaluator does before it builds the task
    theirs = utils.process_docs(dataset)

    ours = load_gpqa_diamond(order="lm-eval")
    assert len(ours) == len(theirs) == 198
    for q, doc in zip(ours, theirs):
        assert [utils.preprocess(c) for c in q.choices] == [doc[f"choice{i}"] for i in range(1, 5)], q.id
        assert f"({'ABCD'[q.answer]})" == doc["answer"], q.id


def test_the_default_order_is_unchanged_and_differs_from_lm_evals():
    default, lm_eval = load_gpqa_diamond(), load_gpqa_diamond(order="lm-eval")
    assert [q.id for q in default] == [q.id for q in lm_eval]
    assert load_gpqa_diamond(order="tinyvllm") == default
    for d, e in zip(default, lm_eval):  # the same four answers and the same correct one, shown in another order
        assert sorted(d.choices) == sorted(e.choices) and d.choices[d.answer] == e.choices[e.answer]
    assert sum(d.choices != e.choices for d, e in zip(default, lm_eval)) > 100


def test_an_unknown_order_is_refused():
    with pytest.raises(TinyVLLMError, match="--gpqa-order"):
        EvalConfig(gpqa_order="shuffled")
    with pytest.raises(TinyVLLMError, match="--gpqa-order"):
        load_gpqa_diamond(order="shuffled")
