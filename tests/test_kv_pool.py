"""The KV pool's default size: what the configuration can use, capped by memory (the simulator's default); its
element type (float32, or bf16 bits in uint16: half the bytes, twice the blocks)."""
import types

import numpy as np
import pytest

from tinyvllm.runner import kv_pool
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.kv_pool import (SIMULATOR_DEFAULT_BLOCKS, KVPool, blocks_that_fit, blocks_usable, bytes_per_block,
                              default_num_blocks)
from tinyvllm.model.loader import load_model


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def test_usable_blocks_are_every_sequence_at_full_length_plus_one_with_prefix_caching():
    # 100 tokens in blocks of 16: 7 blocks a sequence (the last one partly used)
    assert blocks_usable(max_num_seqs=4, max_model_len=100, block_size=16, prefix_caching=False) == 4 * 7
    assert blocks_usable(max_num_seqs=4, max_model_len=100, block_size=16, prefix_caching=True) == 5 * 7
    assert blocks_usable(max_num_seqs=1, max_model_len=16, block_size=16, prefix_caching=False) == 1


def test_memory_caps_what_the_configuration_could_use(model, monkeypatch):
    monkeypatch.setattr(kv_pool, "blocks_that_fit", lambda config, block_size, fraction, dtype, reserved_bytes: 50)
    num_blocks, why = default_num_blocks(model.config, 16, 8, 2048, True, 0.5)
    where = "the simulator's default" if kv_pool.SIMULATOR else "0.5 of free GPU memory"
    assert num_blocks == 50
    assert why == f"capped by {where}; 8 sequences x 2048 tokens + 1 for prefix caching would use {9 * 128}"
    num_blocks, why = default_num_blocks(model.config, 16, 2, 64, False, 0.5)
    assert num_blocks == 2 * 4 and why == "2 sequences x 64 tokens"


def test_memory_fraction_leaves_the_reserved_bytes_free(model, monkeypatch):
    # The prefill CUDA graphs' activations (EngineConfig.prefill_graphs) stay allocated beside the pool: a GPU with
    # 1,000 blocks' worth free (a stand-in for the driver's answer).
    per_block = bytes_per_block(model.config, 16)
    context = types.SimpleNamespace(get_memory_info=lambda: (1000 * per_block, 4000 * per_block))
    monkeypatch.setattr(kv_pool, "SIMULATOR", False)
    monkeypatch.setattr(kv_pool, "cuda", types.SimpleNamespace(current_context=lambda: context))
    assert blocks_that_fit(model.config, 16, 0.5) == 500
    assert blocks_that_fit(model.config, 16, 0.5, reserved_bytes=300 * per_block) == 500  # the other half holds it
    assert blocks_that_fit(model.config, 16, 0.9, reserved_bytes=300 * per_block) == 700
    assert blocks_that_fit(model.config, 16, 0.9, reserved_bytes=2000 * per_block) == 0
    _, why = default_num_blocks(model.config, 16, 100, 2048, False, 0.9, reserved_bytes=300 * per_block)
    assert why.startswith("capped by 0.9 of free GPU memory, ") and "GiB left for prefill graphs" in why


def test_an_engine_without_num_blocks_gets_what_it_can_use_and_logs_why(model):
    logged = []
    engine = LLMEngine(model, EngineConfig(max_num_seqs=2, max_model_len=64), log=logged.append)
    assert engine.kv_pool.num_blocks == engine.block_manager.num_blocks == (2 + 1) * 4
    line = next(m for m in logged if m.startswith("KV pool:"))
    assert line.startswith("KV pool: 12 blocks x 16 tokens")
    assert "2 sequences x 64 tokens + 1 for prefix caching" in line
    # the demo's default context (2048 tokens) x 8 sequences is more than the simulator's stand-in for memory
    engine = LLMEngine(model, EngineConfig(), log=logged.append)
    expected = SIMULATOR_DEFAULT_BLOCKS if kv_pool.SIMULATOR else 9 * 128  # the demo fits any GPU
    assert engine.kv_pool.num_blocks == expected
    engine = LLMEngine(model, EngineConfig(num_blocks=5), log=logged.append)
    assert engine.kv_pool.num_blocks == 5 and "as configured" in logged[-1]


def test_a_bf16_pool_is_uint16_and_half_the_bytes(model):
    c = model.config
    f32, bf16 = KVPool(c, 3, 4), KVPool(c, 3, 4, "bfloat16")
    assert bytes_per_block(c, 4) == 2 * c.num_hidden_layers * 4 * c.num_key_value_heads * c.head_dim * 4
    assert bytes_per_block(c, 4, "bfloat16") * 2 == bytes_per_block(c, 4) and bf16.bytes * 2 == f32.bytes
    for i in range(c.num_hidden_layers):
        for pool, dtype in ((f32, np.float32), (bf16, np.uint16)):
            k_pool, v_pool = pool.layer(i)
            assert k_pool.dtype == v_pool.dtype == dtype and k_pool.shape == (3, 4, c.num_key_value_heads, c.head_dim)
            assert k_pool.size * k_pool.dtype.itemsize * 2 * c.num_hidden_layers == pool.bytes
    with pytest.raises(AssertionError, match="float16"):
        KVPool(c, 3, 4, "float16")


def test_twice_the_bf16_blocks_fit_in_the_same_memory(model, monkeypatch):
    free = 10**9 + 12345
    context = types.SimpleNamespace(get_memory_info=lambda: (free, 2 * free))
    monkeypatch.setattr(kv_pool, "SIMULATOR", False)
    monkeypatch.setattr(kv_pool, "cuda", types.SimpleNamespace(current_context=lambda: context))
    f32 = blocks_that_fit(model.config, 16, 0.5)
    bf16 = blocks_that_fit(model.config, 16, 0.5, "bfloat16")
    assert f32 == int(free * 0.5) // bytes_per_block(model.config, 16) and bf16 in (2 * f32, 2 * f32 + 1)
    assert default_num_blocks(model.config, 16, 10**6, 2048, False, 0.5, "bfloat16")[0] == bf16


def test_an_engine_gets_the_kv_cache_dtype_it_asks_for(model):
    logged = []
    engine = LLMEngine(model, EngineConfig(num_blocks=5, kv_cache_dtype="bfloat16"), log=logged.append)
    assert engine.kv_pool.dtype == "bfloat16" and engine.kv_pool.layer(0)[0].dtype == np.uint16
    assert logged[-1].startswith("KV pool: 5 blocks x 16 tokens, bfloat16")
    with pytest.raises(TinyVLLMError, match="kv_cache_dtype must be auto or one of float32, bfloat16, got 'fp8'"):
        EngineConfig(kv_cache_dtype="fp8")
    engine = LLMEngine(model, EngineConfig(num_blocks=5, precision="fp32"), log=logged.append)  # auto: the fp32
    assert engine.kv_pool.dtype == "float32" and engine.kv_pool.layer(0)[0].dtype == np.float32  # path's float32
