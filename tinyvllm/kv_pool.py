"""The paged KV pool: per layer, K and V as float32 [num_blocks, block_size, n_kv_heads, head_dim].

Allocated once on the device. Token slot `block_id * block_size + offset`; which blocks belong to which
sequence is the BlockManager's business, and a sequence's block table is shared by all layers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels_numba.common import SIMULATOR, cuda

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
