"""The shipped evaluation data: MMLU's counts, GPQA decrypted in memory with reproducible choice order.

GPQA's authors ask that its questions never appear in plain text: these tests compare hashes of texts,
never the texts, so a failure cannot print a question either.
"""
import collections
import hashlib
import json
import os
import zipfile

from tinyvllm.evaluation.tasks import (DATA_DIR, GPQA_MEMBER, GPQA_PASSWORD, gpqa_choice_order, load_gpqa_diamond,
                                       load_mmlu, mmlu_dev_by_subject)

GPQA_JSONL_SHA256 = "754adda8db3564d7dbb93e3f3e121abc49be0e03b1abd8afe39e68bd4172f4ab"  # data/gpqa/README.md


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_mmlu_is_complete():
    test, dev = load_mmlu("test"), mmlu_dev_by_subject()
    assert len(test) == 14042 and len({q.id for q in test}) == 14042
    assert len(dev) == 57 and all(len(shots) == 5 for shots in dev.values())
    counts = collections.Counter(q.subject for q in test)
    assert counts["professional_law"] == 1534 and counts["abstract_algebra"] == 100
    answers = collections.Counter(q.answer_letter for q in test)
    assert answers == {"A": 3222, "B": 3462, "C": 3582, "D": 3776}


def test_gpqa_decrypts_in_memory_with_reproducible_shuffle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = zipfile.ZipFile(DATA_DIR / "gpqa" / "gpqa_diamond.zip").read(GPQA_MEMBER, pwd=GPQA_PASSWORD)
    assert hashlib.sha256(raw).hexdigest() == GPQA_JSONL_SHA256
    rows = {row["id"]: row for row in map(json.loads, raw.decode().splitlines())}
    first, again = load_gpqa_diamond(), load_gpqa_diamond()
    assert len(first) == 198 and first == again
    assert collections.Counter(q.subject for q in first) == {"Chemistry": 93, "Physics": 86, "Biology": 19}
    for q in first:
        row = rows[q.id]
        order = gpqa_choice_order(q.id)
        assert sorted(order) == [0, 1, 2, 3] and order == gpqa_choice_order(q.id)
        given = [row["correct_answer"], *row["incorrect_answers"]]
        assert [digest(c) for c in q.choices] == [digest(given[i]) for i in order]
        assert digest(q.choices[q.answer]) == digest(row["correct_answer"])
        assert digest(q.question) not in repr(q) and q.question not in repr(q), "repr must hide the text"
    # the shuffle spreads the correct answer over all four letters (198 questions: each letter >= 30 times)
    assert min(collections.Counter(q.answer for q in first).values()) >= 30
    assert os.listdir(tmp_path) == [], "nothing decrypted is written"
