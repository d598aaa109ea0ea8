"""lessons/prefill_tc_original.py: prefill_tc with every refinement off, within prefill_tc's error bound."""
import numpy as np
import pytest

from kernels_numba.attention.prefill_tc import TC_OPTIONS
from lessons.prefill_tc_original import ORIGINAL_OPTIONS
from tests.test_prefill_tc import PIPELINE_SPECS, _check_tc

pytestmark = pytest.mark.slow  # a lesson's big simulator kernels


@pytest.mark.parametrize("options", [ORIGINAL_OPTIONS], ids=["original"])
def test_prefill_tc_other_options_still_match(rng, options):
    # ORIGINAL_OPTIONS (kept to time old against new: unpipelined, e-based, f32_to_bf16 packing, every tile masked)
    # within the same bound, on the bf16 pool it copies unpipelined
    assert options != TC_OPTIONS
    _check_tc(rng, PIPELINE_SPECS[:1], 4, 6, 2, 16, warps=2, kv_dtype=np.uint16, options=options)
