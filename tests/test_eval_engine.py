"""The engine as the evaluation backend: choice log-likelihoods checked against HF transformers' logits
in the golden file (an independent reference), and the generation adapter against a plain generate.

Tolerance: the engine's logprobs match HF's log_softmax within 1e-4 (tests/test_engine_logprobs.py says
why); a choice's score sums up to three of them, so 3e-4. A wrong trie node (a token missing from the
prompt, an off-by-one position) or a logprob of the wrong token is off by 1e-1 or more.
"""
import collections
import gc

import numpy as np
import pytest

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.evaluation.backends import EngineBackend, Failure, Generation, GenerationJob, LoglikelihoodJob
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import SamplingParams
from tests.helpers import hf_log_softmax

pytestmark = pytest.mark.slow  # engine-level: whole eval tasks on the demo model

ATOL = 3e-4


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


@pytest.fixture(scope="module")
def goldens():
    return Goldens.load(DEFAULT_GOLDENS).prompts


def engine(model, **options) -> LLMEngine:
    return LLMEngine(model, EngineConfig(**{"num_blocks": 64, "block_size": 4, **options}), log=lambda m: None)


def collect(run, jobs):
    results = {}
    run(jobs, lambda j, result: results.__setitem__(j, result))
    assert sorted(results) == list(range(len(jobs)))
    return [results[j] for j in range(len(jobs))]


def test_choice_loglikelihoods_match_hf_golden_logits(model, goldens):
    # A job's prompt is a golden prompt's first k tokens; its continuations go on along the golden tokens
    # (so every trie node's prompt is a golden prefix whose next-token distribution HF computed) or stop
    # after one free token.
    e = engine(model)
    backend = EngineBackend(e)
    prompts = []
    add_request = e.add_request
    e.add_request = lambda prompt, *args: prompts.append(list(prompt)) or add_request(prompt, *args)
    jobs, expected = [], []
    for g, k in zip(goldens[:2], (17, 29)):
        ids, hf = g["input_ids"].tolist(), hf_log_softmax(g)
        t0, t1, t2 = ids[k:k + 3]
        x, y = (t1 + 7) % 640, (t0 + 11) % 640
        jobs.append(LoglikelihoodJob(ids[:k], [(t0, t1), (t0, x), (y,), (t0, t1, t2)]))
        expected.append([hf[k - 1, t0] + hf[k, t1], hf[k - 1, t0] + hf[k, x], hf[k - 1, y],
                         hf[k - 1, t0] + hf[k, t1] + hf[k + 1, t2]])
        jobs.append(LoglikelihoodJob(ids[:k], [(5,), (t0,), (9,), (x,)]))  # single tokens: one request
        expected.append([hf[k - 1, 5], hf[k - 1, t0], hf[k - 1, 9], hf[k - 1, x]])
    scores = collect(backend.loglikelihoods, jobs)
    np.testing.assert_allclose(np.array(scores), np.array(expected), rtol=0, atol=ATOL)
    # one request per trie node: 3 for the multi-token jobs ((), (t0,), (t0, t1)), 1 for the others; each
    # released once read
    assert sorted(map(len, prompts)) == [17, 17, 18, 19, 29, 29, 30, 31] and not e._requests
    # the deeper nodes ran after their root and reused its cached prompt blocks (block size 4)
    assert e.block_manager.prefix_hit_tokens >= 2 * (16 + 28)


def test_a_failed_request_fails_only_its_job(model):
    backend = EngineBackend(engine(model))
    results = collect(backend.loglikelihoods, [LoglikelihoodJob([3, 4, 5], [(6,), (7,)]),
                                               LoglikelihoodJob([3, 4, 5], [(6,), (10**6,)])])
    assert len(results[0]) == 2 and all(np.isfinite(results[0]))
    assert isinstance(results[1], Failure) and "logprob_token_ids" in results[1].message


def test_two_tasks_on_one_engine_get_their_own_scores(model):
    """`tinyvllm eval --tasks mmlu,gpqa_diamond` runs each task through a new backend on the same engine (on the
    H200 the second task once stopped at a request id the first had used)."""
    e = engine(model)
    jobs = [LoglikelihoodJob([3, 4, 5], [(6,), (7,)])]
    first = collect(EngineBackend(e).loglikelihoods, jobs)
    second = collect(EngineBackend(e).loglikelihoods, jobs)
    assert first == second


def test_generation_adapter_gives_the_engines_greedy_text(model):
    prompts = [[384, 71, 72, 73], [384, 300, 301]]
    plain = engine(model).generate(prompts, SamplingParams(temperature=0, max_tokens=3, stop=("e",)))
    backend = EngineBackend(engine(model))
    results = collect(lambda jobs, done: backend.generate(jobs, 3, ("e",), done),
                      [GenerationJob(p, [], "") for p in prompts])
    assert [r.text for r in results] == [o.text for o in plain]
    assert all(isinstance(r, Generation) for r in results)
    assert [r.output_tokens for r in results] == [len(o.token_ids) for o in plain]


def test_scoring_leaves_no_reference_cycles_per_request(model):
    """EngineBackend scores with the cyclic garbage collector off (backends.without_cyclic_gc): what the engine
    and the backend make per request must be freed by reference counting alone, so the garbage a collection
    finds afterwards does not grow with the number of requests (a fixed few at most: the run's own closures)."""
    backend = EngineBackend(engine(model))

    def jobs(n):
        return [LoglikelihoodJob([3 + j, 4, 5], [(6,), (7, 8)]) for j in range(n)]
    sizes = (2, 8)
    for n in sizes:  # first-use caches: on a GPU each new batch size also captures its CUDA graph bucket
        collect(backend.loglikelihoods, jobs(n))
    garbage, kinds = [], []
    for n in sizes:
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # the collected objects stay in gc.garbage, to say what they are
        try:
            collect(backend.loglikelihoods, jobs(n))
            garbage.append(gc.collect())
            kinds.append(collections.Counter(type(o).__name__ for o in gc.garbage))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    # (on a GPU the first measured run collected 14 objects and the second none: a fixed few, not per request)
    assert garbage[1] <= garbage[0], (garbage, kinds[1] - kinds[0])
