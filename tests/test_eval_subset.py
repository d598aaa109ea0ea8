"""Subsets: reproducible, proportional per subject within rounding, spread over prompt lengths."""
import collections
import json

import pytest

from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.subset import allocate, read_subset, select_subset, stratified_sample


def population(rng):
    sizes = {"law": 153, "math": 100, "bio": 31, "art": 7, "tiny": 1}
    subjects = [s for s, n in sizes.items() for _ in range(n)]
    rng.shuffle(subjects)
    lengths = [int(x) for x in rng.integers(20, 2000, len(subjects))]
    return subjects, lengths, sizes


@pytest.mark.parametrize("n", [1, 5, 17, 50, 200, 291, 292])
def test_stratified_sample_is_proportional_and_reproducible(rng, n):
    subjects, lengths, sizes = population(rng)
    chosen = stratified_sample(subjects, lengths, n, seed=3)
    assert chosen == stratified_sample(subjects, lengths, n, seed=3)
    assert len(chosen) == min(n, len(subjects)) == len(set(chosen)) and chosen == sorted(chosen)
    counts = collections.Counter(subjects[i] for i in chosen)
    total = len(subjects)
    for subject, size in sizes.items():
        assert abs(counts[subject] - min(n, total) * size / total) < 1, (subject, counts[subject])


def test_another_seed_gives_another_sample(rng):
    subjects, lengths, _ = population(rng)
    assert stratified_sample(subjects, lengths, 40, seed=0) != stratified_sample(subjects, lengths, 40, seed=1)


def test_sample_follows_the_length_distribution(rng):
    # within each subject one pick per equal slice of the length-sorted list: the subset's quartiles of
    # length stay near the full set's
    subjects = ["only"] * 1000
    lengths = [int(x) for x in rng.lognormal(5, 1, 1000)]
    chosen = stratified_sample(subjects, lengths, 40, seed=0)
    ordered = sorted(lengths)
    ranks = sorted(ordered.index(lengths[i]) for i in chosen)
    for j, rank in enumerate(ranks):  # the j-th pick lies in the j-th slice of 25 (ties aside)
        assert 25 * j - 25 <= rank < 25 * (j + 1) + 25


def test_allocate_largest_remainder():
    assert allocate({"a": 50, "b": 30, "c": 20}, 10) == {"a": 5, "b": 3, "c": 2}
    assert allocate({"a": 2, "b": 1}, 2) == {"a": 1, "b": 1}  # quotas 1.33, 0.67: the remainder goes to b
    ties = allocate({"a": 10, "b": 10, "c": 10}, 1, seed=0)
    assert sum(ties.values()) == 1 and ties == allocate({"a": 10, "b": 10, "c": 10}, 1, seed=0)


def test_subset_file_and_results_json(tmp_path):
    ids = {"mmlu": ["x/0", "x/1", "y/0"], "gpqa_diamond": ["recA", "recB"]}
    listing = tmp_path / "ids.txt"
    listing.write_text("# picked\ny/0\nmmlu:x/1\nrecB\ngpqa_diamond:recA\n")
    assert select_subset(read_subset(listing), ids, "ids.txt") == {"mmlu": [1, 2], "gpqa_diamond": [0, 1]}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"items": [{"task": "mmlu", "id": "x/0"}, {"task": "gpqa_diamond", "id": "recB"}]}))
    assert select_subset(read_subset(results), {"mmlu": ids["mmlu"]}, "r") == {"mmlu": [0]}
    listing.write_text("x/0\nnope/3\n")
    with pytest.raises(TinyVLLMError, match=r"1 id\(s\) name no question.*nope/3"):
        select_subset(read_subset(listing), ids, "ids.txt")
