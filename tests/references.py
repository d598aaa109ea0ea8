"""Independent references some tests check against: torch, transformers, Meta's Llama 3 tokenizer.model.

Locally a missing reference skips the tests that need it. With TINYVLLM_REQUIRE_REFERENCES=1 (CI sets it)
it fails them instead, so a suite whose cross-checks did not run cannot pass. pytest.importorskip called
directly is caught too (conftest.py turns its skip into a failure under the same variable).
"""
import importlib
import os

import pytest

REQUIRE_ENV = "TINYVLLM_REQUIRE_REFERENCES"
MISSING = "missing independent reference"
IMPORTORSKIP_PREFIX = "could not import"  # the start of pytest.importorskip's skip message


def references_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def missing_reference(what: str):
    """End the running test (or, at module level, the module): a skip, or a failure when references are
    required."""
    message = f"{MISSING}: {what}"
    if references_required():
        pytest.fail(f"{message} ({REQUIRE_ENV}=1 makes a missing reference a failure)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require(module: str, install: str = ""):
    """Import and return `module`, an independent reference (or the client) the running test or module
    checks with; `install` says how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing_reference(f"{module} ({e}){': ' + install if install else ''}")


def fail_skipped_imports(report, reason: str) -> None:
    """With references required, a test or module that pytest.importorskip skipped is reported as failed."""
    if references_required() and report.skipped and reason.startswith(IMPORTORSKIP_PREFIX):
        report.outcome = "failed"
        report.longrepr = f"{MISSING}: {reason} ({REQUIRE_ENV}=1 makes a missing reference a failure)"


def skip_reason(longrepr) -> str:
    """A skip report's reason: its longrepr is (path, line, "Skipped: reason")."""
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")
