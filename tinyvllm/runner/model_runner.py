"""The device side of one model: its weights, its paged KV pool, the kernel plan, and the forward pass over them.

`ModelRunner.forward_stages(batch)` uploads a ForwardBatch's index arrays (one copy) and yields the stages of the
forward pass (tinyvllm/runner/forward.py): `generate`, `check-goldens` and the debugger all drive this same
generator; `forward` just drains it. CUDA graphs (tinyvllm/runner/cuda_graphs.py) record it for decode steps, and up
to final_norm for the others (tinyvllm/runner/prefill_graphs.py). Two precisions run through it
(`ModelRunner.precision`): fp32, the reference, and fast, bf16 activations into tensor-core GEMMs and prefill
attention; tinyvllm/runner/kernel_plan.py says which kernel each takes where.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from kernels_numba.common import cuda

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.device_weights import DeviceWeights
from tinyvllm.runner.forward import ForwardPass
from tinyvllm.runner.kernel_plan import KernelPlan
from tinyvllm.runner.kv_pool import KVPool
from tinyvllm.runner.stages import Stage, drain


@dataclass
class ForwardBatch:
    """What one forward step processes, built by the engine from the scheduler's decision.

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


@dataclass
class ModelRunner:
    """Owns the device side of one model: its weights, its paged KV pool and the RoPE frequencies."""
    config: ModelConfig
    weights: DeviceWeights
    kv_pool: KVPool
    inv_freq: np.ndarray  # float32 [head_dim / 2], from kernels_numba.rope.rope_inv_freq
    fuse_norms: bool | None = None  # the fused-GEMV layer: None = where the plan says (fuses_norms)
    precision: str = "fp32"         # "fp32" or "fast" (kernel_plan.resolve_precision)

    def __post_init__(self):
        self.inv_freq = cuda.to_device(self.inv_freq)
        c = self.config
        plan = KernelPlan(self.precision, c.head_dim, c.num_attention_heads // c.num_key_value_heads)
        self.forward_pass = ForwardPass(c, self.weights, self.kv_pool, self.inv_freq, plan)

    @property
    def plan(self) -> KernelPlan:
        """Which kernel runs each stage (the forward pass's)."""
        return self.forward_pass.plan

    def forward(self, batch: ForwardBatch):
        """Run the whole forward pass; return the logits device array [len(logits_rows), vocab]."""
        return drain(self.forward_stages(batch, synchronize=False))

    def device_forward(self, batch: DeviceBatch):
        """The whole forward pass over device index arrays, launches left asynchronous; the logits."""
        return drain(self.device_forward_stages(batch, synchronize=False))

    def upload(self, batch: ForwardBatch, all_logits: bool = False) -> DeviceBatch:
        """Copy a batch's index arrays to the device in one transfer."""
        arrays = [batch.token_ids, batch.positions, batch.query_seq, batch.slot_mapping, batch.block_tables]
        every_row = all_logits or batch.samples_every_token
        if not every_row:
            arrays.append(batch.logits_rows)
        flat, layout = pack_int32(arrays)
        views = unpack(cuda.to_device(flat), layout)
        decode_only = batch.is_decode_only
        tiles = None if decode_only else self.plan.prefill_tiles(batch.query_seq, batch.positions)
        return DeviceBatch(*views[:5], decode_only=decode_only, prefill_tiles=tiles,
                           logits_rows=None if every_row else views[5])

    def forward_stages(self, batch: ForwardBatch, all_logits: bool = False,
                       synchronize: bool = True) -> Iterator[Stage]:
        """Yield each stage in order; the generator's return value is the logits device array.

        With `all_logits`, logits are computed for every token (golden checks), else only for
        `batch.logits_rows` (and not at all, returning None, when there are none). With `synchronize`,
        each stage waits for its kernels, so its output is ready and `seconds` is its real time; without,
        launches stay asynchronous (the engine's plain step) and `seconds` is only the launch time.
        """
        wants_logits = all_logits or len(batch.logits_rows) > 0  # chunks ending mid-prompt sample nothing
        logits = yield from self.device_forward_stages(self.upload(batch, all_logits), synchronize, wants_logits)
        return logits

    def device_forward_stages(self, batch: DeviceBatch, synchronize: bool = True,
                              logits: bool = True) -> Iterator[Stage]:
        """forward_stages over index arrays already on the device (what a decode CUDA-graph capture records)."""
        x = yield from self.device_hidden_stages(batch, synchronize)
        if not logits:
            return None
        out = yield from self.forward_pass.logits_stage(x, batch.logits_rows, synchronize)
        return out

    def logits(self, x, rows=None):
        """The LM head over the final normed hidden states x [T, hidden]: of rows `rows` (device int32), or of every
        row. (A prefill CUDA graph ends at x; this runs eagerly after it, on the step's own rows.)"""
        return self.forward_pass.logits(x, rows)

    def device_hidden_stages(self, batch: DeviceBatch, synchronize: bool = True) -> Iterator[Stage]:
        """The stages from embedding to final_norm; returns final_norm's output (what a prefill CUDA-graph
        capture records)."""
        x = yield from self.forward_pass.hidden_stages(batch, self.fuses_norms(batch.num_tokens), synchronize)
        return x

    def fuses_norms(self, num_tokens: int) -> bool:
        """Whether a step of num_tokens runs the fused-GEMV layer: where the plan says (KernelPlan.fused_gemv_layer),
        unless `fuse_norms` says otherwise."""
        if self.fuse_norms is not None:
            return self.fuse_norms
        return self.plan.fused_gemv_layer(num_tokens, self.forward_pass.projection_inputs())
