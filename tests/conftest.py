"""Tests run in numba's CUDA simulator unless TINYVLLM_TEST_GPU=1 (then on the real GPU).
With TINYVLLM_REQUIRE_REFERENCES=1 a missing independent reference fails instead of skipping (tests/references.py)."""
import os

if os.environ.get("TINYVLLM_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import zlib

import numpy as np
import pytest

from tests.references import fail_skipped_imports, skip_reason

pytest_plugins = ["pytester"]  # tests/test_references.py runs small suites of its own


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())  # not hash(): that is salted per process
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def auto_precision_is_fp32(monkeypatch):
    """Engines the tests build run the fp32 reference path unless a test asks for "fast": the goldens and the HF float32
    comparisons need it, and on a GPU (TINYVLLM_TEST_GPU=1) "auto" would pick fast (in the simulator it is fp32)."""
    import tinyvllm.runner.model_runner
    from tinyvllm.runner.kernel_plan import resolve_precision
    monkeypatch.setattr(tinyvllm.runner.model_runner, "resolve_precision",
                        lambda requested, dtype: resolve_precision("fp32" if requested == "auto" else requested, dtype))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        fail_skipped_imports(report, skip_reason(report.longrepr))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        fail_skipped_imports(report, skip_reason(report.longrepr))
