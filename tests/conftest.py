"""Tests run in numba's CUDA simulator unless TINYVLLM_TEST_GPU=1 (then on the real GPU)."""
import os

if os.environ.get("TINYVLLM_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())  # not hash(): that is salted per process
    return np.random.default_rng(seed)
