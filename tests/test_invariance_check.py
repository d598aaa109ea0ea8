"""scripts/invariance_check.py, batch invariance measured (each prompt alone, then all together): its comparison of
two runs on hand-made ones, and the script run as a user runs it (a subprocess, the demo model, the simulator)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "invariance_check.py"


sys.path.insert(0, str(ROOT / "scripts"))
import invariance_check as check  # noqa: E402


def test_two_runs_part_at_the_first_differing_token_and_only_earlier_logprobs_count():
    alone = check.Run([5, 7, 3], [{5: -0.5}, {7: -0.25, 2: -3.0}, {3: -1.0, 4: -1.5}])
    together = check.Run([5, 7, 4], [{5: -0.5}, {7: -0.5, 2: -3.0}, {4: -0.75, 3: -3.0}])
    # step 1's 0.25 counts; step 2 (tokens 3 vs 4, token 3 apart by 2.0) is past the divergence and does not
    assert check.compare(alone, together) == {"first_divergence": 2, "logprobs_identical": False,
                                              "max_logprob_diff": 0.25}
    same_tokens = check.Run([5, 7, 3], [{5: -0.5}, {7: -0.25, 2: -3.0}, {3: -1.0 + 2**-20, 4: -1.5}])
    assert check.compare(alone, same_tokens) == {"first_divergence": None, "logprobs_identical": False,
                                                 "max_logprob_diff": 2**-20}
    assert check.compare(alone, alone) == {"first_divergence": None, "logprobs_identical": True,
                                           "max_logprob_diff": 0.0}


def test_expect_identical_fails_only_on_an_invariant_combination_that_differs():
    def combination(precision, invariant, identical_logprobs):
        return {"precision": precision, "batch_invariant": invariant, "prompts": 4,
                "identical_tokens": 4, "identical_logprobs": identical_logprobs}
    fine = [combination("fp32", True, 4), combination("fast", False, 0)]   # off may differ
    assert check.not_invariant(fine) == []
    assert check.not_invariant(fine + [combination("fast", True, 3)]) == [combination("fast", True, 3)]


@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp32,bf16"], "--precision takes a comma-separated subset of fp32,fast, got 'fp32,bf16'"),
    (["--batch-invariant", "yes"], "--batch-invariant takes a comma-separated subset of on,off, got 'yes'"),
    (["--prompts", "0"], "--prompts must be >= 1, got 0"),
    (["--json", "/no-such-dir/check.json", "--prompts", "1", "--max-prompt-len", "2", "--max-tokens", "1",
      "--precision", "fp32", "--batch-invariant", "on"],   # refused before the runs, not after them
     "cannot write --json /no-such-dir/check.json: its directory is missing or not writable"),
])
def test_bad_options_get_one_clear_line(capsys, argv, message):
    assert check.main(argv) == 1
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.slow  # the script as a subprocess, engine runs in the simulator: 12 s idle, 40 s on a busy machine
def test_three_short_prompts_are_bit_identical_alone_and_together(tmp_path):
    out = tmp_path / "check.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, str(SCRIPT), "--prompts", "3", "--max-prompt-len", "12", "--max-tokens", "3",
                           "--precision", "fp32", "--batch-invariant", "on", "--json", str(out), "--expect-identical"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (row,) = [line.split() for line in done.stdout.splitlines() if line.startswith("fp32")]
    assert row[:5] == ["fp32", "on", "3/3", "3/3", "0"]
    report = json.loads(out.read_text())
    assert report["simulator"] is True and report["device"] == "numba CUDA simulator"
    (c,) = report["combinations"]
    assert (c["precision"], c["batch_invariant"], c["prompts"], c["identical_tokens"], c["identical_logprobs"]) == (
        "fp32", True, 3, 3, 3)
    assert c["first_divergence_steps"] == [] and c["max_logprob_diff_before_divergence"] == 0
    # the evidence itself, not the script's counts: 3 tokens with one logprob each, the same alone and together
    prompts = c["per_prompt"]
    assert len(prompts) == 3 and all(1 <= p["prompt_len"] <= 12 for p in prompts)
    for p in prompts:
        assert len(p["alone"]["tokens"]) == len(p["alone"]["logprobs"]) == 3
        assert p["alone"] == p["together"]
    assert len({tuple(p["prompt_ids"]) for p in prompts}) == 3 and all(len(p["prompt_ids"]) == p["prompt_len"]
                                                                      for p in prompts)
