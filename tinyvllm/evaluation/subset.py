"""Reproducible subsets, stratified by subject and by prompt length.

`--limit N` takes N questions of a task: each subject gets its proportional share of N (largest remainder:
the floors of N * size / total, then one more for the largest remainders, ties broken by a seeded order), so
per-subject counts are within rounding of proportional; within a subject the questions are sorted by prompt
token length and picked systematically (one from each of n equal slices of the sorted list, at a seeded
offset), so the subset's length distribution follows the full set's. Same seed and same lengths: same
subset. Which subjects get a share depends on the subject sizes alone (`sampled_subjects`), so only their
questions need a prompt length. `--subset FILE` names the questions instead (ids one per line, or an earlier
run's results.json), e.g. to put a model with another tokenizer on exactly the same questions.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.tasks import TASKS


def allocate(sizes: dict[str, int], n: int, seed: int = 0) -> dict[str, int]:
    """Split n over strata proportionally to their sizes (Hamilton's largest-remainder method)."""
    total = sum(sizes.values())
    assert 0 <= n <= total, (n, total)
    quotas = {key: n * size / total for key, size in sizes.items()}
    counts = {key: math.floor(q) for key, q in quotas.items()}
    left = n - sum(counts.values())
    by_remainder = sorted(sizes, key=lambda key: (-(quotas[key] - counts[key]), _seeded_key(seed, key)))
    for key in by_remainder[:left]:
        counts[key] += 1
    return counts


def stratified_sample(subjects: list[str], lengths: list[int | None], n: int, seed: int = 0) -> list[int]:
    """Indices (ascending) of n items stratified by subject and, within each subject, by length. Only the
    lengths of `sampled_subjects(subjects, n, seed)` are read; the others may be None."""
    assert len(subjects) == len(lengths)
    if n >= len(subjects):
        return list(range(len(subjects)))
    members = _members(subjects)
    counts = allocate({s: len(m) for s, m in members.items()}, n, seed)
    chosen = []
    for subject, indices in members.items():
        k = counts[subject]
        if k == 0:
            continue
        assert all(lengths[i] is not None for i in indices), f"{subject}: the sample needs every length"
        ordered = sorted(indices, key=lambda i: (lengths[i], i))
        step = len(ordered) / k
        offset = np.random.default_rng(int.from_bytes(_seeded_key(seed, subject)[:8], "little")).random()
        chosen += [ordered[min(int((j + offset) * step), len(ordered) - 1)] for j in range(k)]
    assert len(chosen) == n and len(set(chosen)) == n
    return sorted(chosen)


def sampled_subjects(subjects: list[str], n: int, seed: int = 0) -> set[str]:
    """The subjects `stratified_sample` draws n items from (their allocation is not zero): the only ones whose
    lengths it needs, so a caller can measure those alone."""
    if n >= len(subjects):
        return set(subjects)
    counts = allocate({s: len(m) for s, m in _members(subjects).items()}, n, seed)
    return {subject for subject, k in counts.items() if k}


def _members(subjects: list[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = {}
    for i, subject in enumerate(subjects):
        members.setdefault(subject, []).append(i)
    return members


def _seeded_key(seed: int, key: str) -> bytes:
    return hashlib.sha256(f"{seed}:{key}".encode()).digest()


def read_subset(path: str | Path) -> list[str]:
    """Question ids from a file: one per line, bare (`abstract_algebra/3`) or with its task
    (`mmlu:abstract_algebra/3`), # comments allowed; or an earlier run's results.json (its items)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TinyVLLMError(f"cannot read subset file {path}: {e.strerror}") from e
    if path.suffix == ".json":
        try:
            return [f"{item['task']}:{item['id']}" for item in json.loads(text)["items"]]
        except (ValueError, KeyError, TypeError) as e:
            raise TinyVLLMError(f"{path}: expected a tinyvllm eval results.json with items[].task/.id ({e})") from e
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def select_subset(entries: list[str], ids_by_task: dict[str, list[str]], source: str) -> dict[str, list[int]]:
    """For each task, the indices (ascending) of the questions `entries` name; an entry that names no
    question of the tasks being run is an error naming it."""
    chosen: dict[str, set[int]] = {task: set() for task in ids_by_task}
    positions = {task: {id_: i for i, id_ in enumerate(ids)} for task, ids in ids_by_task.items()}
    unknown = []
    for entry in entries:
        task, _, id_ = entry.partition(":") if entry.split(":", 1)[0] in TASKS else (None, "", entry)
        if task and task not in ids_by_task:
            continue  # a question of a task this run leaves out
        hits = [(t, positions[t][id_]) for t in ([task] if task else ids_by_task) if id_ in positions[t]]
        if not hits:
            unknown.append(entry)
        for t, i in hits:
            chosen[t].add(i)
    if unknown:
        raise TinyVLLMError(f"{source}: {len(unknown)} id(s) name no question of {', '.join(ids_by_task)}, "
                            f"e.g. {unknown[:3]}")
    return {task: sorted(indices) for task, indices in chosen.items()}
