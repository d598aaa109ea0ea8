"""One entry point for the GPU checks, comparisons and benchmarks: each subcommand runs a fixed list of steps
(pytest on the GPU, the tools in scripts/, `tinyvllm bench`), one log per step under --out, a short summary last.

    python scripts/gpu.py check [kernels|tc|kv-bf16|graphs|decode-warps]
    python scripts/gpu.py compare [random-1b|fast|gguf|eval] [--model PATH]
    python scripts/gpu.py bench [hf|eval|serve] [--model PATH]
    python scripts/gpu.py suite [PYTEST ARGS ...]
    python scripts/gpu.py profile TOOL [TOOL'S OWN ARGS ...]   (the tool's defaults are replaced)
    python scripts/gpu.py SUBCOMMAND ... --dry-run             (prints the steps, runs nothing)

Run it from the repository root after the GPU machine's preamble (the numpy wheel on PYTHONPATH:
scripts/README.md). Every step runs under `timeout`, and each target is sized for one 10-minute device call; the
durations in --help are rough, from earlier H200 runs of the same steps with a warm kernel cache. Steps needing the random
Llama-3.2-1B-shaped model write it first (--model-dir, default /tmp/llama-1b-random) when it is missing.
The exit status is the first failing step's.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
RANDOM_1B = "/tmp/llama-1b-random"
SMOLLM2 = os.environ.get("SMOLLM2", "/tmp/gg/smol.gguf")
TEST_FAILURES = r"^(FAILED|ERROR) |passed|failed|no tests ran"


@dataclasses.dataclass
class Step:
    """One command of a subcommand, its output in OUT/<name>.log. The summary prints the log's last `lines`
    lines, of those matching the regex `show` when one is given."""
    name: str
    argv: list[str]
    timeout_s: int
    show: str = ""
    lines: int = 3
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    unset: tuple[str, ...] = ()
    signal: str = "TERM"    # INT lets pytest print what ran before it stops
    required: bool = False  # the steps after it need it: stop when it fails

    def command(self) -> list[str]:
        return ["timeout", f"--signal={self.signal}", "--kill-after=20", str(self.timeout_s), *self.argv]


def script(name: str, *args: str) -> list[str]:
    return [PY, f"scripts/{name}", *args]


def gpu_tests(name: str, files: list[str], timeout_s: int, *pytest_args: str) -> Step:
    argv = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *pytest_args, *files]
    return Step(name, argv, timeout_s, show=TEST_FAILURES, lines=12, env={"TINYVLLM_TEST_GPU": "1"},
                unset=("NUMBA_ENABLE_CUDASIM",))


def prepare_random_1b(model_dir: str, tokenizer_gguf: str = "") -> Step:
    argv = script("write_random_1b.py", model_dir, *(["--tokenizer-from", tokenizer_gguf] if tokenizer_gguf else []))
    return Step("random_model", argv, 300, lines=2, required=True)


def join_gguf_parts(path: str) -> None:
    """A GGUF over one call's carry limit travels as .gguf/<name>.part.* pieces (docs/gguf.md): join them."""
    target = Path(path)
    parts = sorted((ROOT / ".gguf").glob("smollm2.part.*"))
    if target.exists() or not parts:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())


# ---- check ---------------------------------------------------------------------------------------------------

KERNEL_TESTS = ["tests/test_bf16.py", "tests/test_embedding.py", "tests/test_rmsnorm.py", "tests/test_rope.py",
                "tests/test_activation.py", "tests/test_sampling.py", "tests/test_matmul.py",
                "tests/test_paged_attention.py", "tests/lessons"]
TC_TESTS = ["tests/test_mma.py", "tests/test_gemm_tc.py", "tests/test_prefill_tc.py", "tests/test_kernel_cache.py"]
KV_TESTS = ["tests/test_paged_attention.py", "tests/test_prefill_tc.py", "tests/test_rope.py", "tests/test_kv_pool.py",
            "tests/test_kv_cache_bf16.py", "tests/test_stage_costs.py"]
GRAPH_TESTS = ["tests/test_prefill_graphs.py", "tests/test_prefill_tc.py", "tests/test_cuda_graphs.py",
               "tests/test_goldens_demo.py"]

CHECKS = {
    "kernels": "~3 min: every elementwise, matmul and attention kernel's GPU tests, then check-goldens",
    "tc": "~5 min: tensor cores: mma / gemm_tc / prefill_tc tests, their SASS, the plan's tiles and prefill "
          "attention timed",
    "kv-bf16": "~5 min: the bf16 KV pool: the tests of every kernel reading or writing it, decode attention "
               "float32 vs bf16 pool",
    "graphs": "~5 min: decode and prefill CUDA graphs: their tests, then graph vs eager logits and step time "
              "(fast, fp32)",
    "decode-warps": "~2 min: decode_warps vs decode_gqa: kernel outputs and timing, then greedy tokens through "
                    "the engine",
}


def check_steps(args: argparse.Namespace) -> list[Step]:
    if args.target == "kernels":
        return [gpu_tests("gpu_tests_kernels", KERNEL_TESTS, 240),
                Step("check_goldens", [PY, "-m", "tinyvllm.cli", "check-goldens"], 120, lines=1)]
    if args.target == "tc":
        return [gpu_tests("gpu_tests_tc", TC_TESTS, 200, "--durations=10"),
                Step("check_tc_sass", script("check_tc_sass.py"), 100, lines=6),
                Step("sweep_tc_gemm", script("sweep_tc_gemm.py", "--tokens", "1024,4096", "--tiles", "default"), 120,
                     show=r"^best|^correctness|to_bf16|torch", lines=40),
                Step("time_prefill_attention", script("time_prefill_attention.py", "--kv-dtype", "bfloat16",
                                                      "--tokens", "1024,4096"), 120, lines=14)]
    if args.target == "kv-bf16":
        return [gpu_tests("gpu_tests_kv", KV_TESTS, 300, "--durations=10"),
                Step("time_kv_dtype_decode", script("time_kv_dtype_decode.py"), 150, lines=8)]
    if args.target == "graphs":
        steps = [gpu_tests("gpu_tests_graphs", GRAPH_TESTS, 150, "--durations=10"), prepare_random_1b(args.model_dir)]
        for precision, timeout_s in (("fast", 180), ("fp32", 120)):
            steps.append(Step(f"time_prefill_graphs_{precision}", script(
                "time_prefill_graphs.py", "--model-dir", args.model_dir, "--precision", precision), timeout_s,
                show=r"max \|diff\||captured buckets|^Result|prefill step for", lines=40))
        return steps
    assert args.target == "decode-warps", args.target
    return [Step("time_decode_warps", script("time_decode_warps.py", "--warps", "2,4"), 90, lines=14),
            prepare_random_1b(args.model_dir),
            Step("check_decode_warps_engine", script("check_decode_warps_engine.py", "--model-dir", args.model_dir),
                 120, lines=2)]


# ---- compare -------------------------------------------------------------------------------------------------

COMPARES = {
    "random-1b": "~2 min: the exact Llama-3.2-1B shape (random bf16 weights), float32 path vs HF float32, "
                 "stage by stage and greedy tokens",
    "fast": "~3 min: the fast path (bf16 tensor cores) vs HF bf16 / fp32 on the random 1B model, and on --model "
            "(a GGUF or HF dir) when given",
    "gguf": "~2 min: a GGUF (--model, default $SMOLLM2 or /tmp/gg/smol.gguf) vs HF transformers' own GGUF loader",
    "eval": "~10 min: `tinyvllm eval` vs HF float32 on MMLU and GPQA (--model: a .gguf, an HF dir or random-1b)",
}


def compare_steps(args: argparse.Namespace) -> list[Step]:
    out = args.out
    if args.target == "random-1b":
        return [Step("gpu_compare", script("gpu_compare.py", "--model-dir", args.model_dir, "--out", out), 240,
                     show=r"^\| [0-9]|Result", lines=40)]
    if args.target == "fast":
        verdicts = dict(show=r"^\| [0-9] \| [0-9]|^Result", lines=40)
        random_1b = script("fast_path_compare.py", "--model", "random-1b", "--model-dir", args.model_dir, "--out", out)
        steps = [prepare_random_1b(args.model_dir), Step("fast_path_compare-random-1b", random_1b, 240, **verdicts)]
        if args.model:
            other = script("fast_path_compare.py", "--model", args.model, "--out", out)
            steps.append(Step("fast_path_compare-model", other, 180, **verdicts))
        return steps
    model = args.model or SMOLLM2
    if args.target == "gguf":
        return [Step("gguf_compare", script("gguf_compare.py", model, "--out", out), 300, lines=12)]
    assert args.target == "eval", args.target
    steps, limit = [], "1000"
    if model == "random-1b":
        steps, model, limit = [prepare_random_1b(args.model_dir, SMOLLM2)], args.model_dir, "300"
    argv = script("eval_compare_hf.py", "--model", model, "--tasks", "mmlu,gpqa_diamond", "--limit", limit,
                  "--out", f"{out}/eval-compare")
    return steps + [Step("eval_compare_hf", argv, 570, show=r"^\|| differ|PASS|FAIL|Error", lines=40)]


# ---- bench ---------------------------------------------------------------------------------------------------

BENCHES = {
    "hf": "~5 min: tinyvllm bench --precision fast --compare hf on the random 1B model: latency, prefill 1,024 / "
          "4,096 tokens, the 256-request workload",
    "eval": "~10 min: how fast `tinyvllm eval` scores MMLU (0-shot, 5-shot with prefix caching) beside HF bf16 "
            "(--model as compare eval)",
    "serve": "~5 min: `tinyvllm serve` measured over HTTP beside the offline engine, greedy outputs compared "
             "(scripts/serve_bench.sh)",
}
BENCH_HF_ARGS = ["--precision", "fast", "--compare", "hf", "--workload", "latency,prefill,throughput",
                 "--prefill-lens", "1024,4096", "--prefill-repeats", "3", "--max-num-seqs", "256",
                 "--batching", "continuous", "--max-seconds", "60"]


def bench_steps(args: argparse.Namespace) -> list[Step]:
    if args.target == "hf":
        return [prepare_random_1b(args.model_dir),
                Step("bench", [PY, "-m", "tinyvllm.bench", "--random-1b", args.model_dir, *BENCH_HF_ARGS,
                               "--out", f"{args.out}/bench-fast"], 290, lines=22)]
    if args.target == "serve":
        return [Step("serve_bench", ["bash", "scripts/serve_bench.sh"], 520, lines=20,
                     env={"OUT": f"{args.out}/serve-bench", "MODEL": args.model_dir})]
    assert args.target == "eval", args.target
    model, steps, extra = args.model or SMOLLM2, [], ["--fewshot-limit", "3000"]
    if model == "random-1b":
        steps, model = [prepare_random_1b(args.model_dir, SMOLLM2)], args.model_dir
        extra = ["--fewshot-limit", "1000", "--max-seconds", "200"]
    return steps + [Step("eval_bench", script("eval_bench.py", "--model", model, "--out", f"{args.out}/eval-bench",
                                              *extra), 570, show=r"^(?!\[|mmlu \().*", lines=12)]


# ---- suite ---------------------------------------------------------------------------------------------------

def suite_steps(args: argparse.Namespace) -> list[Step]:
    """The test suite with TINYVLLM_TEST_GPU=1 (tests/conftest.py then leaves the simulator off), interrupted
    by SIGINT before the call's limit so pytest still prints what ran; the kernel cache under ./.gpu-cache
    (ignored by git) makes a second call on a warm machine compile nothing."""
    argv = [PY, "-m", "pytest",
            "-p", "no:cacheprovider", "-q", "-rfE", "--durations=20", f"--junitxml={args.out}/gpu_suite.xml",
            *(args.pytest_args or ["tests"])]
    env = {"TINYVLLM_TEST_GPU": "1", "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(ROOT / ".gpu-cache"))}
    unset = ("NUMBA_ENABLE_CUDASIM", "NUMBA_CACHE_DIR", "TINYVLLM_KERNEL_CACHE_DIR")
    probe = [PY, "-c", "from numba import cuda; d = cuda.get_current_device(); print('GPU:', d.name, "
             "d.compute_capability)"]
    return [Step("gpu_probe", probe, 60, lines=4, unset=unset, required=True),
            Step("gpu_suite", argv, args.timeout_s, show=r"^(FAILED|ERROR) |^\d+\.\d+s |passed|failed",
                 lines=60, env=env, unset=unset, signal="INT")]


# ---- profile -------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Tool:
    script: str
    help: str
    args: list[str] = dataclasses.field(default_factory=list)  # used when no arguments follow TOOL
    needs_model: bool = False                                   # takes --model-dir (the random 1B model)
    timeout_s: int = 300


TOOLS = {
    "decode": Tool("profile_decode.py", "~1.5 min: a decode step, graph vs eager, per stage, at batch 1 / 64 / 256",
                   ["--steps", "10", "--batches", "1,64,256"], True),
    "prefill": Tool("profile_prefill.py", "~1 min: a prompt's prefill graph, each stage's GPU time "
                    "against its floor", needs_model=True),
    "throughput": Tool("profile_throughput.py", "~3 min: the 256-request workload's steps, prefill vs decode by "
                       "batch size", needs_model=True),
    "ttft": Tool("profile_ttft.py", "~1 min: where a 1,024 / 4,096-token prompt's time to first token goes",
                 ["--tokens", "1024,4096", "--repeats", "3"], True),
    "trace-decode": Tool("trace_decode.py", "~1 min: every kernel of a decode step at batch 1 / 256 on the GPU's "
                         "clock, busy vs idle", ["--batches", "1,256"], True),
    "sweep-gemv": Tool("sweep_gemv.py", "~2 min: gemv_coalesced launch variants, GB/s per decode projection",
                       ["--shapes", "qkv,o_proj,gate_up,down"]),
    "sweep-tc-gemm": Tool("sweep_tc_gemm.py", "~2-5 min: gemm_tc tiles and split-K, TFLOP/s per prefill projection",
                          ["--tokens", "1024,4096", "--shapes", "qkv,o_proj,gate_up,down"]),
    "sweep-decode-attention": Tool("sweep_decode_attention.py", "~1.5 min: decode attention kernels and their "
                                   "launch shapes, KV GB/s", ["--cases", "1x256,1x2048,8x512,32x512,64x512,256x1024"]),
    "sweep-row-kernels": Tool("sweep_row_kernels.py", "~30 s: add_rmsnorm's block size and argmax's logits a "
                              "thread, per batch of rows"),
    "crossover-linear": Tool("crossover_linear.py", "~2 min: the token count where gemm_blocked overtakes "
                             "gemv_coalesced"),
    "decode-warps": Tool("time_decode_warps.py", "~1 min: decode_warps vs decode_gqa on a bf16 pool",
                         ["--warps", "2,4"]),
    "flash-decode": Tool("time_flash_decode.py", "~1 min: flash_decode_warps per partition size beside decode_gqa, "
                         "batch 1 and 4"),
    "kv-dtype-decode": Tool("time_kv_dtype_decode.py", "~2 min: decode attention on a float32 vs a bf16 KV pool"),
    "mlp-fast": Tool("time_mlp_fast.py", "~1 min: the fast path's MLP launches one by one"),
    "prefill-attention": Tool("time_prefill_attention.py", "~1 min: prefill_tc vs prefill_gqa at 1,024 / 4,096 "
                              "tokens", ["--kv-dtype", "bfloat16", "--tokens", "1024,4096"]),
    "prefill-graphs": Tool("time_prefill_graphs.py", "~3 min: prefill steps eager vs from their CUDA graph",
                           needs_model=True),
    "swiglu-gemm": Tool("time_swiglu_gemm.py", "~1 min: gate|up + SwiGLU fused in gemm_tc vs unfused",
                        ["--tokens", "1024,4096"]),
}


def profile_steps(args: argparse.Namespace) -> list[Step]:
    tool = TOOLS[args.target]
    tool_args = args.tool_args or tool.args
    steps = []
    if tool.needs_model:
        tool_args = ["--model-dir", args.model_dir, *tool_args]
        if args.model_dir != "demo":
            steps.append(prepare_random_1b(args.model_dir))
    name = Path(tool.script).stem
    return steps + [Step(name, script(tool.script, *tool_args), tool.timeout_s, lines=40)]


# ---- running -------------------------------------------------------------------------------------------------

def step_env(step: Step) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", **step.env)
    for name in step.unset:
        env.pop(name, None)
    return env


def summary_lines(log: Path, step: Step) -> list[str]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    if step.show:
        lines = [line for line in lines if re.search(step.show, line)]
    return lines[-step.lines:]


def run_steps(steps: list[Step], out: Path, dry_run: bool) -> int:
    if dry_run:
        for step in steps:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in step.env.items())
            print(f"# {step.name} -> {out}/{step.name}.log")
            print(f"{'env ' + env + ' ' if env else ''}{shlex.join(step.command())}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    start, results = time.monotonic(), []
    for step in steps:
        log = out / f"{step.name}.log"
        begin = time.monotonic()
        with log.open("w") as sink:
            rc = subprocess.run(step.command(), cwd=ROOT, env=step_env(step),
                                stdout=sink, stderr=subprocess.STDOUT).returncode
        results.append((step, rc, time.monotonic() - begin))
        print(f"[{time.monotonic() - start:5.0f} s] {step.name}: rc={rc}", flush=True)
        if rc and step.required:
            print(f"{step.name} failed: the steps after it are skipped")
            break
    print(f"---- summary (logs under {out}) ----")
    for step, rc, seconds in results:
        print(f"== {step.name}: rc={rc}{' (124: timed out)' if rc == 124 else ''}, {seconds:.0f} s")
        for line in summary_lines(out / f"{step.name}.log", step):
            print("  " + line)
    return next((rc for _, rc, _ in results if rc), 0)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpu.py", description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=TARGETS)
    subs = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def sub(name: str, summary: str, choices: dict[str, str] | None = None, default: str = "",
            random_model: bool = True) -> argparse.ArgumentParser:
        p = subs.add_parser(name, help=summary, description=summary,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="\n".join(f"  {k:<24}{v}" for k, v in (choices or {}).items()) or None)
        if choices and default:
            p.add_argument("target", nargs="?", choices=list(choices), default=default,
                           help=f"what to run (default {default}; listed below)")
        elif choices:
            p.add_argument("target", choices=list(choices), help="what to run (listed below)")
        p.add_argument("--out", default=os.environ.get("OUT", "out"), help="logs go here (default $OUT or ./out)")
        if random_model:
            p.add_argument("--model-dir", default=RANDOM_1B, help="the random Llama-3.2-1B-shaped model, written "
                                                                  "if missing (default %(default)s)")
        p.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
        return p

    sub("check", "~2-5 min a target: kernel and engine checks on the GPU (tests, SASS, timings)", CHECKS, "kernels")
    compare = sub("compare", "~2-10 min: tinyvllm against HF transformers, stage by stage and greedy tokens",
                  COMPARES, "random-1b")
    compare.add_argument("--model", help="fast: another model; gguf: the .gguf; eval: a .gguf, HF dir or random-1b")
    bench = sub("bench", "~5 min: tinyvllm bench --compare hf with the standard settings (or eval / serve)",
                BENCHES, "hf")
    bench.add_argument("--model", help="eval: a .gguf, an HF dir or random-1b (default $SMOLLM2)")
    suite = sub("suite", "~10 min a call: the test suite on the GPU (any pytest arguments; default tests/)",
                random_model=False)
    suite.add_argument("--timeout-s", type=int, default=int(os.environ.get("SUITE_TIMEOUT", 570)),
                       help="interrupt pytest after this long (default %(default)s, under a 600 s call)")
    suite.add_argument("pytest_args", nargs=argparse.REMAINDER,
                       help="a test path first, then any pytest options: tests/test_[a-m]*.py, tests -k kernels")
    profile = sub("profile", "~1-3 min: one profile / sweep / timing tool, its standard arguments or yours",
                  {name: tool.help for name, tool in TOOLS.items()})
    profile.add_argument("tool_args", nargs=argparse.REMAINDER, help="the tool's own arguments (replace the "
                                                                      "standard ones)")
    return top


TARGETS = f"""targets (each one's steps and time: gpu.py SUBCOMMAND --help):
  check    {", ".join(CHECKS)}
  compare  {", ".join(COMPARES)}
  bench    {", ".join(BENCHES)}
  profile  {", ".join(TOOLS)}
"""
STEPS = {"check": check_steps, "compare": compare_steps, "bench": bench_steps, "suite": suite_steps,
         "profile": profile_steps}


def take_own_options(passed_on: list[str], args: argparse.Namespace) -> None:
    """gpu.py's --out, --model-dir and --dry-run also when they come after TOOL or the pytest arguments (neither
    the profile tools nor pytest have options of those names): taken out of what is passed on."""
    own = ["--out", "--dry-run"] + (["--model-dir"] if "model_dir" in args else [])
    for option in own:
        while option in passed_on:
            at = passed_on.index(option)
            if option == "--dry-run":
                args.dry_run = True
                del passed_on[at]
            else:
                setattr(args, option[2:].replace("-", "_"), passed_on[at + 1])
                del passed_on[at:at + 2]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    take_own_options(getattr(args, "tool_args", None) or getattr(args, "pytest_args", None) or [], args)
    args.out = str(Path(args.out).resolve())  # the steps run from the repository root
    if args.command in ("compare", "bench") and args.target in ("gguf", "eval") and not args.dry_run:
        join_gguf_parts(args.model if args.model and args.model.endswith(".gguf") else SMOLLM2)
    return run_steps(STEPS[args.command](args), Path(args.out), args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
