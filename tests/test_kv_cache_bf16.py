"""The demo model generating with a bf16 KV cache (EngineConfig.kv_cache_dtype = "bfloat16", --kv-cache-dtype).

The only difference from the float32 cache is that K and V are rounded to bf16 (nearest even, relative error at
most u = 2^-9) when written: every kernel then computes the float32 math on the rounded values. So:
- layer 0's q, k and v are bit-identical in both runs, its pool holds exactly their bf16 rounding, and its attention
  moves by at most the rounding's effect: each score s_j = scale q . k_j by at most E = u scale sum_d |q_d k_jd|, so
  each softmax weight by a factor within exp(+-2E), and each value by u |v|: |d attn| <= (expm1(2E) + u) max|v|,
  plus the float32 path's own error (test_paged_attention's _tolerance, ~1e-5 here; 1e-4 allowed);
- the logits stay finite and within LOGITS_RTOL = 2^-5 (16 u) of the largest float32 logit (measured on the demo:
  8e-3, about 4 u: its random weights give sharp attention, which amplifies the rounding, and two layers pass it
  on), and the greedy tokens are the same while the float32 run's top-2 margin exceeds twice that;
- (simulator) a float32 pool whose writes round to bf16 gives the bf16 pool's prefill logits bit for bit: nothing
  but the K/V rounding differs.
"""
import ml_dtypes
import numpy as np
import pytest

import kernels_numba.rope as rope_module
from kernels_numba.common import SIMULATOR
from kernels_numba.kv_dtype import kv_encode_ref, kv_from_f32
from tinyvllm.bench import config_from_args
from tinyvllm.cli import parse_args
from tinyvllm.engine.args import build_engine
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.runner.kv_pool import resolve_kv_cache_dtype
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import SamplingParams

PROMPT = "A small dog ran"
NEW_TOKENS = 2
U_BF16 = 2.0**-9
LOGITS_RTOL = 2.0**-5


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def _generate(model, kv_cache_dtype, new_tokens=NEW_TOKENS):
    """(engine, one dict per step of every stage's output and its "slots") for PROMPT's greedy continuation."""
    # fp32 precision in both runs, so that only the cache differs (the fast path's attention rounds K/V to bf16 anyway)
    config = EngineConfig(num_blocks=16, block_size=4, kv_cache_dtype=kv_cache_dtype, precision="fp32")
    engine = LLMEngine(model, config, log=lambda message: None)
    engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    steps = []
    while engine.has_unfinished_requests():
        steps.append({stage.name: stage.to_host() for stage in engine.step_stages()})
        steps[-1]["slots"] = np.array(engine.last_batch.slot_mapping)
    return engine, steps


@pytest.fixture(scope="module")
def runs(model):
    return {dtype: _generate(model, dtype) for dtype in ("float32", "bfloat16")}


def test_layer_0_pool_holds_the_rounded_kv_and_attention_moves_within_the_rounding_bound(runs):
    (f32_engine, f32_steps), (bf16_engine, bf16_steps) = runs["float32"], runs["bfloat16"]
    assert bf16_engine.kv_pool.layer(0)[0].dtype == np.uint16 and f32_engine.kv_pool.layer(0)[0].dtype == np.float32
    prefill_f32, prefill_bf16 = f32_steps[0], bf16_steps[0]
    for stage in ("layers.0.q", "layers.0.k", "layers.0.v"):
        np.testing.assert_array_equal(prefill_bf16[stage], prefill_f32[stage])  # before the cache: the same bits
    # Every token's layer-0 k and v depend on the token and its position only: the same greedy tokens (checked
    # below) give the same bits, so each written slot of the bf16 pool holds the float32 pool's value, rounded.
    slots = np.concatenate([step["slots"] for step in f32_steps])
    np.testing.assert_array_equal(slots, np.concatenate([step["slots"] for step in bf16_steps]))
    for f32_pool, bf16_pool in zip(f32_engine.kv_pool.layer(0), bf16_engine.kv_pool.layer(0)):
        f32_rows = f32_pool.copy_to_host().reshape(-1, *f32_pool.shape[2:])[slots]
        bf16_rows = bf16_pool.copy_to_host().reshape(-1, *bf16_pool.shape[2:])[slots]
        np.testing.assert_array_equal(bf16_rows, kv_encode_ref(f32_rows, np.uint16))

    q, k, v = (prefill_f32[f"layers.0.{name}"].astype(np.float64) for name in ("q", "k", "v"))
    n_heads, n_kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    scale = head_dim**-0.5
    bound = np.empty((len(q), n_heads, 1))
    for t in range(len(q)):  # the prompt's query t sees keys 0..t
        for h in range(n_heads):
            keys, values = k[: t + 1, h // (n_heads // n_kv_heads)], v[: t + 1, h // (n_heads // n_kv_heads)]
            score_err = U_BF16 * scale * (np.abs(keys) @ np.abs(q[t, h])).max()
            bound[t, h] = (np.expm1(2 * score_err) + U_BF16) * np.abs(values).max() + 1e-4
    moved = np.abs(prefill_bf16["layers.0.attn"] - prefill_f32["layers.0.attn"]).reshape(q.shape)
    assert (moved <= bound).all(), f"worst moved / bound {(moved / bound).max()}"
    assert moved.max() > 0, "the bf16 cache changed nothing: is it used?"


def test_logits_stay_finite_and_close_to_the_float32_cache(runs):
    (_, f32_steps), (_, bf16_steps) = runs["float32"], runs["bfloat16"]
    assert len(f32_steps) == len(bf16_steps) == NEW_TOKENS
    for step, (f32, bf16) in enumerate(zip(f32_steps, bf16_steps)):
        f32_logits, bf16_logits = f32["logits"], bf16["logits"]
        assert np.isfinite(bf16_logits).all()
        tol = LOGITS_RTOL * np.abs(f32_logits).max()
        assert np.abs(bf16_logits - f32_logits).max() <= tol, f"step {step}"
        top2 = np.sort(f32_logits, axis=1)[:, -2:]
        if (top2[:, 1] - top2[:, 0]).min() <= 2 * tol:
            break  # a near tie: the two runs may pick different tokens from here on
        np.testing.assert_array_equal(bf16_logits.argmax(axis=1), f32_logits.argmax(axis=1))


@pytest.mark.skipif(not SIMULATOR, reason="swaps a device function, which only the simulator calls as Python")
def test_a_float32_cache_written_in_bf16_values_gives_the_bf16_cache_bit_for_bit(model, runs, monkeypatch):
    def round_to_bf16(x, pool):  # a float32 pool now holds exactly what a bf16 pool decodes to
        bits = kv_from_f32(x, np.empty(0, np.uint16))
        return np.float32(np.uint16(bits).view(ml_dtypes.bfloat16))
    monkeypatch.setattr(rope_module, "kv_from_f32", round_to_bf16)
    _, rounded_steps = _generate(model, "float32", new_tokens=1)  # the prefill step (the simulator is slow)
    np.testing.assert_array_equal(rounded_steps[0]["logits"].view(np.uint32),
                                  runs["bfloat16"][1][0]["logits"].view(np.uint32))


def test_check_goldens_runs_a_float32_cache_and_the_flag_reaches_the_engine():
    # auto: float32 with the fp32 precision (check-goldens always runs fp32), bfloat16 with the fast one
    for command in ("check-goldens", "generate", "serve", "bench"):
        assert parse_args([command]).kv_cache_dtype == "auto"
    assert EngineConfig().kv_cache_dtype == "auto" and parse_args(["check-goldens"]).precision == "fp32"
    assert resolve_kv_cache_dtype("auto", "fp32") == "float32" and resolve_kv_cache_dtype("auto", "fast") == "bfloat16"
    assert resolve_kv_cache_dtype("float32", "fast") == "float32"
    engine = build_engine(parse_args(["generate", "--num-blocks", "4", "--precision", "fp32"]))
    assert engine.kv_pool.dtype == "float32"  # auto on the reference path
    engine = build_engine(parse_args(["generate", "--num-blocks", "4", "--kv-cache-dtype", "bfloat16"]))
    assert engine.kv_pool.dtype == "bfloat16" and engine.kv_pool.layer(0)[1].dtype == np.uint16
    bench = config_from_args(parse_args(["bench", "--kv-cache-dtype", "bfloat16"]))
    assert bench.kv_cache_dtype == "bfloat16"
