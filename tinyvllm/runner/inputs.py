"""The host-side inputs of one step, built from the scheduler's decision (a SchedulerOutput): the token ids,
positions, slot mapping and block tables the forward pass reads (ForwardBatch), and which tokens get logits
(logprobs.LogitsPlan: each sampling sequence's last token, and prompt positions whose logprobs were asked for).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyvllm.engine.scheduler_output import SchedulerOutput
from tinyvllm.runner.logprobs import LogitsPlan


@dataclass
class ForwardBatch:
    """What one forward step processes, built from the scheduler's decision (build_inputs).

    T tokens flattened across B sequences (decode tokens and prefill chunks mixed); K/V go to the paged
    pool through `slot_mapping`, attention reads them back through `block_tables`.
    """
    token_ids: np.ndarray     # int32 [T]
    positions: np.ndarray     # int32 [T], each token's position in its sequence
    query_seq: np.ndarray     # int32 [T], each token's sequence: a row of block_tables
    slot_mapping: np.ndarray  # int32 [T], where each token's K/V go in the pool
    block_tables: np.ndarray  # int32 [B, max_blocks], -1 padded
    logits_rows: np.ndarray   # int32 [R], which of the T tokens get logits (each sampling sequence's last)

    def __post_init__(self):
        for name in ("token_ids", "positions", "query_seq", "slot_mapping", "block_tables", "logits_rows"):
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int32))
        n = len(self.token_ids)
        assert n > 0 and self.positions.shape == self.query_seq.shape == self.slot_mapping.shape == (n,)
        assert self.block_tables.ndim == 2 and 0 <= self.query_seq.min() and self.query_seq.max() < len(self.block_tables)
        assert len(self.logits_rows) == 0 or (self.logits_rows.min() >= 0 and self.logits_rows.max() < n)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def samples_every_token(self) -> bool:
        """Every token gets logits (a decode-only step where every sequence samples)."""
        return np.array_equal(self.logits_rows, np.arange(self.num_tokens))

    @property
    def is_decode_only(self) -> bool:
        """One token per sequence (so attention needs no query tiles)."""
        return len(np.unique(self.query_seq)) == self.num_tokens


def build_inputs(schedule: SchedulerOutput, block_size: int) -> tuple[ForwardBatch, LogitsPlan]:
    """Lay out every scheduled chunk end to end: row r of the batch is schedule.scheduled[r], its tokens at
    positions start..end - 1, each one's K/V slot `block_table[p // block_size] * block_size + p % block_size`
    (the definition BlockManager.slots gives one sequence at a time)."""
    token_ids, starts, counts = [], [], []
    plan = LogitsPlan()
    for s in schedule.scheduled:
        plan.add_chunk(s.seq.data, len(token_ids), s.start, s.end, s.seq.num_prompt_tokens, s.samples)
        token_ids += s.token_ids
        starts.append(s.start)
        counts.append(s.num_new_tokens)
    tables = [s.seq.block_table for s in schedule.scheduled]
    width = max(map(len, tables))
    block_tables = np.array([t + [-1] * (width - len(t)) for t in tables], np.int32)
    # every token's position, row and slot at once (numpy: a prefill step has thousands of tokens)
    counts = np.array(counts, np.int64)
    query_seq = np.repeat(np.arange(len(counts)), counts)
    first = np.cumsum(counts) - counts
    positions = np.arange(len(token_ids)) + np.repeat(np.array(starts, np.int64) - first, counts)
    slots = block_tables[query_seq, positions // block_size].astype(np.int64) * block_size + positions % block_size
    assert slots.min() >= 0, "a scheduled token has no KV block"
    return ForwardBatch(token_ids, positions, query_seq, slots, block_tables, plan.rows), plan
