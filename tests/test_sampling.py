import numpy as np
import pytest

from kernels_numba.common import cuda
from kernels_numba.sampling import argmax, argmax_ref
from tests.helpers import poisoned

VOCAB = 301


def _tricky_rows(rng):
    """Rows with the cases argmax gets wrong: ties, NaN, +-inf, the max at either end."""
    rows = rng.standard_normal((9, VOCAB)).astype(np.float32)
    rows[0, [17, 150, 300]] = 9.0                  # tie -> 17
    rows[1, [0, 1]] = 9.0                          # tie at the start -> 0
    rows[2, :] = 0.5                               # all equal -> 0
    rows[3, 300] = 9.0                             # last index -> 300
    rows[4, [40, 200]] = np.nan                    # NaN counts as the max -> 40
    rows[4, 10] = np.inf
    rows[5, :] = -np.inf                           # all -inf -> 0
    rows[6, [3, 7]] = np.inf                       # tie of +inf -> 3
    rows[7, 299] = np.nan                          # lone NaN at the end -> 299
    rows[8] *= 1e30                                # large magnitudes, nothing special
    return rows


EXPECTED_FIXED = {0: 17, 1: 0, 2: 0, 3: 300, 4: 40, 5: 0, 6: 3, 7: 299}


@pytest.mark.parametrize("threads", [None, 1, 64])
def test_argmax_ties_nan_and_inf(rng, threads):
    logits = _tricky_rows(rng)
    out = poisoned((len(logits),), np.int32)
    got = argmax(cuda.to_device(logits), out=out, threads=threads).copy_to_host()
    np.testing.assert_array_equal(got, argmax_ref(logits))  # exact: indices
    for row, index in EXPECTED_FIXED.items():
        assert got[row] == index, (row, got[row], index)


def test_argmax_row_shorter_than_block(rng):
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    logits[1, [2, 4]] = 50.0
    got = argmax(cuda.to_device(logits), out=poisoned((3,), np.int32), threads=32).copy_to_host()
    np.testing.assert_array_equal(got, argmax_ref(logits))
    assert got[1] == 2


def test_argmax_matches_torch(rng):
    torch = pytest.importorskip("torch")
    logits = _tricky_rows(rng)
    got = argmax(cuda.to_device(logits)).copy_to_host()
    np.testing.assert_array_equal(got, torch.argmax(torch.from_numpy(logits), dim=-1).numpy())


def test_argmax_rejects_non_power_of_two_block(rng):
    with pytest.raises(AssertionError, match="power of two"):
        argmax(cuda.to_device(np.ones((1, 4), np.float32)), threads=48)
