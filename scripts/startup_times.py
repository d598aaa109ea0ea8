"""Start-up time on a GPU: how long `tinyvllm generate --prompt ... --max-tokens 8` takes to its first token in
a fresh process, with an empty kernel cache (first start: every kernel compiled) and again (second start: every
kernel loaded from the disk cache, see kernels_numba/common.py).

    python scripts/startup_times.py [--models demo,1b] [--random-1b DIR] [--out DIR]

Each model gets its own empty cache root (XDG_CACHE_HOME=OUT/cache-<model>, NUMBA_CACHE_DIR unset), then two
runs of the same command, each in a new Python process: the parent notes the wall clock just before starting
it, the child notes it when the engine reports the first token (a hook on LLMEngine.step) and when the
command is done, and how many kernels it compiled and how many it loaded from the cache. The 1B-shaped model is
written first (seeded random weights, tinyvllm.bench.prepare_random_model) if DIR has none. Logs: OUT/*.log;
the table is printed last and written to OUT/startup_times.md.

`--simulator` runs the same logic in numba's CUDA simulator (nothing is compiled or cached there, and only the
demo model is practical): a dry run of this script, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = "STARTUP_TIMES "
PROMPT = "The sun rose over the town"


def child(args) -> int:
    """Run `generate` in this process and print when its first token came (seconds since args.t0)."""
    sys.path.insert(0, str(REPO))
    from tinyvllm.engine import engine as engine_module
    from tinyvllm.cli import main
    imported = time.time()
    first_token = []
    step = engine_module.LLMEngine.step

    def timed_step(self):
        outputs = step(self)
        if not first_token and any(o.new_token_ids for o in outputs):
            first_token.append(time.time())
        return outputs
    engine_module.LLMEngine.step = timed_step
    argv = ["generate", "--prompt", args.prompt, "--max-tokens", str(args.max_tokens)]
    if args.model:
        argv += ["--model", args.model]
    code = main(argv)
    done = time.time()
    from kernels_numba.common import SIMULATOR, kernel_cache_stats
    compiled, loaded = (None, None) if SIMULATOR else kernel_cache_stats()
    print(MARKER + json.dumps({
        "exit_code": code, "import_s": imported - args.t0,
        "first_token_s": first_token[0] - args.t0 if first_token else None, "done_s": done - args.t0,
        "kernels_compiled": compiled, "kernels_loaded": loaded,
        "cache_dir": os.environ.get("NUMBA_CACHE_DIR")}), flush=True)
    return code


def run_once(model: str | None, cache_root: Path, log_path: Path, args) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_root), PYTHONUNBUFFERED="1")
    for name in ("NUMBA_CACHE_DIR", "TINYVLLM_KERNEL_CACHE_DIR"):  # this run's cache root, nothing inherited
        env.pop(name, None)
    if args.simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--prompt", args.prompt,
               "--max-tokens", str(args.max_tokens)] + (["--model", model] if model else [])
    t0 = time.time()
    proc = subprocess.run(command + ["--t0", repr(t0)], env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - t0
    log_path.write_text(f"$ {' '.join(command)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"run failed (exit {proc.returncode}); see {log_path}:\n{proc.stderr[-2000:]}")
    return dict(json.loads(lines[-1][len(MARKER):]), wall_s=wall)


def table(rows: list[dict]) -> str:
    def seconds(x):
        return "-" if x is None else f"{x:.2f}"

    def count(x):
        return "-" if x is None else str(x)
    lines = ["| model | start | first token (s) | whole command (s) | kernels compiled | loaded from cache |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['start']} | {seconds(r['first_token_s'])} | {seconds(r['wall_s'])} | "
                     f"{count(r['kernels_compiled'])} | {count(r['kernels_loaded'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="demo,1b", help="comma-separated: demo, 1b")
    p.add_argument("--random-1b", default="/tmp/llama-1b-random", metavar="DIR",
                   help="the 1B-shaped model dir (written if missing)")
    p.add_argument("--out", default="out/startup", metavar="DIR")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--simulator", action="store_true", help="dry run in the CUDA simulator")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - {"demo", "1b"}
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}: choose from demo, 1b")
    rows = []
    for name in models:
        model_dir = None
        if name == "1b":
            sys.path.insert(0, str(REPO))
            from tinyvllm.bench import prepare_random_model
            model_dir = str(prepare_random_model(Path(args.random_1b), log=print))
        cache_root = out / f"cache-{name}"
        if cache_root.exists() and any(cache_root.iterdir()):
            raise SystemExit(f"{cache_root} is not empty: give a fresh --out")
        for start in ("first (empty cache)", "second"):
            log_path = out / f"{name}-{start.split()[0]}.log"
            result = run_once(model_dir, cache_root, log_path, args)
            rows.append(dict(result, model=name, start=start))
            print(f"{name}, {start} start: first token after {result['first_token_s']:.2f} s, "
                  f"whole command {result['wall_s']:.2f} s (log: {log_path})", flush=True)
    report = table(rows)
    device = "the CUDA simulator (dry run)" if args.simulator else "GPU"
    (out / "startup_times.md").write_text(f"Start-up times on {device}, `generate --prompt {args.prompt!r} "
                                          f"--max-tokens {args.max_tokens}`:\n\n{report}\n")
    (out / "startup_times.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
