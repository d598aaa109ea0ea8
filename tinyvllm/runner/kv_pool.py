"""The paged KV pool: per layer, K and V as [num_blocks, block_size, n_kv_heads, head_dim] device arrays.

Element type (`dtype`, EngineConfig.kv_cache_dtype / --kv-cache-dtype): "float32" (the default and the reference
path: goldens, check-goldens) or "bfloat16", stored as uint16 bf16 bit patterns (round to nearest even when
written; kernels_numba.kv_dtype): half the bytes per block, so twice the blocks in the same memory and half the
bytes for decode attention to read. Every kernel that writes or reads the pool handles both.

Allocated once on the device. Token slot `block_id * block_size + offset`; which blocks belong to which
sequence is the BlockManager's business, and a sequence's block table is shared by all layers.

Default size (`default_num_blocks`): what the configuration can use, max_num_seqs sequences of max_model_len
tokens, plus one more such sequence with prefix caching (room for cached prefixes beside a full batch),
capped by gpu_memory_fraction of the free GPU memory (SIMULATOR_DEFAULT_BLOCKS in the simulator).
"""
from __future__ import annotations

from dataclasses import dataclass, field


from kernels_numba.common import SIMULATOR, cdiv, cuda
from kernels_numba.kv_dtype import KV_DTYPES, kv_storage_dtype

from tinyvllm.model.config import ModelConfig
from tinyvllm.runner.choices import KV_CACHE_DTYPES

SIMULATOR_DEFAULT_BLOCKS = 256
assert tuple(KV_DTYPES) == KV_CACHE_DTYPES, "kv_dtype.KV_DTYPES stores each name choices.KV_CACHE_DTYPES gives"


def resolve_kv_cache_dtype(kv_cache_dtype: str, precision: str) -> str:
    """"auto" is bfloat16 with the fast precision (its attention reads bf16 anyway: half the bytes), float32 with
    the fp32 reference path; an explicit dtype stays as given."""
    assert precision in ("fp32", "fast"), precision
    if kv_cache_dtype == "auto":
        return "bfloat16" if precision == "fast" else "float32"
    assert kv_cache_dtype in KV_CACHE_DTYPES, kv_cache_dtype
    return kv_cache_dtype


def bytes_per_block(config: ModelConfig, block_size: int, dtype: str = "float32") -> int:
    """K and V of every layer for block_size tokens: 4 bytes an element in float32, 2 in bfloat16."""
    element_bytes = kv_storage_dtype(dtype).itemsize
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * element_bytes


def blocks_that_fit(config: ModelConfig, block_size: int, memory_fraction: float, dtype: str = "float32",
                    reserved_bytes: int = 0) -> int:
    """How many blocks `memory_fraction` of the GPU's free memory holds, leaving at least reserved_bytes free
    beside them (the prefill graphs' activations); a fixed default in the simulator."""
    if SIMULATOR:
        return SIMULATOR_DEFAULT_BLOCKS
    free, _total = cuda.current_context().get_memory_info()
    return max(0, min(int(free * memory_fraction), free - reserved_bytes)) // bytes_per_block(config, block_size, dtype)


def blocks_usable(max_num_seqs: int, max_model_len: int, block_size: int, prefix_caching: bool) -> int:
    """The most blocks the scheduler can use: max_num_seqs sequences of max_model_len tokens, plus one more
    such sequence's worth with prefix caching, so a full batch leaves room for cached prefixes."""
    return (max_num_seqs + (1 if prefix_caching else 0)) * cdiv(max_model_len, block_size)


def default_num_blocks(config: ModelConfig, block_size: int, max_num_seqs: int, max_model_len: int,
                       prefix_caching: bool, memory_fraction: float, dtype: str = "float32",
                       reserved_bytes: int = 0) -> tuple[int, str]:
    """The pool size when none is given, and why (for the log): blocks_usable, capped by blocks_that_fit."""
    usable = blocks_usable(max_num_seqs, max_model_len, block_size, prefix_caching)
    fit = blocks_that_fit(config, block_size, memory_fraction, dtype, reserved_bytes)
    wanted = f"{max_num_seqs} sequences x {max_model_len} tokens" + (" + 1 for prefix caching" * prefix_caching)
    if usable <= fit:
        return usable, wanted
    where = "the simulator's default" if SIMULATOR else (
        f"{memory_fraction:g} of free GPU memory" + (f", {reserved_bytes / 2**30:.2f} GiB left for prefill graphs"
                                                     if reserved_bytes else ""))
    return fit, f"capped by {where}; {wanted} would use {usable}"


@dataclass
class KVPool:
    config: ModelConfig
    num_blocks: int
    block_size: int
    dtype: str = "float32"  # or "bfloat16" (uint16 bit patterns)
    _layers: list = field(init=False, repr=False)

    def __post_init__(self):
        assert self.num_blocks > 0 and self.block_size > 0
        assert self.dtype in KV_DTYPES, f"kv cache dtype is one of {', '.join(KV_DTYPES)}, got {self.dtype!r}"
        c = self.config
        shape = (self.num_blocks, self.block_size, c.num_key_value_heads, c.head_dim)
        storage = kv_storage_dtype(self.dtype)
        self._layers = [(cuda.device_array(shape, storage), cuda.device_array(shape, storage))
                        for _ in range(c.num_hidden_layers)]

    @property
    def bytes(self) -> int:
        return self.num_blocks * bytes_per_block(self.config, self.block_size, self.dtype)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, i: int):
        return self._layers[i]
