"""Two precisions, one forward path: `--precision fp32|fast|auto` from the command line to the engine, and the fast
path (bf16 activations into tensor-core GEMMs and prefill attention, float32 accumulation) against fp32 on the demo
model, stage by stage and in greedy tokens. In the simulator the fast kernels run on mma.py's twins with small tiles
(KernelPlan.tc_tile), so the prompts are short: two of 9 and 7 tokens, one 16-row tile."""
import numpy as np
import pytest

from kernels_numba.common import SIMULATOR
from tinyvllm.cli import main, parse_args
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
from tinyvllm.runner.kernel_plan import resolve_precision
from tinyvllm.engine.sampling_params import SamplingParams

PROMPT_TOKENS = (9, 7)   # the first tokens of golden prompts 0 and 1
NEW_TOKENS = 2
BF16_ROUNDING = 2.0**-8  # a bf16 has 8 significant bits: rounding to nearest moves a value by <= 2^-8 of it
ROUNDINGS_PER_LAYER = 8  # x into q|k|v; q * scale, K, V and P in prefill_tc; a into o_proj; x into gate|up; the gate


def _quiet(message):
    pass


def _roundings_upstream(stage: str) -> int:
    """How many bf16 roundings of activations the fast path makes on the way to a stage's output (its own input
    included): the layers before it, then within layer i (see ROUNDINGS_PER_LAYER)."""
    if stage == "embedding":
        return 0
    if stage in ("final_norm", "logits"):
        return ROUNDINGS_PER_LAYER * 2 + (stage == "logits")
    _, i, part = stage.split(".")
    within = {"input_norm": 0, "q": 1, "k": 1, "v": 1, "attn": 5, "o_proj": 6, "attn_residual": 6, "post_norm": 6,
              "mlp": 8, "output": 8}[part]
    return ROUNDINGS_PER_LAYER * int(i) + within


def _run(precision: str):
    """Greedy NEW_TOKENS for the two prompts, every step stepped stage by stage: (per step {stage: (kernel, host
    array)}, per step {request id: logits row}, {request id: output tokens})."""
    goldens = Goldens.load(DEFAULT_GOLDENS)
    engine = LLMEngine(None, EngineConfig(precision=precision, num_blocks=16, max_num_seqs=2), log=_quiet)
    assert engine.precision == precision
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [engine.add_request(goldens.prompts[p]["input_ids"][:n].tolist(), params)
                for p, n in enumerate(PROMPT_TOKENS)]
    steps, logits = [], []
    while engine.has_unfinished_requests():
        stages, record = engine.step_stages(), {}
        try:
            while True:
                stage = next(stages)
                record[stage.name] = (stage.kernel, stage.to_host())
        except StopIteration:
            pass
        sampled = [s.seq.data.request_id for s in engine.last_schedule.scheduled if s.samples]
        logits.append(dict(zip(sampled, record["logits"][1])))
        steps.append(record)
    return steps, logits, {r: engine.request(r).seq.output_token_ids for r in requests}


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU these 16-token steps stay under the GEMV crossover (no tensor "
                    "cores); scripts/fast_path_compare.py checks the fast path there, against HF bf16")
def test_fast_path_matches_fp32_per_stage_within_bf16_rounding_and_greedy_where_fp32_is_decided():
    """Per stage of the prefill step (both prompts in one step): max|fast - fp32| / max|fp32| <= 2^-8 n, n the bf16
    roundings upstream of the stage. Why: a rounding moves an operand by <= 2^-8 of it, so a projection's output by
    <= 2^-8 of sum |x w| (float32 accumulation adds ~K 2^-24, nothing at K <= 128); RMSNorm renormalises and the
    residual stream carries errors forward unamplified, so a stage's error relative to its scale grows by at most
    about 2^-8 per rounding on the way (seen: 0.24 to 0.7 of that). And a floor: every stage after the first
    rounding is at least 2^-12 off (fp32's own kernel-to-kernel spread is ~1e-6), so the fast kernels did run.
    Greedy: the fast tokens equal fp32's up to the first step where fp32's top-2 margin is below 2x the prefill
    step's logits spread (both top logits may move by it, in opposite directions)."""
    fp32_steps, fp32_logits, fp32_tokens = _run("fp32")
    fast_steps, _, fast_tokens = _run("fast")
    fp32, fast = fp32_steps[0], fast_steps[0]
    assert list(fp32) == list(fast), "the two precisions must yield the same stages in the same order"
    for name in ("layers.0.q", "layers.1.o_proj", "layers.1.mlp", "logits"):
        assert "gemm_tc" in fast[name][0] and "gemm_tc" not in fp32[name][0], (name, fast[name][0], fp32[name][0])
    assert "SwiGLUEpilogue" in fast["layers.0.mlp"][0] and "silu_mul" not in fast["layers.0.mlp"][0]  # gate fused
    assert "prefill_tc" in fast["layers.1.attn"][0] and "prefill_tc" not in fp32["layers.1.attn"][0]
    report = []
    for name, (_, want) in fp32.items():
        got = fast[name][1]
        assert got.shape == want.shape and np.isfinite(got).all(), name
        rel = float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())
        n = _roundings_upstream(name)
        report.append(f"{name}: {rel:.2e} (n={n}, tol {BF16_ROUNDING * n:.2e})")
        if n == 0:
            assert rel == 0, f"{name} has no bf16 rounding upstream yet differs: {rel}"
        else:
            assert 2.0**-12 <= rel <= BF16_ROUNDING * n, "\n".join(report)
    spread = float(np.abs(fast["logits"][1] - fp32["logits"][1]).max())
    decided = 0
    for request, tokens in fp32_tokens.items():
        for step, token in enumerate(tokens):
            top2 = np.sort(fp32_logits[step][request])[-2:]
            if top2[1] - top2[0] < 2 * spread:
                break
            assert fast_tokens[request][step] == token, (
                f"request {request} step {step}: fast {fast_tokens[request]} vs fp32 {tokens}, margin "
                f"{top2[1] - top2[0]:.3g} > 2 x logits spread {spread:.3g}")
            decided += 1
    assert decided >= 2, f"only {decided} greedy steps had a margin above 2 x {spread:.3g}: the check is vacuous"


def test_auto_is_fast_on_a_gpu_with_bf16_weights_else_fp32():
    assert resolve_precision("auto", np.uint16) == ("fp32" if SIMULATOR else "fast")
    assert resolve_precision("auto", np.float32) == "fp32"
    assert resolve_precision("fast", np.uint16) == "fast" and resolve_precision("fp32", np.uint16) == "fp32"
    with pytest.raises(TinyVLLMError, match="--precision fast needs bf16 weights"):
        resolve_precision("fast", np.float32)
    with pytest.raises(TinyVLLMError, match="precision must be one of auto, fp32, fast, got 'bf16'"):
        EngineConfig(precision="bf16")


def test_the_fast_plans_gemv_crossover_sends_larger_decode_steps_to_the_tensor_cores(monkeypatch):
    """On a GPU (the plan's choices asked with simulator=False): decode steps up to FAST_GEMV_MAX_TOKENS keep the
    fused GEMVs, larger ones take gemm_tc and leave the fused-GEMV layer; fp32 keeps its own crossover
    (matmul.MAX_COALESCED_TOKENS)."""
    from kernels_numba import matmul
    from tinyvllm.runner import kernel_plan
    from tinyvllm.runner.kernel_plan import KernelPlan
    monkeypatch.setattr(kernel_plan, "FAST_GEMV_MAX_TOKENS", 8)
    fast, fp32 = (KernelPlan(p, 64, 4, simulator=False, batch_invariant=False) for p in ("fast", "fp32"))
    assert fast.tc_min_rows() == 9
    assert not fast.uses_tensor_cores(8, 2048) and fast.uses_tensor_cores(9, 2048)
    assert not fp32.uses_tensor_cores(9, 2048)
    inputs = (2048, 32 * 64, 8192)  # hidden, n_heads * head_dim, intermediate
    for plan, tokens, fused in ((fast, 8, True), (fast, 9, False), (fp32, 9, True), (fp32, 33, False)):
        assert plan.fused_gemv_layer(tokens, inputs) == fused, (plan.precision, tokens)
    monkeypatch.setattr(kernel_plan, "FAST_GEMV_MAX_TOKENS", 64)  # never past fp32's own crossover
    assert fast.tc_min_rows() == matmul.MAX_COALESCED_TOKENS + 1


@pytest.mark.parametrize("command, expected", [("generate", "auto"), ("serve", "auto"), ("bench", "auto"),
                                               ("eval", "auto"), ("debug", "fp32"), ("trace", "fp32"),
                                               ("check-goldens", "fp32")])
def test_each_command_takes_precision_with_its_default(command, expected):
    assert parse_args([command]).precision == expected
    assert parse_args([command, "--precision", "fast"]).precision == "fast"


def test_the_flag_reaches_the_engine_and_the_bench_config():
    from tinyvllm.bench.config import config_from_args
    from tinyvllm.cli import eval as evaluation_cli
    from tinyvllm.engine.args import build_engine
    engine = build_engine(parse_args(["generate", "--precision", "fast"]))  # generate, serve, debug, trace
    assert engine.config.precision == "fast" and engine.precision == "fast" and engine.runner.plan.fast
    args = parse_args(["eval", "--precision", "fast"])
    backend, *_ = evaluation_cli._backend(args, evaluation_cli.config_from_args(args), _quiet)
    assert backend.engine.precision == "fast"
    assert config_from_args(parse_args(["bench", "--precision", "fp32"])).precision == "fp32"


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--precision", "bf16"], "argument --precision: invalid choice: 'bf16'"),
    (["check-goldens", "--precision", "fast"], "check-goldens compares with HF float32 goldens"),
    (["check-goldens", "--kv-cache-dtype", "bfloat16"], "it runs a float32 KV cache only"),
])
def test_bad_precision_gets_one_line(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own: usage, then one error line, status 2
        code = e.code
    err = capsys.readouterr().err
    assert code in (1, 2) and message in err.strip().splitlines()[-1] and "Traceback" not in err
