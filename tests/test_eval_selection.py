"""`--limit` and `--subset` tokenize only the questions the selection reads, and select what they selected when
every MMLU prompt was tokenized first: the reference below measures all 14,042 prompts and samples from them."""
import gzip
import json

import pytest

from tinyvllm.evaluation.prompts import chat_messages, loglikelihood_prompt
from tinyvllm.evaluation.runner import EvalConfig, prepare_task, select
from tinyvllm.evaluation.subset import read_subset, select_subset, stratified_sample
from tinyvllm.evaluation.tasks import DATA_DIR, load_mmlu, mmlu_dev_by_subject

NUM_MMLU = 14042


class WordTokenizer:
    """A token per whitespace-separated word (id: its length), BOS 1; counts the prompts it encodes."""
    def __init__(self):
        self.encoded = 0

    def encode(self, text, add_special_tokens=True):
        self.encoded += 1
        return ([1] if add_special_tokens else []) + [len(word) for word in text.split()]

    def apply_chat_template(self, messages):
        return "".join(f"<{m['role']}> {m['content']} " for m in messages) + "<assistant> "


def raw_mmlu_ids_and_subjects() -> tuple[list[str], list[str]]:
    """Ids ("<subject>/<row in subject>") and subjects straight from the shipped file, in its order."""
    with gzip.open(DATA_DIR / "mmlu" / "test.jsonl.gz", "rt", encoding="utf-8") as f:
        subjects = [json.loads(line)["subject"] for line in f if line.strip()]
    rows_seen: dict[str, int] = {}
    ids = []
    for subject in subjects:
        rows_seen[subject] = rows_seen.get(subject, -1) + 1
        ids.append(f"{subject}/{rows_seen[subject]}")
    return ids, subjects


def every_prompt_ids(config: EvalConfig) -> list[list[int]]:
    """All 14,042 prompts tokenized, as the run did before it measured only what the selection reads."""
    tokenizer, dev = WordTokenizer(), mmlu_dev_by_subject()
    out = []
    for q in load_mmlu():
        shots = dev[q.subject][:config.num_fewshot]
        if config.mode == "loglikelihood":
            out.append(tokenizer.encode(loglikelihood_prompt(q, shots)[0], config.add_special_tokens))
        else:
            text = tokenizer.apply_chat_template(chat_messages(q, shots)) + config.answer_prefix
            out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


@pytest.mark.parametrize("limit, seed, num_fewshot, mode", [
    (8, 0, 0, "loglikelihood"), (8, 3, 0, "loglikelihood"), (20, 1, 5, "loglikelihood"), (20, 2, 1, "generative")])
def test_limit_selects_as_from_every_prompt_and_tokenizes_only_the_sampled_subjects(limit, seed, num_fewshot, mode):
    config = EvalConfig(limit=limit, seed=seed, num_fewshot=num_fewshot, mode=mode)
    ids, subjects = raw_mmlu_ids_and_subjects()
    assert len(ids) == NUM_MMLU
    all_prompts = every_prompt_ids(config)
    expected = stratified_sample(subjects, [len(p) for p in all_prompts], limit, seed)

    tokenizer = WordTokenizer()
    prepared = prepare_task("mmlu", config, tokenizer)
    selected = select([prepared], config)["mmlu"]
    assert [prepared.questions[i].id for i in selected] == [ids[i] for i in expected]
    assert [prepared.prompt_ids[i] for i in selected] == [all_prompts[i] for i in expected]  # scored the same
    in_sampled_subjects = sum(s in {subjects[i] for i in expected} for s in subjects)
    assert tokenizer.encoded == in_sampled_subjects < NUM_MMLU


def test_subset_tokenizes_only_the_named_questions(tmp_path):
    listing = tmp_path / "subset.txt"
    listing.write_text("mmlu:anatomy/3\nvirology/0\ngpqa_diamond:recXYZ\n")  # the GPQA one: not this run's task
    ids, _ = raw_mmlu_ids_and_subjects()
    config = EvalConfig(subset=str(listing))
    tokenizer = WordTokenizer()
    prepared = prepare_task("mmlu", config, tokenizer)
    selected = select([prepared], config)["mmlu"]
    assert selected == select_subset(read_subset(listing), {"mmlu": ids}, str(listing))["mmlu"]
    assert sorted(prepared.questions[i].id for i in selected) == ["anatomy/3", "virology/0"]
    assert tokenizer.encoded == 2
