"""Value edits: set part of a stage's output where stepping stopped, as a debugger sets a variable.

    edit = ValueEdit.parse(step=0, stage="layers.0.q", text="row 2 head 1 = x * 0")
    new = edit.apply(values, head_dim=16)        # a new host array; `values` is left as it was

The text is `SELECTION = EXPRESSION`. SELECTION picks part of the output viewed as [tokens, features] (rows.as_rows):
`all`, `row N`, `head H` (q/k/v/attn: features H*head_dim .. (H+1)*head_dim), `channel C` (a feature; within a
head when a head is named too), in any combination, each N/H/C an index or a slice A:B; or numpy's own
`[2, 0:8]`. EXPRESSION is numpy over `x`, the selected values (`x * 0`, `x + 1e-2`, `np.flip(x)`), read by a
checker that lets through only arithmetic, comparisons, indexing and an allow-list of numpy functions and array
methods (no builtins, no names but `x` and `np`, no files): a recording's edits are replayed, so an expression must
not be able to do anything but compute. Its result must broadcast to the selection's shape and be finite.

Every problem is an EditError naming it, one line. Session.edit (session.py) applies an edit to the device output;
the forward pass says where an edit would not reach the stages after it (ForwardPass.edit_blocker).
"""
from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

import numpy as np

from tinyvllm.errors import TinyVLLMError

from debugger.rows import as_rows

EDIT_HELP = ("SELECTION = EXPRESSION: all | row N | head H | channel C (combine them; N, H, C an index or A:B) "
             "| [numpy index]; numpy over x, e.g. row 0 = x * 0, head 1 = np.flip(x), channel 3 = x + 1e-2")
MAX_EXPRESSION = 200          # characters: an edit is a short expression, not a program
MAX_POWER = 64                # the largest constant exponent (9 ** 9 ** 9 would not finish)
HEAD_STAGES = ("q", "k", "v", "attn")   # outputs laid out [tokens, heads * head_dim]

NUMPY_NAMES = frozenset("""
    abs absolute sign sqrt cbrt square exp expm1 log log1p log2 log10 tanh sin cos tan arctan sinh cosh
    clip where maximum minimum fmax fmin flip fliplr flipud roll sort mean std var sum prod max min amax amin
    median cumsum cumprod argmax argmin zeros_like ones_like full_like round rint floor ceil trunc float32
    float64 pi e isfinite isnan nan_to_num heaviside power multiply add subtract divide negative reciprocal
""".split())
ARRAY_NAMES = frozenset("""
    T shape size ndim mean std var sum prod max min cumsum argmax argmin clip round reshape copy transpose
""".split())
OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd,
             ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.keyword,
         ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Load) + OPERATORS


# numpy's array methods import lazily through the calling frame's builtins; the expression itself cannot name it
# (check_expression lets no name but x and np through)
NUMPY_BUILTINS = {"__import__": builtins.__import__}


class EditError(TinyVLLMError, ValueError):
    """An edit that cannot be read or applied; the message says why."""


# ---- the expression -------------------------------------------------------------------------------
def check_expression(expr: str) -> ast.Expression:
    """The parsed expression, when it uses only what the module docstring allows; else EditError."""
    if not expr.strip():
        raise EditError(f"no expression after '=': {EDIT_HELP}")
    if len(expr) > MAX_EXPRESSION:
        raise EditError(f"expression of {len(expr)} characters: at most {MAX_EXPRESSION}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise EditError(f"cannot read expression {expr.strip()!r}: {e.msg}") from None
    nodes = list(ast.walk(tree))
    for node in nodes:   # what it is made of first: the message names the innermost thing not allowed
        if not isinstance(node, NODES):
            raise EditError(f"{type(node).__name__} is not allowed in an edit expression "
                            f"(arithmetic, comparisons, indexing and np functions over x)")
        if isinstance(node, ast.Name) and node.id not in ("x", "np"):
            raise EditError(f"unknown name {node.id!r}: an edit expression knows x (the selected values) and np")
    for node in nodes:
        if isinstance(node, ast.Attribute):
            on_numpy = isinstance(node.value, ast.Name) and node.value.id == "np"
            allowed = NUMPY_NAMES if on_numpy else ARRAY_NAMES
            if node.attr not in allowed:
                where = "np" if on_numpy else "an array"
                raise EditError(f"{where}.{node.attr} is not allowed in an edit expression; allowed: "
                                f"{', '.join(sorted(allowed))}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)) and node.value is not None:
            raise EditError(f"constant {node.value!r} is not a number")
        if isinstance(node, ast.Call) and not isinstance(node.func, ast.Attribute):
            raise EditError("only np functions and array methods can be called (np.flip(x), x.mean())")
        if isinstance(node, ast.BinOp) and any(isinstance(n, (ast.Tuple, ast.List)) for n in (node.left, node.right)):
            raise EditError("a tuple or list cannot take part in arithmetic ((0,) * 10 ** 9 would fill the memory)")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = _constant(node.right)
            if exponent is None or abs(exponent) > MAX_POWER:
                raise EditError(f"an exponent must be a number constant within +-{MAX_POWER} (x ** 2)")
    return tree


def _constant(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _constant(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    return None


def evaluate(expr: str, x: np.ndarray) -> np.ndarray:
    """The expression over x, broadcast to x's shape, as x's dtype; EditError when it fails or is not finite."""
    code = compile(check_expression(expr), "<edit>", "eval")
    try:
        with np.errstate(all="ignore"):
            result = np.asarray(eval(code, {"__builtins__": NUMPY_BUILTINS}, {"np": np, "x": x.copy()}))
    except Exception as e:  # anything numpy raises: the user's expression, one line
        raise EditError(f"cannot evaluate {expr.strip()!r}: {type(e).__name__}: {e}") from None
    if not np.issubdtype(result.dtype, np.number) and result.dtype != np.bool_:
        raise EditError(f"{expr.strip()!r} gives {result.dtype} values, not numbers")
    try:
        result = np.broadcast_to(result, x.shape)
    except ValueError:
        raise EditError(f"{expr.strip()!r} gives shape {result.shape}, which does not broadcast to the "
                        f"selection's shape {x.shape}") from None
    with np.errstate(all="ignore"):
        values = result.astype(x.dtype)
    bad = int(np.size(values) - np.isfinite(values).sum())
    if bad:
        raise EditError(f"{expr.strip()!r} gives {bad} value(s) that are not finite in {x.dtype} "
                        f"(NaN, inf, or too large)")
    return values


# ---- the selection --------------------------------------------------------------------------------
def _index(text: str, what: str) -> int | slice:
    """`3`, `-1`, `2:5`, `:4` -> an int or a slice; EditError otherwise."""
    m = re.fullmatch(r"(-?\d+)?:(-?\d+)?", text)
    if m:
        return slice(*(None if g is None else int(g) for g in m.groups()))
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    raise EditError(f"{what} {text!r}: expected an index (3, -1) or a slice (2:5)")


def _numpy_index(text: str) -> tuple:
    """`[2, 0:8]` -> (2, slice(0, 8)): ints and slices of ints only, at most two (tokens, features)."""
    try:
        node = ast.parse("x" + text, mode="eval").body
    except SyntaxError:
        node = None
    if not isinstance(node, ast.Subscript):
        raise EditError(f"cannot read selection {text!r}: {EDIT_HELP}")
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if len(parts) > 2:
        raise EditError(f"selection {text!r} has {len(parts)} indices: a stage is [tokens, features], at most 2")

    def number(n):
        if n is None:
            return None
        value = _constant(n)
        if not isinstance(value, int):
            raise EditError(f"selection {text!r}: indices must be integers or slices of integers")
        return value
    index = []
    for p in parts:
        if isinstance(p, ast.Slice):
            index.append(slice(number(p.lower), number(p.upper), number(p.step)))
        else:
            index.append(number(p))
    return tuple(index)


def _check_bounds(index, size: int, what: str) -> None:
    if isinstance(index, int) and not -size <= index < size:
        raise EditError(f"{what} {index} is out of range: this stage has {size} ({what}s 0..{size - 1})")
    if isinstance(index, slice) and index.step == 0:
        raise EditError(f"{what} step 0 in {index.start or ''}:{index.stop or ''}:0: a slice's step must not be 0")
    if isinstance(index, slice) and len(range(*index.indices(size))) == 0:
        raise EditError(f"{what}s {index.start}:{index.stop} select nothing: this stage has {size} (0..{size - 1})")


def select(text: str, shape: tuple[int, int], stage: str, head_dim: int) -> tuple:
    """The index into a [tokens, features] view that SELECTION `text` names (the module docstring)."""
    text = text.strip()
    rows, cols = shape
    if text.startswith("["):
        index = _numpy_index(text)
        for i, (part, size, what) in enumerate(zip(index, shape, ("row", "column"))):
            _check_bounds(part, size, what)
        return index
    words = text.split()
    if words == ["all"]:
        return (slice(None), slice(None))
    if not words or len(words) % 2:
        raise EditError(f"cannot read selection {text!r}: {EDIT_HELP}")
    named = {}
    for word, value in zip(words[::2], words[1::2]):
        word = word.lower().rstrip("s")
        if word not in ("row", "head", "channel"):
            raise EditError(f"unknown selection {word!r} in {text!r}: {EDIT_HELP}")
        if word in named:
            raise EditError(f"{word} named twice in {text!r}")
        named[word] = _index(value, word)
    row = named.get("row", slice(None))
    _check_bounds(row, rows, "row")
    if "head" not in named:
        col = named.get("channel", slice(None))
        _check_bounds(col, cols, "channel")
        return (row, col)
    kind = stage.rsplit(".", 1)[-1]
    if kind not in HEAD_STAGES or cols % head_dim:
        raise EditError(f"{stage} has no heads: head H selects in {', '.join(HEAD_STAGES)} stages "
                        f"(use channel C)")
    head = named["head"]
    if not isinstance(head, int):
        raise EditError("head takes one head index (its channels: head H channel A:B)")
    _check_bounds(head, cols // head_dim, "head")
    start = (head % (cols // head_dim)) * head_dim
    channel = named.get("channel", slice(None))
    _check_bounds(channel, head_dim, "channel")
    if isinstance(channel, int):
        return (row, start + channel % head_dim)
    lo, hi, step = channel.indices(head_dim)
    return (row, slice(start + lo, start + hi, step))


# ---- one edit -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValueEdit:
    """Set SELECTION of stage `stage`'s output in scheduler step `step` (LLMEngine.num_steps while it runs, as
    a recording counts steps) to EXPRESSION of x."""
    step: int
    stage: str
    select: str
    expr: str

    @classmethod
    def parse(cls, step: int, stage: str, text: str) -> ValueEdit:
        """From `SELECTION = EXPRESSION`; the expression is checked now, the selection against a shape in apply."""
        m = re.fullmatch(r"([^=]*?)\s*(?<![<>!=])=(?!=)\s*(.*)", text.strip())
        if m is None or not m.group(1):
            raise EditError(f"cannot read edit {text.strip()!r}: {EDIT_HELP}")
        edit = cls(step, stage, m.group(1).strip(), m.group(2).strip())
        check_expression(edit.expr)
        return edit

    def describe(self) -> str:
        return f"step {self.step} {self.stage} {self.select} = {self.expr}"

    def apply(self, values: np.ndarray, head_dim: int) -> np.ndarray:
        """A copy of the stage output `values` with the edit made; EditError when it cannot be."""
        if values.dtype != np.float32:
            raise EditError(f"{self.stage} holds {values.dtype} values: edits set float32 outputs")
        out = np.array(values, copy=True)
        rows = as_rows(out)
        assert np.shares_memory(rows, out), "as_rows of a contiguous array is a view"
        index = select(self.select, rows.shape, self.stage, head_dim)
        x = np.asarray(rows[index])
        rows[index] = evaluate(self.expr, x)
        return out

    def to_json(self) -> dict:
        return {"step": self.step, "stage": self.stage, "select": self.select, "expr": self.expr}
