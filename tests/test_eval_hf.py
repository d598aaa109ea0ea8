"""The HF transformers reference of scripts/eval_compare_hf.py and eval_bench.py, on the demo model (CPU):
its choice scores against the golden file's HF logits, so the script compares like with like."""
import numpy as np
import pytest

from tests.references import require
torch = require("torch")
require("transformers")

from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR  # noqa: E402
from tinyvllm.evaluation.backends import Failure, LoglikelihoodJob  # noqa: E402
from tinyvllm.evaluation.hf_scoring import HFBackend, load_hf_model  # noqa: E402
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens  # noqa: E402
from tests.helpers import hf_log_softmax  # noqa: E402


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-5), ("bfloat16", 0.5)])
def test_hf_backend_scores_match_golden_logits(dtype, atol):
    # float32: the golden file's own computation, batched and right-padded (1e-5: float32 summation order);
    # bf16 (the benchmark's baseline) is only roughly the same.
    goldens = Goldens.load(DEFAULT_GOLDENS).prompts
    backend = HFBackend(load_hf_model(DEMO_MODEL_DIR, "cpu", dtype), batch_tokens=64)
    jobs, expected = [], []
    for g, k in zip(goldens, (17, 29, 11)):
        ids, hf = g["input_ids"].tolist(), hf_log_softmax(g)
        t0, t1, t2 = ids[k:k + 3]
        x = (t1 + 7) % 640
        jobs += [LoglikelihoodJob(ids[:k], [(t0, t1), (t0, x), (5,), (t0, t1, t2)]),
                 LoglikelihoodJob(ids[:k], [(5,), (t0,), (9,), (x,)])]
        expected += [[hf[k - 1, t0] + hf[k, t1], hf[k - 1, t0] + hf[k, x], hf[k - 1, 5],
                      hf[k - 1, t0] + hf[k, t1] + hf[k + 1, t2]],
                     [hf[k - 1, 5], hf[k - 1, t0], hf[k - 1, 9], hf[k - 1, x]]]
    results = {}
    backend.loglikelihoods(jobs, lambda j, r: results.__setitem__(j, r))
    got = np.array([results[j] for j in range(len(jobs))])
    np.testing.assert_allclose(got, np.array(expected), rtol=0, atol=atol)
    assert backend.sequences_run == 3 * 3  # per golden prefix: the prompt, + t0, + t0 t1 (shared by the jobs)


def test_hf_backend_time_limit_reports_unrun_jobs():
    backend = HFBackend(load_hf_model(DEMO_MODEL_DIR, "cpu"), deadline=0.0)
    results = {}
    backend.loglikelihoods([LoglikelihoodJob([1, 2, 3], [(4,), (5,)])], lambda j, r: results.__setitem__(j, r))
    assert isinstance(results[0], Failure) and "time limit" in results[0].message
