import numpy as np
import pytest

from kernels_numba.common import cuda
from kernels_numba.logprobs import gather_logprobs, gather_logprobs_ref, logsumexp, logsumexp_ref
from tests.helpers import poisoned

VOCAB = 301


def _rows(rng):
    rows = rng.standard_normal((6, VOCAB)).astype(np.float32) * 4
    rows[1] += 1000.0                     # exp(x) alone would overflow float32: the max must come out first
    rows[2] -= 1000.0                     # ... or underflow to a sum of zeros
    rows[3, :VOCAB - 1] = -np.inf         # one finite entry: lse is that entry
    rows[4, 7] = np.nan                   # NaN in, NaN out
    rows[5, :] = -np.inf                  # nothing possible: -inf, not NaN
    return rows


@pytest.mark.parametrize("threads", [None, 1, 64])
def test_logsumexp_matches_float64_numpy(rng, threads):
    logits = _rows(rng)
    got = logsumexp(cuda.to_device(logits), out=poisoned((len(logits),), np.float32), threads=threads).copy_to_host()
    # Independent of the kernel's own formula: scipy-style float64 log(sum(exp)) on shifted rows, by hand.
    expected = np.array([np.log(np.sum(np.exp(r.astype(np.float64) - r[0]))) + r[0] for r in logits[:3]])
    # float64 accumulation then one rounding to float32: within 2 ulp of |lse| (~1000 here: 1.2e-4).
    np.testing.assert_allclose(got[:3], expected, rtol=2.5e-7, atol=0)
    assert got[3] == logits[3, VOCAB - 1]
    assert np.isnan(got[4]) and got[5] == -np.inf
    np.testing.assert_array_equal(np.isnan(got), np.isnan(logsumexp_ref(logits)))


def test_gather_logprobs_is_log_softmax(rng):
    logits = rng.standard_normal((5, VOCAB)).astype(np.float32) * 3
    lse = logsumexp(cuda.to_device(logits))
    rows = rng.integers(0, 5, 40).astype(np.int32)
    tokens = rng.integers(0, VOCAB, 40).astype(np.int32)
    rows[-1], tokens[-2] = 5, VOCAB          # out of range: NaN, not a neighbour's value
    got = gather_logprobs(cuda.to_device(logits), lse, cuda.to_device(rows), cuda.to_device(tokens),
                          out=poisoned((40,), np.float32)).copy_to_host()
    x = logits.astype(np.float64)
    log_softmax = x - np.log(np.exp(x).sum(axis=1, keepdims=True))   # unshifted: fine at this scale
    np.testing.assert_allclose(got[:-2], log_softmax[rows[:-2], tokens[:-2]], rtol=0, atol=2e-6)
    assert np.isnan(got[-2:]).all()
    probs = np.exp(got[:-2].astype(np.float64))
    assert (probs > 0).all() and (probs < 1).all()
    np.testing.assert_allclose(got[:-2], gather_logprobs_ref(logits, lse.copy_to_host(), rows[:-2], tokens[:-2]),
                               rtol=0, atol=1e-6)
