"""Log-probabilities through the engine (SamplingParams.logprobs / prompt_logprobs / logprob_token_ids),
checked against HF transformers' logits in the golden file: an independent reference.

Tolerance: the golden logits stage matches HF to ~4e-6 of max|logit| (docs/internals.md, "Tolerances"), i.e. ~3e-5 here;
a logprob is a logit minus a log-sum-exp whose error is at most the largest logit error, so 1e-4 is
about 2x that sum. A wrong row (off by one position), a missing max shift or a temperature applied to the
logprobs gives errors of 1e-1 or more.
"""
import numpy as np
import pytest

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import InvalidSamplingParams, SamplingParams
from tests.helpers import hf_log_softmax

pytestmark = pytest.mark.slow  # engine-level: logprobs of whole generations against HF

ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


@pytest.fixture(scope="module")
def goldens():
    return Goldens.load(DEFAULT_GOLDENS).prompts


def engine(model, **options) -> LLMEngine:
    options = {"num_blocks": 64, "block_size": 4, **options}
    return LLMEngine(model, EngineConfig(**options), log=lambda message: None)


def assert_top(entry: dict, row: np.ndarray, own: int, n: int):
    """entry = {own token: ..., then HF's n likeliest ids in order}, every value HF's within ATOL."""
    order = np.argsort(-row, kind="stable")
    if row[order[n - 1]] - row[order[n]] > 2 * ATOL:  # the top-n set is not a near tie at its edge
        assert list(entry) == list(dict.fromkeys([own, *order[:n].tolist()]))
    for t, value in entry.items():
        assert value == pytest.approx(row[t], abs=ATOL), t


def test_prompt_and_output_logprobs_match_hf(model, goldens):
    e = engine(model, max_num_batched_tokens=16)  # prompts of 27-41 tokens: chunked prefill over 2-3 steps
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=3, prompt_logprobs=2, ignore_eos=True)
    outs = e.generate([g["input_ids"].tolist() for g in goldens], params)
    for g, out in zip(goldens, outs):
        ids, hf = g["input_ids"].tolist(), hf_log_softmax(g)
        assert out.token_ids == g["greedy_ids"][:1].tolist()
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
        got = np.array([out.prompt_logprobs[p][ids[p]] for p in range(1, len(ids))])
        np.testing.assert_allclose(got, hf[np.arange(len(ids) - 1), ids[1:]], rtol=0, atol=ATOL)
        for p in range(1, len(ids)):
            assert_top(out.prompt_logprobs[p], hf[p - 1], ids[p], 2)
        (first,) = out.logprobs
        assert_top(first, hf[-1], out.token_ids[0], 3)
        assert list(first)[0] == out.token_ids[0] and first[out.token_ids[0]] == max(first.values())  # greedy


def test_logprobs_are_raw_and_aligned_with_tokens_while_sampling(model, goldens):
    ids = goldens[0]["input_ids"].tolist()
    hf = hf_log_softmax(goldens[0])
    eos = sorted(e_id for e_id in engine(model).eos_token_ids)[0]
    # temperature, top-k and min_tokens' EOS suppression change what is sampled, never the logprobs reported
    params = SamplingParams(temperature=1.7, top_k=5, seed=3, max_tokens=4, min_tokens=4, logprobs=0,
                            logprob_token_ids=(eos, 5))
    out = engine(model).generate([ids, "The sun rose"], [params, SamplingParams(temperature=0, max_tokens=4)])
    first, plain = out
    assert len(first.logprobs) == len(first.token_ids) == 4 and plain.logprobs is None and plain.prompt_logprobs is None
    for token, entry in zip(first.token_ids, first.logprobs):
        assert list(entry) == [token, eos, 5] or (token in (eos, 5) and len(entry) == 2)
        assert all(np.isfinite(v) and v < 0 for v in entry.values())
    for t in (first.token_ids[0], eos, 5):
        assert first.logprobs[0][t] == pytest.approx(hf[-1, t], abs=ATOL)


def test_logprobs_do_not_change_tokens_and_prompt_logprobs_skip_the_prefix_cache(model, goldens):
    ids = goldens[1]["input_ids"].tolist()
    e = engine(model)
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first = e.generate([ids], greedy)[0]
    again = e.generate([ids, ids], [greedy, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                                            prompt_logprobs=0, logprobs=1)])
    assert again[0].token_ids == again[1].token_ids == first.token_ids
    assert e.block_manager.prefix_hit_tokens > 0  # the plain request did reuse the cached prompt blocks
    assert all(entry is not None for entry in again[1].prompt_logprobs[1:])
    np.testing.assert_allclose([again[1].prompt_logprobs[p][ids[p]] for p in range(1, len(ids))],
                               hf_log_softmax(goldens[1])[np.arange(len(ids) - 1), ids[1:]], rtol=0, atol=ATOL)


def test_bad_logprob_requests_name_the_field(model):
    with pytest.raises(InvalidSamplingParams, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(InvalidSamplingParams, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    with pytest.raises(InvalidSamplingParams, match="logprob_token_ids"):
        SamplingParams(logprob_token_ids=[3, -2])
    out = engine(model).generate(["The sun rose"], SamplingParams(max_tokens=1, logprob_token_ids=[10**6]))[0]
    assert out.finish_reason == "error" and "logprob_token_ids" in out.error
