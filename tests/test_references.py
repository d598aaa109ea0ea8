"""TINYVLLM_REQUIRE_REFERENCES=1 turns a missing independent reference from a skip into a failure."""
from pathlib import Path

import pytest

from tests.references import REQUIRE_ENV

CONFTEST = Path(__file__).parent / "conftest.py"

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
INNER_MODULE_SKIP = '''
import pytest
pytest.importorskip("tinyvllm_no_such_reference")

def test_never_collected():
    pass
'''


@pytest.mark.parametrize("required", [False, True])
def test_a_missing_reference_skips_locally_and_fails_when_required(pytester, monkeypatch, required):
    if required:
        monkeypatch.setenv(REQUIRE_ENV, "1")
    else:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
    pytester.makeconftest(CONFTEST.read_text())  # the suite's own hooks
    pytester.makepyfile(test_inner=INNER_TESTS, test_inner_module=INNER_MODULE_SKIP)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA", "--continue-on-collection-errors")
    if required:
        result.assert_outcomes(failed=2, errors=1, skipped=1, passed=1)
        result.stdout.fnmatch_lines(["*missing independent reference*tinyvllm_no_such_reference*"])
    else:
        result.assert_outcomes(skipped=4, passed=1)
