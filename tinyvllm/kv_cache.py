"""A contiguous KV cache: per layer, K and V as float32 [max_seqs, max_seq_len, n_kv_heads, head_dim].

A token at position p of the sequence in slot s lives at [s, p]. Slots are handed out and returned by
`allocate_slot` / `free_slot`. (The paged cache of the serving engine replaces this.)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels_numba.common import cuda

from .config import ModelConfig


@dataclass
class KVCache:
    config: ModelConfig
    max_seqs: int
    max_seq_len: int
    _layers: list = field(init=False, repr=False)
    _free_slots: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        assert self.max_seqs > 0 and self.max_seq_len > 0
        c = self.config
        shape = (self.max_seqs, self.max_seq_len, c.num_key_value_heads, c.head_dim)
        self._layers = [(cuda.device_array(shape, np.float32), cuda.device_array(shape, np.float32))
                        for _ in range(c.num_hidden_layers)]
        self._free_slots = list(range(self.max_seqs - 1, -1, -1))

    @property
    def bytes(self) -> int:
        c = self.config
        return 2 * c.num_hidden_layers * self.max_seqs * self.max_seq_len * c.num_key_value_heads * c.head_dim * 4

    def layer(self, i: int):
        return self._layers[i]

    @property
    def free_slot_count(self) -> int:
        return len(self._free_slots)

    def allocate_slot(self) -> int:
        assert self._free_slots, "no free KV cache slot"
        return self._free_slots.pop()

    def free_slot(self, slot: int) -> None:
        assert 0 <= slot < self.max_seqs and slot not in self._free_slots
        self._free_slots.append(slot)
