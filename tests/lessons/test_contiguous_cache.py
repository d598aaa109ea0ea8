"""lessons/contiguous_cache.py: write_kv and attention over a contiguous cache against their numpy twins, poisoned
entries that nobody should read included."""
import numpy as np
import pytest

from lessons.contiguous_cache import attention, attention_ref, write_kv, write_kv_ref
from kernels_numba.common import cuda
from tests.helpers import poisoned

MAX_SEQS, MAX_SEQ_LEN = 5, 9
SEQ_SLOTS = [3, 0, 4]    # non-contiguous; slots 1 and 2 stay poisoned throughout
SEQ_LENGTHS = [5, 8, 1]  # different lengths, one a single-token sequence
UNIT_ROUNDOFF = 2.0**-24
HUGE_KEY = np.float32(1e30)  # if ever read, its score swamps every real key and the NaN value behind it wins
LOG_F32_MAX = np.log(np.finfo(np.float32).max)  # ~88.7: exp of a score above this overflows float32

HEAD_LAYOUTS = [  # (n_heads, n_kv_heads, head_dim): GQA ratios 1, 2, 3, 3; head dims 12 and 16
    (2, 2, 12), (4, 2, 16), (6, 2, 12), (3, 1, 16)]


def _poisoned_caches(n_kv_heads, head_dim):
    """Host caches where every entry not written by a test reads as a huge key and a NaN value."""
    shape = (MAX_SEQS, MAX_SEQ_LEN, n_kv_heads, head_dim)
    return np.full(shape, HUGE_KEY, np.float32), np.full(shape, np.nan, np.float32)


def _step(rng, n_heads, n_kv_heads, head_dim, mode):
    """Host inputs for one forward step.

    prefill: every position of every prompt is a query (in shuffled order: tokens are independent), the
    cache is empty. decode: the cache already holds positions 0..L-2, and each sequence brings one token at L-1.
    """
    k_cache, v_cache = _poisoned_caches(n_kv_heads, head_dim)
    slots, positions = [], []
    for slot, length in zip(SEQ_SLOTS, SEQ_LENGTHS):
        first_new = 0 if mode == "prefill" else length - 1
        k_cache[slot, :first_new] = rng.standard_normal((first_new, n_kv_heads, head_dim))
        v_cache[slot, :first_new] = rng.standard_normal((first_new, n_kv_heads, head_dim))
        slots += [slot] * (length - first_new)
        positions += list(range(first_new, length))
    order = rng.permutation(len(slots))
    seq_slots = np.array(slots, np.int32)[order]
    positions = np.array(positions, np.int32)[order]
    num_tokens = len(seq_slots)
    q = rng.standard_normal((num_tokens, n_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((num_tokens, n_kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((num_tokens, n_kv_heads, head_dim)).astype(np.float32)
    return q, k, v, k_cache, v_cache, seq_slots, positions


def _run(q, k, v, k_cache, v_cache, seq_slots, positions, scale):
    """write_kv then attention on the device; returns the caches and the output on the host."""
    d_k_cache, d_v_cache = cuda.to_device(k_cache), cuda.to_device(v_cache)
    d_slots, d_positions = cuda.to_device(seq_slots), cuda.to_device(positions)
    write_kv(cuda.to_device(k), cuda.to_device(v), d_k_cache, d_v_cache, d_slots, d_positions)
    out = poisoned(q.shape, np.float32)
    got = attention(cuda.to_device(q), d_k_cache, d_v_cache, d_slots, d_positions, scale, out=out)
    assert got is out
    return d_k_cache.copy_to_host(), d_v_cache.copy_to_host(), out.copy_to_host()


def _tolerance(q, k_cache, v_cache, seq_slots, positions, scale):
    """Per-(token, head) bound on |kernel - float64 reference|, from the float32 error sources.

    Each float32 score (q*scale rounded, then a head_dim dot) is off by at most
    E_j = gamma_{hd+1} * scale * sum_d |q_d k_jd|. Shifting every score by at most E moves each normalised
    softmax weight by a factor within exp(+-2E), so the output moves by at most expm1(2E) * max|v|.
    The float32 exps, rescales and the two running sums (l and the accumulator) over p+1 keys add a
    relative error of a few ulps per key: (2(p+1) + 10) * 4u * max|v| covers them with room (4u allows
    for a 2-ulp expf on the GPU). Scores of O(1) give ~1e-5; scores of O(1000) give ~1e-3.
    """
    num_tokens, n_heads, head_dim = q.shape
    group = n_heads // k_cache.shape[2]
    terms = head_dim + 1
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    tol = np.empty((num_tokens, n_heads, 1))
    for t in range(num_tokens):
        keys = np.abs(k_cache[seq_slots[t], : positions[t] + 1].astype(np.float64))
        values = np.abs(v_cache[seq_slots[t], : positions[t] + 1].astype(np.float64))
        for h in range(n_heads):
            score_err = gamma * scale * (keys[:, h // group] @ np.abs(q[t, h].astype(np.float64))).max()
            tail = (2 * (positions[t] + 1) + 10) * 4 * UNIT_ROUNDOFF
            tol[t, h] = (np.expm1(2 * score_err) + tail) * values[:, h // group].max()
    return tol


def _check(rng, n_heads, n_kv_heads, head_dim, mode, q_gain=1.0, score_offset=0.0):
    """Run one step and compare to the reference. q_gain stretches the gaps between scores;
    score_offset adds the same constant to every score (softmax ignores it, a naive exp does not)."""
    q, k, v, k_cache, v_cache, seq_slots, positions = _step(rng, n_heads, n_kv_heads, head_dim, mode)
    scale = 1.0 / np.sqrt(head_dim)
    q *= np.float32(q_gain)
    if score_offset:
        k[..., 0] = 1.0
        k_cache[..., 0][k_cache[..., 0] != HUGE_KEY] = 1.0  # real keys only: poison stays poison
        q[..., 0] = score_offset / scale
    got_k_cache, got_v_cache, got = _run(q, k, v, k_cache, v_cache, seq_slots, positions, scale)

    want_k_cache, want_v_cache = write_kv_ref(k, v, k_cache, v_cache, seq_slots, positions)
    # write_kv copies floats: bit-exact, and every entry it should not touch keeps its poison (NaN == NaN here).
    np.testing.assert_array_equal(got_k_cache, want_k_cache)
    np.testing.assert_array_equal(got_v_cache, want_v_cache)

    want = attention_ref(q, want_k_cache, want_v_cache, seq_slots, positions, scale)
    assert np.isfinite(want).all(), "the reference itself read past a query's position"
    assert np.isfinite(got).all(), "attention read a poisoned cache entry or overflowed"
    err = np.abs(got.astype(np.float64) - want)
    tol = _tolerance(q, want_k_cache, want_v_cache, seq_slots, positions, scale)
    assert (err <= tol).all(), f"max err {err.max()}, worst err/tol {(err / tol).max()}"
    return q, want_k_cache, seq_slots, positions, scale


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("n_heads, n_kv_heads, head_dim", HEAD_LAYOUTS)
def test_attention_matches_ref(rng, n_heads, n_kv_heads, head_dim, mode):
    _check(rng, n_heads, n_kv_heads, head_dim, mode)


def _scores(q, k_cache, seq_slots, positions, scale):
    group = q.shape[1] // k_cache.shape[2]
    return [k_cache[seq_slots[t], : positions[t] + 1, h // group] @ q[t, h] * scale
            for t in range(q.shape[0]) for h in range(q.shape[1])]


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_attention_is_stable_with_huge_score_gaps(rng, mode):
    # Scores spread over +-1000s: the running max must rise and rescale, and exp(m_old - m_new) underflows to 0.
    q, k_cache, seq_slots, positions, scale = _check(rng, 6, 2, 16, mode, q_gain=300.0)
    largest = max(np.abs(s).max() for s in _scores(q, k_cache, seq_slots, positions, scale))
    assert largest > 2 * LOG_F32_MAX, "scores too small to prove anything about overflow"


@pytest.mark.parametrize("score_offset", [600.0, -600.0])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_attention_is_stable_when_every_naive_exp_overflows_or_underflows(rng, mode, score_offset):
    # Every score is 600 +- O(1) (or -600 +- O(1)): exp(score) is inf (or 0, so 0/0) for all keys in float32,
    # yet the softmax weights are well mixed, so the result must still match the reference closely.
    q, k_cache, seq_slots, positions, scale = _check(rng, 6, 2, 16, mode, score_offset=score_offset)
    smallest = min(np.abs(s).min() for s in _scores(q, k_cache, seq_slots, positions, scale))
    assert smallest > LOG_F32_MAX + np.log(MAX_SEQ_LEN), "some naive exp would still be finite and nonzero"


def test_attention_rejects_head_dim_beyond_local_accumulator():
    q = cuda.to_device(np.ones((1, 1, 264), np.float32))
    cache = cuda.to_device(np.ones((1, 1, 1, 264), np.float32))
    slots = cuda.to_device(np.zeros(1, np.int32))
    with pytest.raises(AssertionError):
        attention(q, cache, cache, slots, slots, 1.0)
