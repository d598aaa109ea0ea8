"""lessons/split_keys.py: split-keys decode attention against paged_attention_ref, over test_paged_attention's steps
(shuffled block tables, poisoned pool entries nobody wrote)."""
import numpy as np
import pytest

import lessons.split_keys as split_keys_module
from kernels_numba.common import cdiv, cuda
from lessons.split_keys import paged_attention_split_keys, split_partitions
from tests.test_paged_attention import DECODE_CASES, LAYOUTS, LOG_F32_MAX, _check
from tests.test_smollm2_shapes import HEAD_DIM, HEADS, KV_HEADS

pytestmark = pytest.mark.slow  # a lesson's big simulator kernels


@pytest.mark.parametrize("scenario", ["decode", "chunked"])
def test_stable_with_huge_score_gaps(rng, scenario):
    # Scores spread over +-1000s: the running max must rise and rescale, and exp(m_old - m_new) underflows to 0;
    # in split_keys the rescale of the earlier chunks' sum and accumulators underflows too.
    scores = _check(rng, scenario, 4, 6, 2, 16, q_gain=300.0, kernel=paged_attention_split_keys)
    assert max(np.abs(s).max() for s in scores) > 2 * LOG_F32_MAX, "scores too small to prove anything"


@pytest.mark.parametrize("score_offset", [600.0, -600.0])
@pytest.mark.parametrize("scenario", ["decode", "chunked"])
def test_stable_when_every_naive_exp_overflows_or_underflows(rng, scenario, score_offset):
    # Every score is 600 +- O(1) (or -600 +- O(1)): exp(score) is inf (or 0, so 0/0) for all keys in float32,
    # yet the softmax weights are well mixed, so the result must still match the reference closely.
    scores = _check(rng, scenario, 16, 4, 2, 12, score_offset=score_offset, kernel=paged_attention_split_keys)
    assert min(np.abs(s).min() for s in scores) > LOG_F32_MAX + np.log(64), "some naive exp would be finite"


def test_bf16_pool_matches_ref_on_the_rounded_kv(rng):
    _check(rng, "decode", *LAYOUTS[2], kernel=paged_attention_split_keys, kv_dtype=np.uint16)


@pytest.mark.parametrize("scenario, layout", DECODE_CASES)
def test_split_keys_kernel_matches_ref(rng, scenario, layout):
    _check(rng, scenario, *layout, kernel=paged_attention_split_keys)


@pytest.mark.parametrize("threads", [1, 7, 37])
def test_split_keys_any_thread_count(rng, monkeypatch, threads):
    # 1: one thread does every phase alone; 7: odd, fewer than head_dim (12), so a thread owns several output
    # dims; 37: three key slices of 12 lanes plus an idle thread, and more threads than the longest context
    # (33 keys) and than a chunk, so most threads hold no key. The odd counts exercise the block reductions'
    # uneven folds.
    monkeypatch.setattr(split_keys_module, "SPLIT_THREADS", threads)
    _check(rng, "decode", *LAYOUTS[2], kernel=paged_attention_split_keys)


@pytest.mark.parametrize("partition_below, partition_keys", [(0, 16), (10**6, 4), (10**6, 64)])
def test_split_keys_with_and_without_partitions(rng, monkeypatch, partition_below, partition_keys):
    # (0, _): one block per (query, head) over its whole context; (_, 4): up to 9 partitions of 4 keys per
    # (query, head), most of them past the short contexts (no keys: they must weigh nothing in the combine);
    # (_, 64): partitions of 64 keys cover the whole (short) block table: one block per (query, head) again.
    monkeypatch.setattr(split_keys_module, "SPLIT_PARTITION_BELOW_BLOCKS", partition_below)
    monkeypatch.setattr(split_keys_module, "PARTITION_KEYS", partition_keys)
    _check(rng, "decode", *LAYOUTS[2], kernel=paged_attention_split_keys)
    _check(rng, "chunked", *LAYOUTS[1], kernel=paged_attention_split_keys)


def test_split_partitions_only_for_small_batches():
    big_batch = split_keys_module.SPLIT_PARTITION_BELOW_BLOCKS  # queries x 1 head
    assert split_partitions(big_batch, 1, 2048) == 1
    assert split_partitions(1, 32, 2048) == cdiv(2048, split_keys_module.PARTITION_KEYS)
    assert split_partitions(1, 32, 1) == 1


def test_split_keys_long_chunks_and_wide_heads(rng, monkeypatch):
    # head_dim 40 over 5 threads (8 dims each); chunks of 32 keys, so the 33-key context ends in a 1-key chunk
    # (the weights and rows past it keep the previous chunk's values and must not be read).
    monkeypatch.setattr(split_keys_module, "SPLIT_THREADS", 5)
    monkeypatch.setattr(split_keys_module, "SPLIT_KEY_CHUNK", 32)
    monkeypatch.setattr(split_keys_module, "SPLIT_PARTITION_BELOW_BLOCKS", 0)  # one block per (query, head)
    _check(rng, "decode", 4, 2, 1, 40, kernel=paged_attention_split_keys)


def test_rejects_head_dim_beyond_local_accumulator():
    q = cuda.to_device(np.ones((1, 1, 264), np.float32))
    pool = cuda.to_device(np.ones((1, 4, 1, 264), np.float32))
    table = cuda.to_device(np.zeros((1, 1), np.int32))
    ones = cuda.to_device(np.ones(1, np.int32))
    with pytest.raises(AssertionError):
        paged_attention_split_keys(q, pool, pool, table, ones, ones, 1.0)


def test_smollm2_shapes(rng):
    """SmolLM2-135M's attention shapes (tests/test_smollm2_shapes.py): 9 query heads over 3 KV heads, head_dim 64."""
    _check(rng, "decode", 16, HEADS, KV_HEADS, HEAD_DIM, kernel=paged_attention_split_keys)
