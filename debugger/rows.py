"""How the debugger lays a stage output out in rows (the tensor inspector, trace, the precision comparison), and
which request and position each row belongs to."""
import numpy as np


def as_rows(array: np.ndarray) -> np.ndarray:
    """A stage output as a 2-D [tokens, features] view ([T, heads, hd] -> [T, heads * hd])."""
    array = np.asarray(array)
    return array.reshape(1, -1) if array.ndim < 2 else array.reshape(array.shape[0], -1)


def row_labels(schedule, rows: int) -> tuple[str, ...]:
    """"request:position" for each row of a stage's output in a step scheduled as `schedule`: its token rows
    (every stage but logits), or one row per sequence that samples (the logits, unless the step asked for all
    of them); () when neither fits."""
    if schedule is None:
        return ()
    tokens = [(s.seq.data.request_id, p) for s in schedule.scheduled for p in range(s.start, s.end)]
    if rows != len(tokens):
        tokens = [(s.seq.data.request_id, s.end - 1) for s in schedule.scheduled if s.samples]
    if rows != len(tokens):
        return ()
    return tuple(f"{r}:{p}" for r, p in tokens)


def label_parts(label: str) -> tuple[str, int]:
    """"cmpl-1a2b-0:26" -> ("cmpl-1a2b-0", 26)."""
    request_id, _, position = label.rpartition(":")
    return request_id, int(position)
