"""The inputs of one step, built from the scheduler's decision (a SchedulerOutput): the token ids, positions,
slot mapping and block tables the forward pass reads (ForwardBatch, on the host), which tokens get logits
(logprobs.LogitsPlan: each sampling sequence's last token, and prompt positions whose logprobs were asked for),
and the same index arrays on the device (DeviceBatch, `upload`: one copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels_numba.common import cuda

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


@dataclass
class DeviceBatch:
    """A ForwardBatch's index arrays on the device (views into one upload), plus what the host needs to
    pick kernels. The CUDA-graph decode path builds one over its own static buffers."""
    token_ids: object
    positions: object
    query_seq: object
    slot_mapping: object
    block_tables: object
    decode_only: bool
    prefill_tiles: object = None   # kernels_numba.attention.PrefillTiles, for steps with prefill chunks
    logits_rows: object = None     # device int32 [R]: which tokens get logits; None: every token
    fed_back: object = None        # device int32 [>= T]: the ids that token ids FED_BACK stand for (see embedding)

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]


def pack_int32(arrays: list[np.ndarray], out: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple]]:
    """Lay int32 arrays end to end in one host array (one host-to-device copy instead of one each);
    returns it and each array's (offset, shape) to cut views from the device copy with `unpack`."""
    sizes = [a.size for a in arrays]
    out = np.empty(sum(sizes), np.int32) if out is None else out
    layout, offset = [], 0
    for a, size in zip(arrays, sizes):
        out[offset:offset + size] = a.reshape(-1)
        layout.append((offset, a.shape))
        offset += size
    return out, layout


def unpack(device_flat, layout: list[tuple]) -> list:
    views = []
    for offset, shape in layout:
        size = int(np.prod(shape))
        views.append(device_flat[offset:offset + size].reshape(shape))
    return views


def upload(batch: ForwardBatch, plan, all_logits: bool = False) -> DeviceBatch:
    """Copy a batch's index arrays to the device in one transfer; `plan` (a KernelPlan) builds the prefill
    attention's query tiles, once for all layers."""
    arrays = [batch.token_ids, batch.positions, batch.query_seq, batch.slot_mapping, batch.block_tables]
    every_row = all_logits or batch.samples_every_token
    if not every_row:
        arrays.append(batch.logits_rows)
    flat, layout = pack_int32(arrays)
    views = unpack(cuda.to_device(flat), layout)
    decode_only = batch.is_decode_only
    tiles = plan.step_tiles(decode_only, batch.query_seq, batch.positions)
    return DeviceBatch(*views[:5], decode_only=decode_only, prefill_tiles=tiles,
                       logits_rows=None if every_row else views[5])
