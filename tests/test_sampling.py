import math

import numpy as np
import pytest

from kernels_numba.common import cuda
from kernels_numba.common import host_version
from kernels_numba.sampling import argmax, argmax_ref, keep_mask_ref, sample, sample_ref
from kernels_numba import sampling

# The hash and key helpers are device functions; their host versions run the same arithmetic on numpy.
mix32, order_key, stream_key = (host_version(f) for f in (sampling.mix32, sampling.order_key, sampling.stream_key))
from tests.helpers import poisoned
from tests.references import require

VOCAB = 301


def _tricky_rows(rng, vocab=VOCAB):
    """Rows with the cases argmax gets wrong: ties, NaN, +-inf, the max at either end."""
    rows = rng.standard_normal((9, vocab)).astype(np.float32)
    rows[0, [17, 150, vocab - 1]] = 9.0            # tie -> 17
    rows[1, [0, 1]] = 9.0                          # tie at the start -> 0
    rows[2, :] = 0.5                               # all equal -> 0
    rows[3, vocab - 1] = 9.0                       # last index -> vocab - 1
    rows[4, [40, 200]] = np.nan                    # NaN counts as the max -> 40
    rows[4, 10] = np.inf
    rows[5, :] = -np.inf                           # all -inf -> 0
    rows[6, [3, 7]] = np.inf                       # tie of +inf -> 3
    rows[7, vocab - 2] = np.nan                    # lone NaN near the end -> vocab - 2
    rows[8] *= 1e30                                # large magnitudes, nothing special
    return rows


def _expected_fixed(vocab):
    return {0: 17, 1: 0, 2: 0, 3: vocab - 1, 4: 40, 5: 0, 6: 3, 7: vocab - 2}


# Blocks of 1, 64 or 1024 threads (the widest: ~8 s in the simulator on the 2-core CI machine), so a row spans one
# part or dozens (ties and NaNs in different parts); with 1024 the maxima at the end of a row longer than three
# blocks sit with threads 1021 and 1022 of the tree.
@pytest.mark.parametrize("threads, vocab", [(None, VOCAB), (1, VOCAB), (64, VOCAB), (1024, 3 * 1024 - 1)])
def test_argmax_ties_nan_and_inf(rng, threads, vocab):
    logits = _tricky_rows(rng, vocab)
    out = poisoned((len(logits),), np.int32)
    got = argmax(cuda.to_device(logits), out=out, threads=threads).copy_to_host()
    np.testing.assert_array_equal(got, argmax_ref(logits))  # exact: indices
    for row, index in _expected_fixed(vocab).items():
        assert got[row] == index, (row, got[row], index)


def test_argmax_row_shorter_than_block(rng):
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    logits[1, [2, 4]] = 50.0
    got = argmax(cuda.to_device(logits), out=poisoned((3,), np.int32), threads=32).copy_to_host()
    np.testing.assert_array_equal(got, argmax_ref(logits))
    assert got[1] == 2


def test_argmax_matches_torch(rng):
    torch = require("torch")
    logits = _tricky_rows(rng)
    got = argmax(cuda.to_device(logits)).copy_to_host()
    np.testing.assert_array_equal(got, torch.argmax(torch.from_numpy(logits), dim=-1).numpy())


def test_argmax_rejects_non_power_of_two_block(rng):
    with pytest.raises(AssertionError, match="power of two"):
        argmax(cuda.to_device(np.ones((1, 4), np.float32)), threads=48)


# ---- sampling ---------------------------------------------------------------------------------------------
SAMPLE_DTYPES = (np.float32, np.int32, np.float32, np.uint64, np.int32)  # temperature, top_k, top_p, seed, step


def _launch(logits, temperatures, top_ks, top_ps, seeds, steps, threads=None, seed_dtype=np.uint64):
    n_rows = len(logits)
    dtypes = SAMPLE_DTYPES[:3] + (seed_dtype, np.int32)
    params = [cuda.to_device(np.broadcast_to(np.asarray(value, dtype), (n_rows,)).copy())
              for value, dtype in zip((temperatures, top_ks, top_ps, seeds, steps), dtypes)]
    out = poisoned((n_rows,), np.int32)
    return sample(cuda.to_device(np.asarray(logits, np.float32)), *params, out=out, threads=threads).copy_to_host()


def _mixed_rows(rng, vocab):
    """One row per filter combination, with -inf (masked) logits and ties at the top-k threshold."""
    logits = (3 * rng.standard_normal((8, vocab))).astype(np.float32)
    logits[3, rng.choice(vocab, vocab // 3, replace=False)] = -np.inf
    if vocab >= 10:
        order = np.argsort(logits[4])[::-1]
        logits[4, order[5:9]] = logits[4, order[5]]   # 4 values tied at ranks 6..9: top-k 7 keeps all 9
    params = dict(  # greedy, neither, top-k, top-p, top-k with ties, both, k >= V (off), tiny top-p
        temperatures=[0.0, 1.0, 0.7, 1.3, 2.0, 0.9, 1.1, 3.0],
        top_ks=[5, -1, 20, 0, 7, 12, vocab, -1],
        top_ps=[0.5, 1.0, 1.0, 0.8, 1.0, 0.6, 0.9, 1e-6],
        seeds=rng.integers(0, 2**63, 8, dtype=np.uint64),
        steps=rng.integers(0, 1000, 8))
    return logits, params


@pytest.mark.parametrize("vocab, threads", [(301, None), (97, 1), (5, 8)])
def test_sample_matches_ref_exactly(rng, vocab, threads):
    logits, params = _mixed_rows(rng, vocab)
    got = _launch(logits, **params, threads=threads)
    want = sample_ref(logits, **params)
    np.testing.assert_array_equal(got, want)  # exact: same survivors (integer masses), same noise bits
    keep = keep_mask_ref(logits, params["temperatures"], params["top_ks"], params["top_ps"])
    assert keep[np.arange(len(got)), got].all()
    if vocab > 100:  # the filters did filter, so the checks above could fail
        assert (keep.sum(axis=1)[2:6] < vocab // 2).all() and keep[4].sum() == 9, keep.sum(axis=1)
        assert keep[7].sum() == 1 and got[7] == argmax_ref(logits)[7]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's x / T, on purpose
def test_greedy_and_non_finite_rows_give_argmax(rng):
    logits = _tricky_rows(rng)
    n_rows = len(logits)
    got = _launch(logits, 0.0, 5, 0.5, 7, 3)
    np.testing.assert_array_equal(got, argmax_ref(logits))  # temperature 0: argmax's answer, ties and NaN too
    # A scaled max that is not finite (NaN, +inf, all -inf, or x / T overflowing) is sampling's T -> 0 limit
    rows = [4, 5, 6, 7, 8]
    temperatures = [1.0, 1.0, 1.0, 1.0, 1e-10]   # row 8 holds ~1e30: / 1e-10 overflows to inf
    got = _launch(logits[rows], temperatures, -1, 1.0, np.arange(5), 0)
    fixed = _expected_fixed(VOCAB)
    row_8 = logits[8].tolist()  # finite: the first index of the max, in plain Python
    want = [fixed[4], fixed[5], fixed[6], fixed[7], row_8.index(max(row_8))]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sample_ref(logits[rows], temperatures, -1, 1.0, np.arange(5), 0), want)
    assert n_rows == 9


# ---- the noise against its specification, in plain Python --------------------------------------------
# Written from the docstrings (module, stream_key, noise_bits, open_uniform), not from the helpers' code:
#   mix32 = lowbias32 [16 21f0aaad 15 735a2d97 15] (C. Wellons' hash-prospector, its issue 19's constants)
#   key(salt) = mix32 chained over (salt, seed's low 32 bits, seed's high 32 bits, step):
#               mix32(mix32(mix32(mix32(salt) ^ seed_lo) ^ seed_hi) ^ step)
#   bits_i = mix32(mix32(i ^ key(salt_a)) ^ key(salt_b));  u_i = (bits_i + 1/2) / 2^32
#   g_i = float32(-log(-log(u_i))) in float64;  draw = the lowest i maximizing float32(x_i / T) + g_i
SPEC_SALTS = (0x5851F42D, 0x14057B7E)  # the two arbitrary key constants every seeded output depends on
MASK32 = 0xFFFFFFFF


def spec_mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & MASK32
    x ^= x >> 15
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def spec_key(seed: int, step: int, salt: int) -> int:
    seed &= 2**64 - 1  # an int64 seed counts as its uint64 bits
    key = spec_mix32(salt)
    for word in (seed & MASK32, seed >> 32, step & MASK32):
        key = spec_mix32(key ^ word)
    return key


def spec_draw(row, temperature: float, seed: int, step: int) -> int:
    """The id a row samples with top-k and top-p off: Gumbel-max over the whole vocabulary."""
    key_a, key_b = (spec_key(seed, step, salt) for salt in SPEC_SALTS)
    scores = []
    for i, x in enumerate(row):
        u = (spec_mix32(spec_mix32(i ^ key_a) ^ key_b) + 0.5) / 2**32
        scores.append(np.float32(x) / np.float32(temperature) + np.float32(-math.log(-math.log(u))))
    return scores.index(max(scores))


def test_seeded_draws_follow_the_noise_specification(rng):
    assert tuple(int(salt) for salt in sampling.STREAM_SALTS) == SPEC_SALTS
    vocab, n_rows = 50, 24
    logits = np.repeat((0.5 * rng.standard_normal((1, vocab))).astype(np.float32), n_rows, axis=0)
    # a fixed seed's first 16 draws (bits set above bit 32), then other seeds, an int64 one and other temperatures
    seeds = [0x9E3779B97F4A7C15] * 16 + [0, 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, 2**40 + 5, 7, 7]
    steps = list(range(16)) + [0, 0, 3, 9, 1, 2, 2**31 - 1, 12]
    temperatures = [1.0] * 16 + [0.7, 1.3, 2.0, 1.0, 0.5, 1.0, 1.0, 3.0]
    want = [spec_draw(logits[r], temperatures[r], seeds[r], steps[r]) for r in range(n_rows)]
    assert len(set(want[:16])) > 5  # the noise decides: a wrong bit anywhere in it moves some draw
    got = _launch(logits, temperatures, -1, 1.0, np.array(seeds, np.uint64), steps)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sample_ref(logits, temperatures, -1, 1.0, np.array(seeds, np.uint64), steps), want)
    as_int64 = np.array(seeds, np.uint64).view(np.int64)  # 2^64 - 1 is the int64 seed -1
    np.testing.assert_array_equal(_launch(logits, temperatures, -1, 1.0, as_int64, steps, seed_dtype=np.int64), want)


def test_seeds_differing_only_above_bit_32_draw_differently(rng):
    vocab, n_steps = 50, 6
    logits = (0.5 * rng.standard_normal((1, vocab))).astype(np.float32)
    low = 0x12345678
    seeds = np.repeat(np.array([low, low + 2**32, low + 2**45, low + 2**63], np.uint64), n_steps)
    steps = np.tile(np.arange(n_steps), 4)
    got = _launch(np.repeat(logits, len(seeds), axis=0), 1.0, -1, 1.0, seeds, steps).reshape(4, n_steps)
    # 6 draws over ~50 likely tokens: two seeds' rows agree everywhere with P < 1e-8 for a working hash
    for other in got[1:]:
        assert (other != got[0]).any(), got


def test_top_k_1_is_argmax(rng):
    logits = rng.standard_normal((5, 131)).astype(np.float32)  # continuous values: no tie at the max
    got = _launch(logits, [0.5, 1.0, 2.0, 10.0, 100.0], 1, [1.0, 0.3, 1.0, 0.9, 1.0], np.arange(5) + 11, 2)
    np.testing.assert_array_equal(got, argmax_ref(logits))


def test_same_seed_and_step_same_ids_else_different(rng):
    logits = np.tile(rng.standard_normal(53).astype(np.float32), (11, 1))
    # rows 0-4: one seed, steps 0..4; rows 5-9: seeds 0..4, step 0; row 10 repeats row 0's (seed, step)
    seeds = np.array([1234] * 5 + [0, 7919, 15838, 23757, 31676] + [1234])
    steps = np.array([0, 1, 2, 3, 4] + [0] * 5 + [0])
    first = _launch(logits, 2.0, 40, 1.0, seeds, steps, threads=1)
    again = _launch(logits, 2.0, 40, 1.0, seeds, steps, threads=1, seed_dtype=np.int64)
    np.testing.assert_array_equal(again, first)  # int64 seeds hash as the same uint64 values
    assert first[10] == first[0]
    # T = 2 over 40 tokens: the likeliest has probability < 0.2, so 5 equal draws would mean the seed or
    # the step does not reach the noise (P < 2e-3 for a working path; the hash makes the outcome fixed).
    assert len(set(first[:5])) > 1 and len(set(first[5:10])) > 1
    np.testing.assert_array_equal(first, sample_ref(logits, 2.0, 40, 1.0, seeds, steps))


def test_sampled_ids_are_survivors(rng):
    logits = (2 * rng.standard_normal((1, 61))).astype(np.float32)
    settings = [(3.0, 10, 1.0), (3.0, -1, 0.5), (5.0, 8, 0.7), (0.5, 0, 0.95)]
    for temperature, top_k, top_p in settings:
        keep = keep_mask_ref(logits, temperature, top_k, top_p)[0]
        assert keep.sum() < 30  # a hot temperature makes escaping the filter likely if it were broken
        ids = sample_ref(np.repeat(logits, 300, axis=0), temperature, top_k, top_p, 99, np.arange(300))
        assert keep[ids].all(), (temperature, top_k, top_p, sorted(set(ids) - set(np.flatnonzero(keep))))
        assert len(set(ids)) > 1
    n = 16
    seeds, steps = rng.integers(0, 2**63, n, dtype=np.uint64), rng.integers(0, 2**31, n)
    temperature, top_k, top_p = zip(*[settings[i % len(settings)] for i in range(n)])
    got = _launch(np.repeat(logits, n, axis=0), temperature, top_k, top_p, seeds, steps, threads=1)
    keep = keep_mask_ref(np.repeat(logits, n, axis=0), temperature, top_k, top_p)
    assert keep[np.arange(n), got].all()
    np.testing.assert_array_equal(got, sample_ref(np.repeat(logits, n, axis=0), temperature, top_k, top_p,
                                                  seeds, steps))


def _survivor_softmax(logits_row, temperature, keep):
    z = np.where(keep, logits_row.astype(np.float64) / temperature, -np.inf)
    p = np.exp(z - z.max())
    return p / p.sum()


# A filtered row costs ~65 simulated barriers (bisections), an unfiltered one ~6: fewer kernel draws there.
@pytest.mark.parametrize("temperature, top_k, top_p, n_kernel", [(0.8, 6, 0.9, 40), (1.5, -1, 1.0, 300)])
def test_draws_follow_softmax_of_survivors(temperature, top_k, top_p, n_kernel):
    logits = np.array([[1.0, -0.5, 2.0, 0.3, -2.0, 1.5, 0.0, -1.0]], np.float32)
    keep = keep_mask_ref(logits, temperature, top_k, top_p)[0]
    want = _survivor_softmax(logits[0], temperature, keep)
    n_ref = 4000
    ids = sample_ref(np.repeat(logits, n_ref, axis=0), temperature, top_k, top_p, 2024, np.arange(n_ref))
    freq = np.bincount(ids, minlength=8) / n_ref
    # Each frequency is binomial: std sqrt(p(1-p)/n). A correct sampler stays within 5 std of every p with
    # probability > 1 - 8 * 6e-7; the draws are a fixed function of (seed, step), so this never flakes.
    bound = 5 * np.sqrt(want * (1 - want) / n_ref) + 1e-12
    assert (np.abs(freq - want) <= bound).all(), (freq, want, bound)
    assert (freq[~keep] == 0).all()
    if top_k > 0:
        assert 2 <= keep.sum() < top_k  # top-p cut further than top-k: both filters are on the path
    # Through the kernel: fewer draws (simulated), the same bound at its count, and equal to the twin's.
    got = _launch(np.repeat(logits, n_kernel, axis=0), temperature, top_k, top_p, 2024, np.arange(n_kernel),
                  threads=1)
    np.testing.assert_array_equal(got, ids[:n_kernel])
    freq = np.bincount(got, minlength=8) / n_kernel
    assert (np.abs(freq - want) <= 5 * np.sqrt(want * (1 - want) / n_kernel) + 1e-12).all(), (freq, want)


def test_keep_mask_matches_transformers_warpers(rng):
    torch = require("torch")
    logits_process = require("transformers.generation.logits_process")
    logits = (3 * rng.standard_normal((6, 211))).astype(np.float32)
    for row, (temperature, top_k, top_p) in enumerate([(1.0, 50, 1.0), (0.7, 0, 0.9), (1.3, 30, 0.8),
                                                       (2.0, 5, 0.5), (0.5, 0, 0.3), (1.0, 100, 0.99)]):
        scores = torch.from_numpy(logits[row:row + 1].copy())
        scores = logits_process.TemperatureLogitsWarper(temperature)(None, scores)
        if top_k > 0:
            scores = logits_process.TopKLogitsWarper(top_k)(None, scores)
        scores = logits_process.TopPLogitsWarper(top_p)(None, scores)
        want = torch.isfinite(scores)[0].numpy()
        np.testing.assert_array_equal(keep_mask_ref(logits[row:row + 1], temperature, top_k, top_p)[0], want,
                                      err_msg=f"row {row}: T={temperature} top_k={top_k} top_p={top_p}")


def test_order_key_sorts_like_floats(rng):
    values = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-40, 38, 200),
                             [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38]]).astype(np.float32)
    keys = order_key(values)
    a, b = np.meshgrid(np.arange(len(values)), np.arange(len(values)))
    np.testing.assert_array_equal(keys[a] < keys[b], values[a] < values[b])   # ordering, -0.0 == +0.0
    assert all(order_key(v) == k for v, k in zip(values[:20], keys[:20]))     # scalar path == array path


def test_hash_is_injective_where_it_must_be():
    x = np.arange(200_000, dtype=np.uint64) * np.uint64(2654435761) & np.uint64(0xFFFFFFFF)
    assert len(np.unique(mix32(x))) == len(np.unique(x))                # a bijection on 32 bits
    keys = {int(stream_key(np.uint64(7), step, np.uint64(1))) for step in range(3000)}
    assert len(keys) == 3000                                             # every step its own noise
    assert stream_key(np.uint64(7), 5, np.uint64(1)) != stream_key(np.uint64(8), 5, np.uint64(1))


def test_sample_rejects_bad_inputs(rng):
    logits = cuda.to_device(rng.standard_normal((2, 9)).astype(np.float32))
    ok = [cuda.to_device(np.ones(2, dtype)) for dtype in SAMPLE_DTYPES]
    with pytest.raises(AssertionError, match="temperatures: dtype"):
        sample(logits, cuda.to_device(np.ones(2)), *ok[1:])
    with pytest.raises(AssertionError, match="steps: shape"):
        sample(logits, *ok[:4], cuda.to_device(np.ones(3, np.int32)))
    with pytest.raises(AssertionError, match="power of two"):
        sample(logits, *ok, threads=24)


def test_suppress_tokens_makes_only_the_named_tokens_impossible(rng):
    from kernels_numba.sampling import suppress_tokens, suppress_tokens_ref
    logits = rng.standard_normal((3, 37)).astype(np.float32)
    rows = np.array([0, 0, 2], np.int32)
    ids = np.array([5, 36, 0], np.int32)
    d = cuda.to_device(logits)
    suppress_tokens(d, cuda.to_device(rows), cuda.to_device(ids))
    np.testing.assert_array_equal(d.copy_to_host(), suppress_tokens_ref(logits, rows, ids))
    assert np.isneginf(d.copy_to_host()).sum() == 3
