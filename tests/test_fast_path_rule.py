"""The pass rule of scripts/fast_path_compare.py (numpy only): the 2x-spread rule over ordinary elements, and
massive activations apart, in bf16 ulps of their value against HF bf16's own error there, floored at one ulp."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from fast_path_compare import bf16_ulp, massive_mask, split_check  # noqa: E402


def stage(rng):
    """A stage of 12 tokens x 32 channels with one massive element, like SmolLM2's sink: token 0, channel 5."""
    fp32 = rng.standard_normal((12, 32))
    fp32[0, 5] = 24884.57
    return fp32


def test_massive_elements_are_those_far_above_the_typical_token_max():
    fp32 = stage(np.random.default_rng(1))
    mask = massive_mask(fp32)
    assert mask[0, 5] and mask.sum() == 1
    assert not massive_mask(np.random.default_rng(2).standard_normal((12, 32))).any()
    assert bf16_ulp(np.array([24884.57, 3064.0, 1.0, -1.5]))[:4].tolist() == [128.0, 16.0, 2.0**-7, 2.0**-7]


def test_the_rule_passes_the_fast_path_within_twice_hf_bf16s_own_errors_and_fails_past_them():
    rng = np.random.default_rng(3)
    fp32 = stage(rng)
    noise = rng.standard_normal(fp32.shape)
    hf = fp32 + 1e-3 * noise                      # HF bf16's spread: ~1e-3 of the ordinary elements' scale
    hf[0, 5] = fp32[0, 5] + 0.2 * 128             # and 0.2 ulp at the massive element
    fast = fp32 + 1.5e-3 * rng.standard_normal(fp32.shape)
    fast[0, 5] = fp32[0, 5] + 1.5 * 128           # 1.5 ulps <= 2 x max(0.2, 1): passes
    result = split_check(fast, hf, fp32)
    assert result["massive"] == 1 and abs(result["massive_fast_ulps"] - 1.5) < 1e-9 and result["passed"]
    assert abs(result["massive_hf_bf16_ulps"] - 0.2) < 1e-9
    fast[0, 5] = fp32[0, 5] + 2.5 * 128           # past 2 x the one-ulp floor
    assert not split_check(fast, hf, fp32)["passed"]
    hf[0, 5] = fp32[0, 5] + 1.5 * 128             # ... unless HF bf16's own error there is as large
    assert split_check(fast, hf, fp32)["passed"]
    fast = fp32 + 5e-3 * noise                    # ordinary elements 5x HF's spread: fails, massive or not
    fast[0, 5] = fp32[0, 5]
    result = split_check(fast, hf, fp32)
    assert not result["passed"] and result["fast_vs_hf_fp32_rest"] > 2 * result["spread_rest"]
