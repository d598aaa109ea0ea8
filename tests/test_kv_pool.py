"""The KV pool's default size: what the configuration can use, capped by memory (the simulator's default)."""
import pytest

from tinyvllm import kv_pool
from tinyvllm.engine import EngineConfig, LLMEngine
from tinyvllm.kv_pool import SIMULATOR_DEFAULT_BLOCKS, blocks_usable, default_num_blocks
from tinyvllm.model import load_model


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def test_usable_blocks_are_every_sequence_at_full_length_plus_one_with_prefix_caching():
    # 100 tokens in blocks of 16: 7 blocks a sequence (the last one partly used)
    assert blocks_usable(max_num_seqs=4, max_model_len=100, block_size=16, prefix_caching=False) == 4 * 7
    assert blocks_usable(max_num_seqs=4, max_model_len=100, block_size=16, prefix_caching=True) == 5 * 7
    assert blocks_usable(max_num_seqs=1, max_model_len=16, block_size=16, prefix_caching=False) == 1


def test_memory_caps_what_the_configuration_could_use(model, monkeypatch):
    monkeypatch.setattr(kv_pool, "blocks_that_fit", lambda config, block_size, fraction: 50)
    num_blocks, why = default_num_blocks(model.config, 16, 8, 2048, True, 0.5)
    where = "the simulator's default" if kv_pool.SIMULATOR else "0.5 of free GPU memory"
    assert num_blocks == 50
    assert why == f"capped by {where}; 8 sequences x 2048 tokens + 1 for prefix caching would use {9 * 128}"
    num_blocks, why = default_num_blocks(model.config, 16, 2, 64, False, 0.5)
    assert num_blocks == 2 * 4 and why == "2 sequences x 64 tokens"


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
