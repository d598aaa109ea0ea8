"""TINYVLLM_REQUIRE_REFERENCES=1 turns a missing independent reference from a skip into a failure."""
import pytest

from tests.references import REQUIRE_ENV

INNER_TESTS = '''
import pytest
from tests.references import require

def test_through_require():
    require("tinyvllm_no_such_reference")

def test_through_importorskip():
    pytest.importorskip("tinyvllm_no_such_reference")

def test_other_skips_stay_skips():
    pytest.skip("not applicable here")

def test_present_reference_runs():
    assert require("numpy").zeros(1).shape == (1,)
'''
INNER_CONFTEST = '''
import pytest
from tests.references import fail_skipped_imports

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_skipped_imports(outcome.get_result(), call)
'''


@pytest.mark.parametrize("required", [False, True])
def test_a_missing_reference_skips_locally_and_fails_when_required(pytester, monkeypatch, required):
    if required:
        monkeypatch.setenv(REQUIRE_ENV, "1")
    else:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")
    if required:
        result.assert_outcomes(failed=2, skipped=1, passed=1)
        result.stdout.fnmatch_lines(["*missing independent reference*tinyvllm_no_such_reference*"])
    else:
        result.assert_outcomes(skipped=3, passed=1)
