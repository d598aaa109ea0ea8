"""`tinyvllm eval` end to end on the demo model (random weights: accuracy is chance, the machinery is what
is tested) and its one-line errors."""
import csv
import json
import math

import pytest

from tinyvllm.cli import main

pytestmark = pytest.mark.slow  # end to end: tinyvllm eval runs on the demo model


def test_eval_mmlu_limit_8_end_to_end(tmp_path, capsys):
    # the demo tokenizer makes MMLU prompts 121-883 tokens long; a 140-token cap keeps the simulator's work to
    # the shortest of the 8 (seed 3: two of them) and reports the others as too long.
    # Independent of the code: 14042 (MMLU's test split), 8 (--limit), and each item's status, derived
    # below from the 140-token cap and the prompt's length under the demo's own tokenizer.json.
    out = tmp_path / "eval"
    rc = main(["eval", "--tasks", "mmlu", "--limit", "8", "--seed", "3", "--max-context", "140",
               "--num-blocks", "64", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads((out / "results.json").read_text())
    s = report["tasks"]["mmlu"]
    items = report["items"]
    assert len(items) == 8 and len({i["subject"] for i in items}) == 8   # 8 subjects: stratified
    fits = _fits_140_tokens([i["id"] for i in items])
    assert 0 < sum(fits.values()) < 8, fits   # the run exercises both the scored and the too-long path
    assert (s["num_questions"], s["num_selected"], s["n"], s["num_too_long"], s["num_errors"]) == (
        14042, 8, sum(fits.values()), 8 - sum(fits.values()), 0)
    assert sorted(i["id"] for i in items if i["status"] == "too_long") == sorted(s["too_long_ids"])
    scored = [i for i in items if i["status"] == "ok"]
    assert {i["id"] for i in scored} == {item_id for item_id, fit in fits.items() if fit}
    for i in scored:
        assert len(i["scores"]) == 4 and all(math.isfinite(x) and x < 0 for x in i["scores"])
        assert i["prediction"] == "ABCD"[max(range(4), key=lambda k: (i["scores"][k], -k))]
        assert i["prompt_tokens"] + 2 <= 140   # " A" is two tokens in the demo vocabulary
    assert s["correct"] == sum(i["correct"] for i in scored)
    assert s["ci95"][0] <= s["accuracy"] <= s["ci95"][1] and s["backend"]["prefix_cache_hit_tokens"] > 0
    # the 8 subjects' questions alone were tokenized: the sample orders each sampled subject by prompt length
    from tinyvllm.evaluation.tasks import TASKS
    in_sampled_subjects = sum(q.subject in {i["subject"] for i in items} for q in TASKS["mmlu"]())
    h = s["length_histograms"]
    assert sum(h["prompt_full"]) == in_sampled_subjects < 14042 and sum(h["prompt_subset"]) == 8
    assert h["prompt_full_label"] == "sampled from"
    assert len(list(csv.DictReader(open(out / "items.csv")))) == 8
    assert "too long 6" in (out / "summary.txt").read_text() and "accuracy" in captured.out
    assert "mmlu (loglikelihood, 0-shot) [" in captured.err          # the progress bar
    assert report["command"].startswith("tinyvllm eval --limit 8 --seed 3 --max-context 140")


def _fits_140_tokens(ids: list[str]) -> dict[str, bool]:
    """Per MMLU question id: whether its 0-shot prompt (with BOS) plus the longest answer continuation fits
    140 tokens, counted with the `tokenizers` library on the demo's tokenizer.json (not tinyvllm's)."""
    from tokenizers import Tokenizer

    from tinyvllm.evaluation.prompts import loglikelihood_prompt
    from tinyvllm.evaluation.tasks import TASKS
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    reference = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    questions = {q.id: q for q in TASKS["mmlu"]()}
    fits = {}
    for item_id in ids:
        text, continuations = loglikelihood_prompt(questions[item_id])
        prompt = reference.encode(text).ids    # BOS + the text, as a served text prompt
        longest = max(len(reference.encode(text + c).ids) - len(prompt) for c in continuations)
        fits[item_id] = len(prompt) + longest <= 140
    return fits


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "mmlu,nope"], "unknown task(s) ['nope']"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--num-fewshot", "6"], "--num-fewshot must be in [0, 5]"),
    (["--base-url", "http://127.0.0.1:9/v1"], "--base-url needs --model DIR"),
])
def test_bad_eval_input_gets_one_clear_line(capsys, argv, message):
    assert main(["eval", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
