"""Batch invariance: a request's tokens and logprobs do not depend on what else shares its steps, bit for bit
(KernelPlan.batch_invariant; docs/batch-invariance.md). One request (TARGET) run alone in a fresh engine against
the same request among others of different lengths: with chunked prefill at different chunk boundaries and
without it, after a prefix-cache hit, and preempted and recomputed, in both precisions, in the simulator on the
demo model, on a GPU too (TINYVLLM_TEST_GPU=1). Greedy, so the tokens follow the logits; the top-3 logprobs of every output token are compared as
float32 with np.array_equal (no tolerance: one reduction in another order moves their last bits)."""
import numpy as np
import pytest

from tinyvllm.cli import parse_args
from tinyvllm.engine.args import build_engine, engine_config_from_args
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.errors import TinyVLLMError
from tinyvllm.model.loader import load_model

PARAMS = SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True)
TARGET = [1, *range(300, 312)]                   # 13 tokens: 3 full blocks of 4 and one more token
OTHERS = [[1, *range(500, 506)], [1, *range(100, 121)]]  # 7 and 22 tokens (the demo model has 640 ids)
SHARES_A_PREFIX = TARGET[:9] + [600, 601, 602]   # TARGET's first two blocks of 4, then its own
PRECISIONS = ("fp32", "fast")


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def engine(model, precision: str, **options) -> LLMEngine:
    options = {"num_blocks": 64, "block_size": 4, "precision": precision, "batch_invariant": True, **options}
    return LLMEngine(model, EngineConfig(**options), log=lambda message: None)


def result(out) -> tuple[list[int], list[list[int]], np.ndarray]:
    """(tokens, each token's logprob ids in order, their logprobs as float32)."""
    assert out.finish_reason == "length", out.error
    return (out.token_ids, [list(entry) for entry in out.logprobs],
            np.array([list(entry.values()) for entry in out.logprobs], dtype=np.float32))


def assert_same_bits(got, alone):
    assert got[0] == alone[0], "tokens"
    assert got[1] == alone[1], "logprob ids"
    assert np.array_equal(got[2], alone[2]), f"logprobs differ by up to {np.max(np.abs(got[2] - alone[2])):.3g}"


_alone = {}


def alone(model, precision: str):
    """TARGET's result in a fresh engine, alone, without a prefix hit (once per precision)."""
    if precision not in _alone:
        (out,) = engine(model, precision).generate([TARGET], PARAMS)
        _alone[precision] = result(out)
    return _alone[precision]


def among_others(model, precision: str, **options):
    """TARGET's result batched with OTHERS, TARGET in the middle."""
    outs = engine(model, precision, **options).generate([OTHERS[0], TARGET, OTHERS[1]], PARAMS)
    assert all(out.finish_reason == "length" for out in outs), [out.error for out in outs]
    return result(outs[1])


# fast in the simulator emulates every mma: about 6x fp32's time, so its case joins the slow tests (the quick loop
# keeps test_kernel_plan's check that the simulator's fast plan sends a lone row to gemm_tc)
@pytest.mark.parametrize("precision", ["fp32", pytest.param("fast", marks=pytest.mark.slow)])
def test_alone_and_among_others_in_chunks_of_8_give_the_same_bits(model, precision):
    # a budget of 8 tokens cuts every prompt into chunks and puts TARGET's decode steps beside others' prefill
    assert_same_bits(among_others(model, precision, max_num_batched_tokens=8), alone(model, precision))


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("options", [dict(max_num_batched_tokens=5), dict(), dict(chunked_prefill=False)],
                         ids=["chunks-of-5", "one-step-prefill", "no-chunked-prefill"])
def test_other_chunk_boundaries_and_no_chunking_give_the_same_bits(model, precision, options):
    assert_same_bits(among_others(model, precision, **options), alone(model, precision))


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_prefix_cache_hit_gives_the_same_bits(model, precision):
    e = engine(model, precision)
    e.generate([SHARES_A_PREFIX], PARAMS)
    (out,) = e.generate([TARGET], PARAMS)
    assert e.request(out.request_id).seq.num_cached_tokens == 8, "TARGET's first two blocks come from the cache"
    assert_same_bits(result(out), alone(model, precision))


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_preemption_and_recompute_give_the_same_bits(model, precision):
    # 12 blocks of 4 hold the three prompts (6 + 2 + 4) and no more: the short one's third block preempts the
    # most recently added, TARGET, which then runs again from its prompt and output so far
    e = engine(model, precision, num_blocks=12)
    outs = e.generate([OTHERS[1], OTHERS[0], TARGET], PARAMS)
    assert all(out.finish_reason == "length" for out in outs), [out.error for out in outs]
    assert e.request(outs[2].request_id).seq.num_preemptions > 0, "TARGET was preempted and recomputed"
    assert_same_bits(result(outs[2]), alone(model, precision))


@pytest.mark.parametrize("argv, setting, invariant", [
    (["generate"], None, True),  # the default: on, the simulator's (and fp32's) plans cost nothing for it
    (["generate", "--batch-invariant"], True, True),
    (["generate", "--no-batch-invariant"], False, False)])
def test_the_flag_reaches_the_kernel_plan(argv, setting, invariant):
    engine = build_engine(parse_args(argv))  # generate, serve, debug, trace, eval
    assert engine.config.batch_invariant is setting and engine.runner.plan.batch_invariant is invariant


@pytest.mark.parametrize("argv, invariant", [(["eval"], True), (["eval", "--no-batch-invariant"], False),
                                             (["check-goldens"], True), (["debug"], True)])
def test_commands_that_compare_runs_are_invariant_unless_told(argv, invariant):
    assert engine_config_from_args(parse_args(argv), reference=True).batch_invariant is invariant
    assert engine_config_from_args(parse_args(argv)).batch_invariant in (None, False)


def test_the_default_leaves_out_only_the_fast_precision_on_a_gpu():
    default, on, off = EngineConfig(), EngineConfig(batch_invariant=True), EngineConfig(batch_invariant=False)
    assert [default.invariant_for(p, simulator) for p in ("fp32", "fast") for simulator in (True, False)] == [
        True, True, True, False]
    assert all(on.invariant_for(p, s) for p in ("fp32", "fast") for s in (True, False))
    assert not any(off.invariant_for(p, s) for p in ("fp32", "fast") for s in (True, False))


@pytest.mark.parametrize("setting", ["off", 0, 1])
def test_a_setting_other_than_true_false_or_none_is_refused(setting):
    # "off" would otherwise read as true, 0 as false: the engine would run what was not asked
    with pytest.raises(TinyVLLMError, match=f"batch_invariant must be True, False or None, got {setting!r}"):
        EngineConfig(batch_invariant=setting)


@pytest.mark.slow  # (the simulator's wgmma twin: minutes)
def test_steps_large_enough_for_wgmma_give_the_same_bits(model, monkeypatch):
    """Where the plan has wgmma, steps of WGMMA_MIN_ROWS rows or more run their GEMMs on gemm_wgmma: TARGET alone
    (13 rows, gemm_tc) and among others in one 42-row step (gemm_wgmma) get the same bits."""
    import tinyvllm.runner.kernel_plan as kernel_plan
    import tinyvllm.runner.model_runner as model_runner
    from kernels_numba.common import SIMULATOR
    from kernels_numba.wgmma import wgmma_available
    if not SIMULATOR and not wgmma_available():
        pytest.skip("this GPU has no wgmma (compute capability 9.0)")
    monkeypatch.setattr(model_runner, "wgmma_available", lambda: True)
    monkeypatch.setattr(kernel_plan, "WGMMA_MIN_ROWS", 16)
    alone_engine = engine(model, "fast")
    assert alone_engine.runner.forward_pass.plan.wgmma
    (out,) = alone_engine.generate([TARGET], PARAMS)
    outs = engine(model, "fast").generate([OTHERS[0], TARGET, OTHERS[1]], PARAMS)
    assert_same_bits(result(outs[1]), result(out))
    assert_same_bits(result(out), alone(model, "fast"))
