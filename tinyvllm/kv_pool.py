"""The paged KV pool: per layer, K and V as float32 [num_blocks, block_size, n_kv_heads, head_dim].

Allocated once on the device. Token slot `block_id * block_size + offset`; which blocks belong to which
sequence is the BlockManager's business, and a sequence's block table is shared by all layers.

Default size (`default_num_blocks`): what the configuration can use, max_num_seqs sequences of max_model_len
tokens, plus one more such sequence with prefix caching (room for cached prefixes beside a full batch),
capped by gpu_memory_fraction of the free GPU memory (SIMULATOR_DEFAULT_BLOCKS in the simulator).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels_numba.common import SIMULATOR, cdiv, cuda

from .config import ModelConfig

SIMULATOR_DEFAULT_BLOCKS = 256


def bytes_per_block(config: ModelConfig, block_size: int) -> int:
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * 4


def blocks_that_fit(config: ModelConfig, block_size: int, memory_fraction: float) -> int:
    """How many blocks `memory_fraction` of the GPU's free memory holds (a fixed default in the simulator)."""
    if SIMULATOR:
        return SIMULATOR_DEFAULT_BLOCKS
    free, _total = cuda.current_context().get_memory_info()
    return int(free * memory_fraction) // bytes_per_block(config, block_size)


def blocks_usable(max_num_seqs: int, max_model_len: int, block_size: int, prefix_caching: bool) -> int:
    """The most blocks the scheduler can use: max_num_seqs sequences of max_model_len tokens, plus one more
    such sequence's worth with prefix caching, so a full batch leaves room for cached prefixes."""
    return (max_num_seqs + (1 if prefix_caching else 0)) * cdiv(max_model_len, block_size)


def default_num_blocks(config: ModelConfig, block_size: int, max_num_seqs: int, max_model_len: int,
                       prefix_caching: bool, memory_fraction: float) -> tuple[int, str]:
    """The pool size when none is given, and why (for the log): blocks_usable, capped by blocks_that_fit."""
    usable = blocks_usable(max_num_seqs, max_model_len, block_size, prefix_caching)
    fit = blocks_that_fit(config, block_size, memory_fraction)
    wanted = f"{max_num_seqs} sequences x {max_model_len} tokens" + (" + 1 for prefix caching" * prefix_caching)
    if usable <= fit:
        return usable, wanted
    where = "the simulator's default" if SIMULATOR else f"{memory_fraction:g} of free GPU memory"
    return fit, f"capped by {where}; {wanted} would use {usable}"


@dataclass
class KVPool:
    config: ModelConfig
    num_blocks: int
    block_size: int
    _layers: list = field(init=False, repr=False)

    def __post_init__(self):
        assert self.num_blocks > 0 and self.block_size > 0
        c = self.config
        shape = (self.num_blocks, self.block_size, c.num_key_value_heads, c.head_dim)
        self._layers = [(cuda.device_array(shape, np.float32), cuda.device_array(shape, np.float32))
                        for _ in range(c.num_hidden_layers)]

    @property
    def bytes(self) -> int:
        return self.num_blocks * bytes_per_block(self.config, self.block_size)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, i: int):
        return self._layers[i]
