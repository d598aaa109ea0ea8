"""The evaluation sets: MMLU (test + dev, MIT) and GPQA diamond (CC BY 4.0), read from the package data.

Every question becomes a `Question` with its choices in the order they are shown and `answer` the index of
the correct one. GPQA ships inside its authors' password-protected zip and is decrypted in memory only;
its choices (correct answer first in the file) are shuffled with a seed derived from the question's Record
ID, so a question gets the same order in every run and in every subset. `Question`'s repr leaves out the
question and choice texts, so a log line or a failing assert never shows a GPQA question in plain text.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tinyvllm.errors import TinyVLLMError

DATA_DIR = Path(__file__).parent / "data"
LETTERS = "ABCD"
GPQA_PASSWORD = b"deserted-untie-orchid"   # published by the authors with the data; it keeps crawlers out
GPQA_MEMBER = "gpqa_diamond.jsonl"
GPQA_SHUFFLE_SEED = "tinyvllm-gpqa-v1"      # with the Record ID: each question's choice order
GPQA_ORDERS = ("tinyvllm", "lm-eval")     # how GPQA shows its choices: gpqa_choice_order, lm_eval_choice_orders


@dataclass(frozen=True)
class Question:
    task: str                    # "mmlu" | "gpqa_diamond"
    id: str                      # stable across runs: "<subject>/<row in subject>" or GPQA's Record ID
    subject: str                 # MMLU subject, GPQA high-level domain
    question: str = field(repr=False)
    choices: tuple[str, ...] = field(repr=False)
    answer: int = field(repr=False)  # index into choices

    @property
    def answer_letter(self) -> str:
        return LETTERS[self.answer]


def load_mmlu(split: str = "test", data_dir: Path | None = None) -> list[Question]:
    """MMLU's `test` (14,042) or `dev` (285, five per subject) split, in file order."""
    path = (data_dir or DATA_DIR / "mmlu") / f"{split}.jsonl.gz"
    rows = _read_jsonl_gz(path)
    questions, seen = [], {}
    for n, row in enumerate(rows, 1):
        try:
            subject, choices, answer = row["subject"], tuple(row["choices"]), LETTERS.index(row["answer"])
            question = row["question"]
        except (KeyError, TypeError, ValueError) as e:
            raise TinyVLLMError(f"{path}:{n}: expected subject, question, 4 choices and answer A-D ({e})") from e
        if len(choices) != 4:
            raise TinyVLLMError(f"{path}:{n}: expected 4 choices, got {len(choices)}")
        index = seen[subject] = seen.get(subject, -1) + 1
        questions.append(Question("mmlu", f"{subject}/{index}", subject, question, choices, answer))
    return questions


def mmlu_dev_by_subject(data_dir: Path | None = None) -> dict[str, list[Question]]:
    """The dev split grouped by subject, in file order: the few-shot examples (lm-eval's first_n sampler)."""
    by_subject: dict[str, list[Question]] = {}
    for q in load_mmlu("dev", data_dir):
        by_subject.setdefault(q.subject, []).append(q)
    return by_subject


def load_gpqa_diamond(data_dir: Path | None = None, order: str = "tinyvllm") -> list[Question]:
    """The 198 GPQA-diamond questions, decrypted in memory, in the file's row order; the choices shuffled per
    Record ID (order "tinyvllm": gpqa_choice_order), or as lm-evaluation-harness's gpqa_diamond_zeroshot shows
    them (order "lm-eval": lm_eval_choice_orders), so per-question results line up with published lm-eval runs."""
    if order not in GPQA_ORDERS:
        raise TinyVLLMError(f"--gpqa-order must be one of {', '.join(GPQA_ORDERS)}, got {order!r}")
    path = (data_dir or DATA_DIR / "gpqa") / "gpqa_diamond.zip"
    try:
        with zipfile.ZipFile(path) as archive:
            raw = archive.read(GPQA_MEMBER, pwd=GPQA_PASSWORD)
    except (OSError, KeyError, RuntimeError, zipfile.BadZipFile) as e:
        raise TinyVLLMError(f"cannot read {GPQA_MEMBER} from {path}: {e}") from e
    questions = []
    lines = raw.decode("utf-8").splitlines()
    lm_eval_orders = lm_eval_choice_orders(len(lines)) if order == "lm-eval" else None
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            record_id, domain = row["id"], row["domain"]
            correct, incorrect = row["correct_answer"], list(row["incorrect_answers"])
            text = row["question"]
        except (ValueError, KeyError, TypeError) as e:  # the message names the line, never its text
            raise TinyVLLMError(f"{path}!{GPQA_MEMBER}:{n}: malformed row ({type(e).__name__})") from None
        shown = gpqa_choice_order(record_id) if lm_eval_orders is None else lm_eval_orders[n - 1]
        given = [correct, *incorrect]
        questions.append(Question("gpqa_diamond", record_id, domain, text,
                                  tuple(given[i] for i in shown), shown.index(0)))
    return questions


def gpqa_choice_order(record_id: str) -> list[int]:
    """The shown order of [correct, incorrect 1..3] for one question: the four sorted by a sha256 of the
    seed, the Record ID and their index, so the permutation is uniform and the same in every process, on
    every machine and in every Python version (random.Random's algorithms may change between versions)."""
    def key(i: int) -> bytes:
        return hashlib.sha256(f"{GPQA_SHUFFLE_SEED}:{record_id}:{i}".encode()).digest()
    return sorted(range(4), key=key)


def lm_eval_choice_orders(num_rows: int) -> list[list[int]]:
    """The shown order of [correct, incorrect 1..3] for each of num_rows questions, as lm-evaluation-harness's
    gpqa_diamond_zeroshot builds it: after random.seed(0), one random.shuffle of [incorrect 1, incorrect 2,
    incorrect 3, correct] per row, in the dataset's row order. (A shuffle's draws do not depend on what it shuffles,
    so shuffling the indices [1, 2, 3, 0] gives lm-eval's permutation.)"""
    rng = random.Random(0)  # random.seed(0) seeds the module's Random instance the same way
    orders = []
    for _ in range(num_rows):
        shown = [1, 2, 3, 0]
        rng.shuffle(shown)
        orders.append(shown)
    return orders


def _read_jsonl_gz(path: Path) -> list[dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise TinyVLLMError(f"cannot read {path}: {e}") from e


TASKS = {"mmlu": load_mmlu, "gpqa_diamond": load_gpqa_diamond}
