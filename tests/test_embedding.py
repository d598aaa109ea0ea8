import numpy as np
import pytest

from kernels_numba.bf16 import f32_to_bf16_ref
from kernels_numba.common import cuda
from kernels_numba.embedding import FED_BACK, embedding, embedding_ref, take_rows, take_rows_ref
from tests.helpers import poisoned

VOCAB, HIDDEN = 301, 67


def _table_bits(rng):
    return f32_to_bf16_ref(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32))


def test_embedding_gathers_decoded_rows_bit_exact(rng):
    table = _table_bits(rng)
    ids = np.concatenate([rng.integers(0, VOCAB, 5), [0, VOCAB - 1, 3, 3]]).astype(np.int32)
    out = poisoned((len(ids), HIDDEN), np.float32)
    got = embedding(cuda.to_device(ids), cuda.to_device(table), out=out).copy_to_host()
    # A gather plus an exact bf16 decode: nothing is rounded, so the match must be exact.
    np.testing.assert_array_equal(got, embedding_ref(ids, table))


def test_embedding_writes_nan_for_ids_outside_the_table(rng):
    table = _table_bits(rng)
    ids = np.array([-1, VOCAB, 2], dtype=np.int32)
    # A finite fill, so "wrote NaN" differs from "did not write".
    out = cuda.to_device(np.full((3, HIDDEN), 7.0, dtype=np.float32))
    got = embedding(cuda.to_device(ids), cuda.to_device(table), out=out).copy_to_host()
    assert np.isnan(got[:2]).all()
    np.testing.assert_array_equal(got[2], embedding_ref(ids, table)[2])


def test_embedding_takes_fed_back_ids_for_fed_back_rows(rng):
    # A pipelined decode step: rows with id FED_BACK embed the previous step's token, left on the device.
    table = _table_bits(rng)
    ids = np.array([FED_BACK, 7, FED_BACK, 0, -2], dtype=np.int32)
    fed_back = rng.permutation(np.arange(8, VOCAB))[:6].astype(np.int32)  # distinct, none 7 or 0; longer than
    out = poisoned((len(ids), HIDDEN), np.float32)                         # ids, as a bucket's argmax buffer is
    got = embedding(cuda.to_device(ids), cuda.to_device(table), out=out,
                    fed_back=cuda.to_device(fed_back)).copy_to_host()
    decoded = (table.astype(np.uint32) << 16).view(np.float32)  # bf16 is float32's top 16 bits
    np.testing.assert_array_equal(got[:4], decoded[[fed_back[0], 7, fed_back[2], 0]])
    assert np.isnan(got[4]).all()  # only FED_BACK reads fed_back; any other negative id is out of the table
    np.testing.assert_array_equal(embedding_ref(ids, table, fed_back), got)


@pytest.mark.parametrize("rows", [[4, 0, 8], [8], [2, 2, 5, 1]])
def test_take_rows_bit_exact(rng, rows):
    x = rng.standard_normal((9, HIDDEN)).astype(np.float32)
    rows = np.array(rows, dtype=np.int32)
    out = poisoned((len(rows), HIDDEN), np.float32)
    got = take_rows(cuda.to_device(x), cuda.to_device(rows), out=out).copy_to_host()
    np.testing.assert_array_equal(got, x[rows])
    np.testing.assert_array_equal(got, take_rows_ref(x, rows))


def test_launchers_allocate_out_when_not_given(rng):
    table = _table_bits(rng)
    ids = np.array([5, 1], dtype=np.int32)
    got = embedding(cuda.to_device(ids), cuda.to_device(table)).copy_to_host()
    np.testing.assert_array_equal(got, embedding_ref(ids, table))
    picked = take_rows(cuda.to_device(got), cuda.to_device(np.array([1], dtype=np.int32))).copy_to_host()
    np.testing.assert_array_equal(picked, got[1:])
