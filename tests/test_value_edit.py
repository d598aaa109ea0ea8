"""Value edits without an engine (debugger/value_edit.py): what a selection picks, what an expression computes, and
the one-line message for each way an edit can be wrong."""
import numpy as np
import pytest

from debugger.value_edit import EditError, ValueEdit

HEAD_DIM = 4


def values(rows=3, cols=12):
    """Distinct values, so a wrong element shows: v[r, c] = 100 r + c + 0.5."""
    return (100 * np.arange(rows)[:, None] + np.arange(cols)[None, :] + 0.5).astype(np.float32)


def edited(stage, text, v=None):
    v = values() if v is None else v
    return ValueEdit.parse(0, stage, text).apply(v, HEAD_DIM)


@pytest.mark.parametrize("text, cells", [
    ("row 1 = x * 0", [(1, c) for c in range(12)]),
    ("row -1 = x * 0", [(2, c) for c in range(12)]),
    ("rows 0:2 channel 3 = x * 0", [(0, 3), (1, 3)]),
    ("channel 11 = x * 0", [(r, 11) for r in range(3)]),
    ("head 1 = x * 0", [(r, c) for r in range(3) for c in range(4, 8)]),          # head_dim 4: columns 4..7
    ("row 2 head 2 channel 1 = x * 0", [(2, 9)]),                                # 2 * 4 + 1
    ("head -1 channel 0:2 = x * 0", [(r, c) for r in range(3) for c in (8, 9)]),  # the last of 3 heads
    ("[0, 1:3] = x * 0", [(0, 1), (0, 2)]),
    ("all = x * 0", [(r, c) for r in range(3) for c in range(12)]),
])
def test_a_selection_zeroes_exactly_its_cells(text, cells):
    out = edited("layers.0.q", text)
    expected = values()
    for r, c in cells:
        expected[r, c] = 0
    np.testing.assert_array_equal(out, expected)


def test_expressions_see_the_selection_and_broadcast_into_it():
    v = values()
    np.testing.assert_array_equal(edited("layers.1.mlp", "row 0 = np.flip(x)")[0], v[0, ::-1])
    np.testing.assert_array_equal(edited("layers.1.mlp", "row 1 = x.mean()")[1], np.full(12, v[1].mean(), np.float32))
    np.testing.assert_array_equal(edited("layers.1.mlp", "channel 2 = 7")[:, 2], [7, 7, 7])
    np.testing.assert_array_equal(edited("logits", "row 0 = x + 1e-2")[0], v[0] + np.float32(1e-2))
    np.testing.assert_array_equal(edited("logits", "row 0 = np.where(x > 5, x, 0)")[0],
                                  np.where(v[0] > 5, v[0], 0))
    same = edited("logits", "all = x * 1")
    assert same.tobytes() == values().tobytes()


def test_a_3d_stage_output_is_edited_through_its_rows_view():
    v = values().reshape(3, 3, HEAD_DIM)                  # [tokens, heads, head_dim] as q's output may be
    out = edited("layers.0.q", "row 1 head 2 = x * 0", v)
    expected = v.copy()
    expected[1, 2, :] = 0
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("stage, text, message", [
    ("logits", "row 0 x * 0", "cannot read edit"),
    ("logits", "= x", "cannot read edit"),
    ("logits", "row 0 =", "no expression"),
    ("logits", "row 3 = x", "row 3 is out of range: this stage has 3"),
    ("logits", "row 1:1 = x", "select nothing"),
    ("logits", "column 1 = x", "unknown selection 'column'"),
    ("logits", "row 1 row 2 = x", "row named twice"),
    ("logits", "row a = x", "expected an index"),
    ("logits", "[0, 1, 2] = x", "at most 2"),
    ("logits", "[0.5] = x", "integers"),
    ("logits", "[::0] = x", "row step 0"),
    ("logits", "[0, 1:4:0] = x", "column step 0"),
    ("layers.0.mlp", "head 0 = x", "layers.0.mlp has no heads"),
    ("layers.0.q", "head 3 = x", "head 3 is out of range: this stage has 3"),
    ("layers.0.q", "head 0 channel 4 = x", "channel 4 is out of range: this stage has 4"),
    ("logits", "row 0 = __import__('os')", "unknown name '__import__'"),
    ("logits", "row 0 = x.__class__", "an array.__class__ is not allowed"),
    ("logits", "row 0 = np.load('f.npy')", "np.load is not allowed"),
    ("logits", "row 0 = x.tofile('f')", "an array.tofile is not allowed"),
    ("logits", "row 0 = 'text'", "not a number"),
    ("logits", "row 0 = (lambda: 1)()", "Lambda is not allowed"),
    ("logits", "row 0 = [y for y in x]", "ListComp is not allowed"),
    ("logits", "row 0 = x ** 9 ** 9", "exponent"),
    ("logits", "row 0 = x + (0,) * 12", "a tuple or list cannot take part in arithmetic"),
    ("logits", "row 0 = x +", "cannot read expression"),
    ("logits", "row 0 = x / 0", "not finite"),
    ("logits", "row 0 = x * 1e39", "not finite"),
    ("logits", "row 0 = x[:2]", "does not broadcast to the selection's shape (12,)"),
    ("logits", "row 0 = np.flip(x, axis=3)", "cannot evaluate"),
    ("logits", "row 0 = x " + "+ 1 " * 60, "at most 200"),
])
def test_each_bad_edit_is_one_line_naming_the_problem(stage, text, message):
    with pytest.raises(EditError) as caught:
        edited(stage, text)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_an_edit_leaves_the_values_it_was_given_alone():
    v = values()
    edited("logits", "all = x * 0", v)
    np.testing.assert_array_equal(v, values())
