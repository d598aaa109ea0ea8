"""The simulator's up-front estimate (tinyvllm/runtime_estimate.py): what it counts, that it grows with the work
and the model, that it is sane against a run it describes, and when it is printed."""
import dataclasses
import os
import subprocess
import sys
import time

import pytest

from kernels_numba.common import SIMULATOR
from tinyvllm.model.config import ModelConfig
from tinyvllm.runtime_estimate import (NOTICE_MIN_S, Work, engine_estimate, engine_work, estimate_seconds,
                                       format_duration, layer_weights, simulator_counts, simulator_notice)

DEMO = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=640)


def config(**changes) -> ModelConfig:
    return ModelConfig.from_dict(DEMO | changes)


def test_the_counts_of_one_request_follow_the_schedule():
    """One request of 40 prompt tokens and 3 new ones: a prefill step (40 tokens: 2 gemv chunks of 32, its last
    token sampled), then 2 decode steps at positions 40 and 41. The numbers are the kernels' loops, by hand."""
    c = config()
    layer = 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128     # q|k|v, o_proj, gate|up and down_proj
    assert layer_weights(c) == layer
    head = 640 * 64
    counts = simulator_counts(c, Work((40,), (3,)))
    assert counts.steps == 3
    assert counts.macs == 2 * layer * (40 + 1 + 1) + head * 3
    assert counts.weight_reads == 2 * layer * (2 + 1 + 1) + head * 3
    assert counts.attention == 2 * 4 * 16 * (40 * 41 // 2 + 41 + 42)   # layers x heads x head_dim x visible keys


def test_requests_run_in_waves_and_long_prompts_in_chunks():
    c = config()
    assert simulator_counts(c, Work((10,) * 10, (1,) * 10, max_num_seqs=4)).steps == 3      # waves of 4, 4, 2
    assert simulator_counts(c, Work((600,), (1,), max_num_batched_tokens=512)).steps == 2  # 512 + 88 tokens
    assert simulator_counts(c, Work((5, 5), (4, 2))).steps == 1 + 3   # decode until the longer one ends
    goldens = simulator_counts(c, Work((27,), (1,), every_prompt_token_logits=True))
    assert goldens.macs == 2 * layer_weights(c) * 27 + 640 * 64 * 27


@pytest.mark.parametrize("work_change", [
    dict(prompt_tokens=(200,)), dict(new_tokens=(40,)), dict(prompt_tokens=(50, 50), new_tokens=(8, 8))])
def test_more_work_takes_longer(work_change):
    base = Work((50,), (8,))
    assert estimate_seconds(config(), dataclasses.replace(base, **work_change)) > estimate_seconds(config(), base)


@pytest.mark.parametrize("model_change", [
    dict(hidden_size=128), dict(intermediate_size=512), dict(num_hidden_layers=4), dict(num_attention_heads=8),
    dict(vocab_size=4096)])
def test_a_bigger_model_takes_longer(model_change):
    work = Work((50,), (8,))
    assert estimate_seconds(config(**model_change), work) > estimate_seconds(config(), work)


def test_the_estimate_is_within_a_factor_of_2_5_of_the_run_it_describes(monkeypatch):
    """Two demo-model requests run in this process. Compared with the process's CPU time, not the wall clock: the
    estimate is for an idle machine, and CPU time is what other processes on the cores change least. 2.5: the
    calibration's spread (1.6, the module docstring) with room for a loaded machine's slower CPU time."""
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams
    engine = LLMEngine(None, EngineConfig(max_num_seqs=8, max_num_batched_tokens=512))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    ids = [engine.add_request(list(range(10 + 7 * i, 34 + 7 * i)), params) for i in range(2)]
    work = engine_work(engine, ids)
    assert work == Work((24, 24), (3, 3), 8, 512)
    estimate = engine_estimate(engine, work)
    if not SIMULATOR:
        assert estimate is None  # on a GPU there is nothing to estimate: no notice
        return
    start = time.process_time()
    while engine.has_unfinished_requests():
        engine.step()
    measured = time.process_time() - start
    assert measured / 2.5 < estimate < measured * 2.5, (estimate, measured)


def test_the_notice_is_for_long_simulator_work_only():
    assert simulator_notice(None, "2 prompts x 8 tokens") is None                 # a GPU: no estimate, no notice
    assert simulator_notice(NOTICE_MIN_S - 1, "2 prompts x 8 tokens") is None     # quick
    line = simulator_notice(200, "2 prompts x 8 tokens")
    assert line.startswith("simulator: about 3 min for 2 prompts x 8 tokens on this model (no GPU")
    assert [format_duration(s) for s in (0.2, 40, 89, 200, 5400, 9000)] == ["1 s", "40 s", "89 s", "3 min",
                                                                          "1.5 h", "2.5 h"]


def _generate(*flags: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tinyvllm.cli", "generate", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"NUMBA_ENABLE_CUDASIM": "1"} | env)


def test_generate_prints_the_notice_before_long_work_starts():
    """A run estimated at minutes (the demo model, 200 tokens): the notice comes before the first step, so the
    test reads it and stops the run (at the latest at the first progress line, a second into the run)."""
    process = _generate("--prompt", "The sun rose over the town", "--max-tokens", "200", "--ignore-eos",
                        TINYVLLM_PROGRESS_EVERY_S="1")
    try:
        for line in process.stderr:
            if line.startswith(("simulator: ", "generating [")):
                break
    finally:
        process.kill()
        process.wait()
    assert line.startswith("simulator: about ") and "for 1 prompt x 200 tokens on this model" in line, line


def test_eval_prints_the_notice_for_its_questions(tmp_path):
    """`tinyvllm eval --limit 10` on the demo model: minutes of prefill (the run of issue 26 took 13); the notice
    names the questions before the first step, and the test stops the run there."""
    process = subprocess.Popen([sys.executable, "-m", "tinyvllm.cli", "eval", "--limit", "10", "--out", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=os.environ | {"NUMBA_ENABLE_CUDASIM": "1", "TINYVLLM_PROGRESS_EVERY_S": "1"})
    try:
        for line in process.stderr:
            if line.startswith(("simulator: ", "mmlu (")):
                break
    finally:
        process.kill()
        process.wait()
    assert line.startswith("simulator: about ") and " min for 10 questions (mmlu, loglikelihood) on this model" in line


def test_bench_prints_the_notice_for_its_capped_runs(tmp_path):
    """A latency run of 100 tokens on the demo model (about 100 s) stopped at --max-seconds 40: the notice counts
    the cap, and comes before the run (the test stops it there)."""
    process = subprocess.Popen([sys.executable, "-m", "tinyvllm.cli", "bench", "--workload", "latency", "--no-warmup",
                                "--latency-new-tokens", "100", "--max-seconds", "40", "--out", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=os.environ | {"NUMBA_ENABLE_CUDASIM": "1"})
    try:
        for line in process.stderr:
            if line.startswith("simulator: ") or "] tinyvllm latency" in line:
                break
    finally:
        process.kill()
        process.wait()
    assert line == ("simulator: about 40 s for 1 bench run of at most --max-seconds 40 each on this model (no GPU: "
                    "numba's CUDA simulator runs each GPU thread as a Python thread; see README)\n"), line
