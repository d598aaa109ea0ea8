"""`tinyvllm bench` on the demo model in the simulator: tiny versions of every workload write the JSON and
CSV they promise, with token counts equal to what was requested. Nothing here asserts on speed."""
import contextlib
import csv
import io
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from tinyvllm import bench
from tinyvllm.bench import BenchConfig, Workloads
from tinyvllm.cli import main, parse_args
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.model.loader import load_model
from tests.references import require

pytestmark = pytest.mark.slow  # engine-level: every bench workload on the demo model

ROOT = Path(__file__).resolve().parent.parent

# 3 requests of 4-8 prompt tokens and 2-3 new tokens: the simulator does about one engine step a second.
TINY = ["--latency-prompt", "4", "--latency-new-tokens", "2", "--prefill-lens", "3,6", "--prefill-repeats", "1",
        "--num-requests", "3", "--min-len", "4", "--max-len", "8", "--min-output-len", "2", "--max-output-len", "3",
        "--serving-requests", "3", "--request-rate", "50"]


def run(capsys, *argv):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Every workload once, both batching modes: (exit code, stdout, report JSON, CSV rows, out dir)."""
    out_dir = tmp_path_factory.mktemp("bench")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", *TINY, "--out", str(out_dir)])
    report = json.loads((out_dir / "bench.json").read_text())
    with open(out_dir / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return code, stdout.getvalue(), report, rows, out_dir


def results(report, workload):
    return [r for r in report["results"] if r["workload"] == workload]


def test_every_workload_runs_to_completion_and_writes_json_and_csv(tiny_run):
    code, stdout, report, csv_rows, out_dir = tiny_run
    assert code == 0
    assert {"format", "command", "environment", "model", "config", "engine_config", "copy_bandwidth", "results",
            "comparisons", "notes"} <= set(report)
    runs = [r for r in report["results"] if r["workload"] != "kernels"]
    assert [r["workload"] for r in runs] == ["latency", "prefill", "prefill", "throughput", "throughput", "serving"]
    assert all(r["system"] == "tinyvllm" and r["completed"] and not r["stopped_early"] for r in runs)
    assert report["comparisons"] == []                         # no --compare
    assert len(csv_rows) == len(report["results"])
    for row, result in zip(csv_rows, report["results"]):
        assert row["workload"] == result["workload"] and row["variant"] == result["variant"]
        if "output_tok_s" in result:
            assert float(row["output_tok_s"]) == pytest.approx(result["output_tok_s"], rel=1e-12)
    for workload in ("latency", "prefill", "throughput", "serving"):
        assert workload in stdout
    assert (out_dir / "bench.png").exists() == _has_matplotlib()


def test_latency_counts_every_requested_token_and_times_are_positive(tiny_run):
    (row,) = results(tiny_run[2], "latency")
    assert row["variant"] == "batch 1, 4+2"
    assert row["prompt_tokens"] == 4 and row["output_tokens"] == row["requested_output_tokens"] == 2
    assert row["ttft_ms"] > 0 and row["tpot_ms"] > 0 and row["output_tok_s"] > 0 and row["hbm_roofline_fraction"] > 0
    # the first token and one decode step happen inside the run's wall time (the values themselves: below,
    # test_reported_times_and_rates_follow_a_known_clock)
    assert row["ttft_ms"] + row["tpot_ms"] <= 1e3 * row["elapsed_s"]


def test_weight_bytes_are_the_checkpoint_tensors_once_each():
    with safe_open(str(DEMO_MODEL_DIR / "model.safetensors"), "np") as f:
        # bf16 on the device: 2 bytes per element of every stored tensor (the demo ties lm_head, stores it once)
        expected = sum(2 * math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    from tinyvllm.model.config import ModelConfig
    assert bench.weight_bytes(ModelConfig.from_model_dir(DEMO_MODEL_DIR)) == expected


def test_prefill_measures_each_prompt_length(tiny_run):
    rows = results(tiny_run[2], "prefill")
    assert [r["prompt_len"] for r in rows] == [3, 6]
    assert all(r["num_finished"] == 1 and r["ttft_ms"] > 0 and len(r["ttft_ms_all"]) == 1 for r in rows)
    assert all(r["prefill_tok_s"] > 0 for r in rows)


def test_throughput_runs_nano_vllm_workload_in_both_modes_with_all_tokens(tiny_run):
    # The workload's contract: seed 0, the throughput stream, prompt then output lengths uniform in the ranges.
    rng = np.random.default_rng([0, bench.WORKLOADS.index("throughput")])
    prompt_lens, output_lens = rng.integers(4, 9, 3), rng.integers(2, 4, 3)
    rows = results(tiny_run[2], "throughput")
    assert [r["variant"] for r in rows] == ["continuous", "static"]
    for r in rows:
        assert r["num_finished"] == 3 and r["num_errored"] == 0
        assert r["prompt_tokens"] == prompt_lens.sum()
        assert r["output_tokens"] == r["requested_output_tokens"] == output_lens.sum()
        assert r["output_tok_s"] > 0


def test_serving_reports_ordered_percentiles_from_arrival(tiny_run):
    (r,) = results(tiny_run[2], "serving")
    assert r["num_finished"] == 3 and r["output_tokens"] == r["requested_output_tokens"]
    for name in ("ttft", "itl", "e2e"):
        assert 0 < r[f"{name}_p50_ms"] <= r[f"{name}_p95_ms"] <= r[f"{name}_p99_ms"]
    assert r["ttft_p99_ms"] <= r["e2e_p99_ms"]
    assert r["engine_summary"]["num_completed"] == 3


def test_the_recorded_command_reproduces_the_config(tiny_run):
    report = tiny_run[2]
    args = parse_args(shlex.split(report["command"])[1:])
    assert bench.config_from_args(args) == BenchConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                          for k, v in report["config"].items()})


def test_a_run_past_max_seconds_stops_and_says_how_far_it_got(capsys, tmp_path):
    # 1 ns: a GPU may run the whole tiny workload within a millisecond (the simulator never could)
    code, out, err = run(capsys, *TINY, "--workload", "throughput", "--batching", "static", "--max-seconds", "1e-9",
                         "--no-warmup", "--out", str(tmp_path))
    assert code == 0, err
    (row,) = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert row["stopped_early"] and not row["completed"]
    assert row["num_finished"] < row["num_requests"] == 3 and row["output_tokens"] < row["requested_output_tokens"]
    assert "stopped at --max-seconds" in out and "static *" in out


def test_workloads_are_deterministic_and_fit_the_context():
    cfg = BenchConfig(num_requests=20, min_len=5, max_len=30, serving_requests=7, request_rate=2.0,
                      prefill_lens=(10, 50, 5000), prefill_repeats=2)
    a, b = Workloads.make(cfg, 640, 40), Workloads.make(cfg, 640, 40)
    assert [r.prompt_ids for r in a.throughput] == [r.prompt_ids for r in b.throughput]
    assert list(a.prefill) == [10, 39]                               # 50 and 5000 capped to the context
    assert all(len(r.prompt_ids) + r.max_tokens <= 40 for r in a.throughput + a.serving + a.latency)
    assert all(0 <= t < 640 for r in a.throughput for t in r.prompt_ids)
    assert a.prefill[10][0].prompt_ids != a.prefill[10][1].prompt_ids   # repeats are fresh prompts
    arrivals = [r.arrival for r in a.serving]
    assert arrivals[0] == 0 and all(x < y for x, y in zip(arrivals, arrivals[1:]))


def test_poisson_arrivals_have_the_requested_rate():
    arrivals = bench.poisson_arrivals(np.random.default_rng(0), 20_000, 4.0)
    # mean gap 1/rate = 0.25 s; the mean of 20k exponential gaps has a relative sd of 1/sqrt(20000) = 0.7%:
    # 3.5% is 5 sigma (and the seed is fixed)
    assert np.diff(arrivals).mean() == pytest.approx(0.25, rel=0.035)
    assert not bench.poisson_arrivals(np.random.default_rng(0), 5, math.inf).any()


def test_ratios_are_tinyvllm_over_hf_on_the_same_point():
    rows = [{"workload": "throughput", "system": "tinyvllm", "variant": "continuous", "compare_key": "all requests",
             "output_tok_s": 300.0, "num_finished": 4},
            {"workload": "throughput", "system": "tinyvllm", "variant": "static", "compare_key": "all requests",
             "output_tok_s": 150.0, "num_finished": 4},
            {"workload": "throughput", "system": "hf", "variant": "static x64", "compare_key": "all requests",
             "output_tok_s": 100.0, "num_finished": 4},
            {"workload": "prefill", "system": "tinyvllm", "variant": "prompt 8", "compare_key": "prompt 8",
             "ttft_ms": 5.0, "prefill_tok_s": 1600.0}]
    ratios = {(c["variant"], c["metric"]): c["ratio"] for c in bench.comparisons(rows)}
    assert ratios == {("continuous", "output_tok_s"): 3.0, ("static", "output_tok_s"): 1.5,
                      ("continuous", "num_finished"): 1.0, ("static", "num_finished"): 1.0}


@pytest.mark.parametrize("argv, message", [
    (["--workload", "latency,bogus"], "unknown workload(s) ['bogus']"),
    (["--batching", "dynamic"], "unknown batching mode(s) ['dynamic']"),
    (["--min-len", "9", "--max-len", "3"], "--min-len 9 > --max-len 3"),
    (["--request-rate", "0"], "--request-rate must be > 0"),
    (["--base-url", "http://127.0.0.1:1", "--workload", "serving", "--batch-invariant", "both"],
     "--batch-invariant is the in-process engine's"),
])
def test_bad_settings_get_one_clear_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 1 and err.startswith("error: bench: ") and message in err


def _torch_has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_torch_has_cuda(), reason="torch sees a GPU here")
def test_compare_hf_without_a_gpu_says_it_needs_one_before_any_work(capsys):
    code, out, err = run(capsys, "--compare", "hf", "--workload", "latency")
    assert code == 1
    assert err.startswith("error: --compare hf needs") and "loading" not in err


def test_compare_hf_dry_run_on_cpu_puts_hf_beside_tinyvllm(capsys, tmp_path):
    require("transformers")
    code, out, err = run(capsys, *TINY, "--workload", "latency,throughput", "--batching", "static", "--no-warmup",
                         "--compare", "hf", "--hf-device", "cpu", "--hf-batch-size", "2", "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads((tmp_path / "bench.json").read_text())
    hf = {r["workload"]: r for r in report["results"] if r["system"] == "hf"}
    assert set(hf) == {"latency", "throughput"}
    assert hf["latency"]["output_tokens"] == 2 and hf["latency"]["ttft_ms"] > 0 and hf["latency"]["tpot_ms"] > 0
    # two static batches of 2 + 1 requests: only the tokens each request asked for count
    assert hf["throughput"]["output_tokens"] == hf["throughput"]["requested_output_tokens"]
    assert hf["throughput"]["num_finished"] == 3
    ratios = {(c["workload"], c["metric"]) for c in report["comparisons"]}
    assert {("latency", "tpot_ms"), ("throughput", "output_tok_s")} <= ratios
    assert "tinyvllm/HF" in out and report["environment"]["hf"].startswith("transformers")


def test_hf_only_runs_just_the_hf_side_and_needs_compare(capsys, tmp_path):
    require("transformers")
    code, out, err = run(capsys, *TINY, "--workload", "latency", "--no-warmup", "--hf-only")
    assert code == 1 and "--hf-only needs --compare hf" in err.splitlines()[-1]
    code, out, err = run(capsys, *TINY, "--workload", "latency", "--no-warmup", "--compare", "hf", "--hf-only",
                         "--hf-device", "cpu", "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {r["system"] for r in report["results"]} == {"hf"} and "tinyvllm latency" not in err
    assert any(line.startswith("latency") and "TPOT" in line for line in out.splitlines())  # HF's rows shown
    # a tinyvllm-only run merged with it gives the same ratios one --compare hf run would
    code, out, err = run(capsys, *TINY, "--workload", "latency", "--no-warmup", "--out", str(tmp_path / "ours"))
    assert code == 0, err
    code, out, err = run(capsys, "--merge", str(tmp_path / "ours" / "bench.json"), str(tmp_path / "bench.json"),
                         "--out", str(tmp_path / "merged"), "--no-plot")
    assert code == 0, err
    merged = json.loads((tmp_path / "merged" / "bench.json").read_text())
    assert {r["system"] for r in merged["results"]} == {"tinyvllm", "hf"} and len(merged["merged_from"]) == 2
    assert ("latency", "tpot_ms") in {(c["workload"], c["metric"]) for c in merged["comparisons"]}
    assert "tinyvllm/HF" in out and merged["environment"]["hf"].startswith("transformers")
    code, out, err = run(capsys, "--merge", str(tmp_path / "missing.json"), "--out", str(tmp_path / "m2"))
    assert code == 1 and "cannot read a report to merge" in err


def test_random_model_dir_is_written_once_with_a_tokenizer_for_its_vocabulary(tmp_path):
    from tinyvllm.model.loader import load_model
    from tinyvllm.model.fixtures.random_model import LLAMA_3_2_1B_CONFIG
    tiny = dict(LLAMA_3_2_1B_CONFIG, vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    bench.prepare_random_model(tmp_path, tiny, log=lambda message: None)
    written = (tmp_path / "model.safetensors").stat().st_mtime_ns
    bench.prepare_random_model(tmp_path, tiny, log=lambda message: None)
    assert (tmp_path / "model.safetensors").stat().st_mtime_ns == written
    model = load_model(tmp_path, log=lambda message: None)
    assert model.config.vocab_size == 300 and model.tokenizer.vocab_size == 300
    assert model.tokenizer.decode([7, 299]) == "<t7> <t299>"


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_kernels_workload_times_every_stage_against_its_useful_bytes_and_flops(tiny_run):
    model = load_model(DEMO_MODEL_DIR, log=lambda message: None)
    config = model.config
    rows = results(tiny_run[2], "kernels")
    layers = config.num_hidden_layers
    # Stages whose output an earlier fused kernel produced are not rows. A step runs the fused-GEMV layer (norms in
    # front of the projections, residual adds behind) where ForwardPass.fuses_norms says: on a GPU, the fp32 plan's
    # steps of up to 32 tokens, the fast plan's up to FAST_GEMV_MAX_TOKENS; never in the simulator. Asked of a
    # runner of the bench's precision:
    runner = LLMEngine(model, EngineConfig(precision=tiny_run[2]["engine_config"]["precision"], num_blocks=16),
                       log=lambda message: None).runner
    plan, fuses = runner.plan, runner.forward_pass.fuses_norms

    plain = ["embedding", "input_norm", "q", "attn", "o_proj", "attn_residual", "mlp", "output", "logits"]
    fused = ["embedding", "input_norm", "attn", "o_proj", "post_norm", "mlp", "final_norm", "logits"]
    prefill_tokens = 4  # the latency prompt
    stage_kinds = {phase: fused if fuses(tokens) else plain for phase, tokens in (("prefill", prefill_tokens),
                                                                                  ("decode", 1))}
    # plain: input_norm launches in layer 0 only (then add_rmsnorm); fused: the final norm is its own launch
    once = {"plain": ("embedding", "input_norm", "logits"), "fused": ("embedding", "final_norm", "logits")}
    assert [r["variant"] for r in rows] == [f"{p} {k}" for p in ("prefill", "decode") for k in stage_kinds[p]]
    qkv_stage, norm_flops = (("input_norm", 4 * prefill_tokens * config.hidden_size)  # RMSNorm in front: 4 FLOPs
                             if fuses(prefill_tokens) else ("q", 0))
    for r in rows:
        phase, stage = r["variant"].split()
        kind = "fused" if stage_kinds[phase] is fused else "plain"
        assert r["ms"] > 0 and r["gb_s"] > 0 and r["launches_x"] == (1 if stage in once[kind] else layers)
    prefill_qkv = next(r for r in rows if r["variant"] == f"prefill {qkv_stage}")
    qkv_width = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    # the latency prompt (4 tokens) through the q|k|v projection: 2 FLOPs per multiply-add, per layer
    assert prefill_qkv["tokens"] == 4
    assert prefill_qkv["flops"] == (2 * 4 * config.hidden_size * qkv_width + norm_flops) * layers
    assert ("gemm_tc." if plan.uses_tensor_cores(prefill_tokens, config.hidden_size) else "matmul.") in prefill_qkv["kernel"]
    assert "rope" in prefill_qkv["kernel"].lower()
    assert "kernels    prefill mlp" in tiny_run[1]    # in the printed table


class StepClock:
    """time.perf_counter for a run in which only the engine's work takes time: each scheduler step (step())
    STEP_S, each synchronised stage's wait (a cuda.synchronize) SYNC_S; nothing else moves the clock."""
    STEP_S, SYNC_S = 1.0, 1e-3

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_reported_times_and_rates_follow_a_known_clock(monkeypatch):
    """The latency, prefill and kernels rows against what a clock that only the engine moves makes them:
    expectations from the definitions (TTFT = one step, TPOT = one step, ...), not from the report's fields."""
    from kernels_numba.common import cuda
    from tinyvllm.bench.engine_runs import EngineFactory, bench_kernels, bench_latency, bench_prefill
    from tinyvllm.bench.report import add_roofline
    cfg = bench.config_from_args(parse_args(["bench", *TINY]))
    model = load_model(DEMO_MODEL_DIR, log=lambda message: None)
    config = model.config
    engines = EngineFactory(model, EngineConfig(num_blocks=32, block_size=4, max_model_len=32, cuda_graphs=False),
                            log=lambda message: None)
    workloads = Workloads.make(cfg, config.vocab_size, 32)
    clock, step, synchronize = StepClock(), LLMEngine.step, cuda.synchronize

    def timed_step(self):
        clock.now += StepClock.STEP_S
        return step(self)

    def timed_synchronize(*args):
        synchronize(*args)
        clock.now += StepClock.SYNC_S
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(LLMEngine, "step", timed_step)

    # latency: 4 prompt tokens, 2 new: the prefill step gives the first token, one decode step the second
    (latency,) = bench_latency(engines, workloads, cfg, log=lambda message: None)
    assert latency["ttft_ms"] == 1e3 * StepClock.STEP_S and latency["tpot_ms"] == 1e3 * StepClock.STEP_S
    assert latency["elapsed_s"] == 2 * StepClock.STEP_S and latency["output_tok_s"] == 2 / (2 * StepClock.STEP_S)
    with safe_open(str(DEMO_MODEL_DIR / "model.safetensors"), "np") as f:
        checkpoint_bytes = sum(2 * math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    add_roofline([latency], bench.weight_bytes(config), {"gb_per_s": 2.0})
    # every weight read once per decode step of STEP_S, over a 2 GB/s copy
    assert latency["hbm_roofline_fraction"] == pytest.approx(checkpoint_bytes / StepClock.STEP_S / 2e9, rel=1e-12)

    # prefill: one single-token request per length, one step each
    rows = bench_prefill(engines, workloads, cfg, log=lambda message: None)
    assert [(r["prompt_len"], r["ttft_ms"], r["prefill_tok_s"]) for r in rows] == [
        (3, 1e3 * StepClock.STEP_S, 3 / StepClock.STEP_S), (6, 1e3 * StepClock.STEP_S, 6 / StepClock.STEP_S)]

    # kernels: every synchronised stage waits once, so a stage kind takes SYNC_S per launch
    monkeypatch.setattr(cuda, "synchronize", timed_synchronize)
    rows = {r["variant"]: r for r in bench_kernels(engines, workloads, cfg, log=lambda message: None)}
    H, V, layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
    for variant, launches in (("prefill attn", layers), ("decode mlp", layers), ("decode logits", 1)):
        assert rows[variant]["ms"] == pytest.approx(1e3 * StepClock.SYNC_S * launches, rel=1e-9), variant
    # the decode step's logits: the bf16 lm_head read once, one hidden row in, one row of logits out
    logits_bytes = V * H * 2 + (H + V) * 4
    assert rows["decode logits"]["gb_s"] == pytest.approx(logits_bytes / StepClock.SYNC_S / 1e9, rel=1e-9)
    engines.release()


def test_batch_invariant_both_runs_each_workload_on_then_off_with_ratios_beside_hf(tmp_path):
    """--batch-invariant both, the way a user runs it (a subprocess): every tinyvllm workload twice on the same
    requests, each row saying what its engine's kernel plan was asked, on/off ratios in the JSON and the table,
    each run against HF. The fast precision: in the simulator its plan is the one the flag changes
    (docs/batch-invariance.md), so the kernels workload shows whether the flag reached the engine."""
    require("transformers")
    argv = ["--latency-prompt", "4", "--latency-new-tokens", "2", "--workload", "latency,kernels",
            "--precision", "fast", "--batch-invariant", "both", "--compare", "hf", "--hf-device", "cpu",
            "--no-warmup", "--no-plot", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, "-m", "tinyvllm.cli", "bench", *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    ours = [r for r in report["results"] if r["system"] == "tinyvllm"]
    assert [(r["workload"], r["batch_invariant"]) for r in ours if r["workload"] == "latency"] == [
        ("latency", True), ("latency", False)]
    on, off = [r for r in ours if r["workload"] == "latency"]
    assert on["prompt_tokens"] == off["prompt_tokens"] == 4 and on["output_tokens"] == off["output_tokens"] == 2
    kernels = {flag: {r["variant"]: r["kernel"] for r in ours if r["workload"] == "kernels"
                      and r["batch_invariant"] is flag} for flag in (True, False)}
    assert kernels[True] and kernels[True].keys() == kernels[False].keys()
    assert kernels[True] != kernels[False]      # the other plan ran: some decode stage took another kernel

    ratios = {(c["workload"], c["variant"], c["metric"]): c for c in report["invariance_ratios"]}
    for key in ("ttft_ms", "tpot_ms", "output_tok_s"):
        c = ratios[("latency", on["variant"], key)]
        assert (c["on"], c["off"]) == (on[key], off[key]) and c["ratio"] == pytest.approx(on[key] / off[key])
    assert ("latency", on["variant"], "num_finished") not in ratios    # counts get no ratio
    hf_tpot = {c["batch_invariant"]: c for c in report["comparisons"] if c["metric"] == "tpot_ms"}
    assert set(hf_tpot) == {True, False} and hf_tpot[True]["hf"] == hf_tpot[False]["hf"]
    assert hf_tpot[False]["tinyvllm"] == off["tpot_ms"]

    table = done.stdout.splitlines()
    header = next(line for line in table if line.startswith("workload"))
    assert header.split()[-5:] == ["invariant", "tinyvllm", "on/off", "HF", "tinyvllm/HF"]
    tpot = [line.split("TPOT (ms)")[1].split() for line in table if line.startswith("latency") and "TPOT" in line]
    assert [cells[0] for cells in tpot] == ["on", "off"]
    assert float(tpot[1][2]) == pytest.approx(on["tpot_ms"] / off["tpot_ms"], rel=1e-3)   # on/off, on the off line
    assert float(tpot[0][3]) == float(tpot[1][3]) == pytest.approx(hf_tpot[True]["hf"], rel=1e-3)
