"""How fast `tinyvllm eval` scores MMLU on a GPU, beside HF transformers in the same run.

1. MMLU 0-shot loglikelihood, the full test set (or --limit): tinyvllm (a fresh engine; kernels compiled by
   a warm-up first) and HF transformers (bf16, sdpa, right-padded batches of --hf-batch-tokens; only the
   scored positions go through the LM head): wall time, prompt tokens per second (the questions' prompt
   tokens over the wall time; scoring is prefill-bound, one next-token request per question), accuracy,
   the tinyvllm / HF ratio, and how many answers the two pick alike (HF in bf16 is not expected to match
   exactly; scripts/eval_compare_hf.py is the exactness check).
2. MMLU 5-shot (--fewshot-limit questions, stratified): tinyvllm with and without prefix caching, each on
   a fresh engine: the five dev examples are the same for every question of a subject, so cached prompt
   blocks should make them nearly free: hit rate and speed-up.
Each run stops starting new questions after --max-seconds and reports what it finished.

    python scripts/eval_bench.py --model DIR [--limit 0] [--fewshot-limit 2000] [--out out/eval-bench]
    NUMBA_ENABLE_CUDASIM=1 python scripts/eval_bench.py --limit 3 --fewshot-limit 2 --max-context 200 \\
        --hf-device cpu --num-blocks 128 --warmup 1        # a dry run of the logic on the demo model
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="HF model directory (default: the demo model)")
    p.add_argument("--limit", type=int, default=0, help="0-shot questions (0: all 14,042)")
    p.add_argument("--fewshot-limit", type=int, default=2000, help="5-shot questions (0: skip the 5-shot runs)")
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--max-seconds", type=float, default=150.0, help="per run")
    p.add_argument("--warmup", type=int, default=32, help="questions of the warm-up run")
    p.add_argument("--hf-device", default="cuda")
    p.add_argument("--hf-batch-tokens", type=int, default=65536)
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--gpu-memory-fraction", type=float, default=0.3)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--out", default=str(ROOT / "out" / "eval-bench"))
    args = p.parse_args()
    t0 = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr, flush=True)

    from kernels_numba.common import SIMULATOR, cuda
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.evaluation.backends import EngineBackend
    from tinyvllm.evaluation.runner import EvalConfig, prepare_task, run_task, select
    from tinyvllm.model.loader import load_model

    model = load_model(args.model, log=log)
    tokenizer = model.tokenizer

    def engine(prefix_caching: bool = True, timed: bool = True) -> LLMEngine:
        made = LLMEngine(model, EngineConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            num_blocks=args.num_blocks, gpu_memory_fraction=args.gpu_memory_fraction,
            max_model_len=args.max_context, enable_prefix_caching=prefix_caching), log=log)
        if timed:  # every graph captured before the timed run, so no capture is timed with the questions
            made.capture_graphs(log)
        return made

    def prepared(shots: int, limit: int):
        config = EvalConfig(num_fewshot=shots, limit=limit or None, max_context=args.max_context)
        task = prepare_task("mmlu", config, tokenizer)
        return config, task, select([task], config)["mmlu"]

    def timed_run(name, config, task, selected, backend, sync=lambda: None) -> dict:
        log(f"{name}: {len(selected)} questions")
        run = run_task(task, selected, config, backend, tokenizer)
        sync()
        done = [r for r in run.results if r.evaluated]
        tokens = sum(r.prompt_tokens for r in done)
        row = {"run": name, "questions": len(selected), "done": len(done),
               "too_long": sum(r.status == "too_long" for r in run.results),
               "not_run": sum(r.status == "error" for r in run.results), "seconds": run.seconds,
               "prompt_tokens": tokens, "prompt_tok_per_s": tokens / run.seconds if run.seconds else None,
               "accuracy": sum(r.correct for r in done) / len(done) if done else None, **run.backend_stats}
        log(f"{name}: {row['done']} done in {row['seconds']:.1f} s, {row['prompt_tok_per_s'] or 0:.0f} prompt tok/s")
        return row, run

    sync = (lambda: None) if SIMULATOR else cuda.synchronize
    rows, report = [], {"model": str(model.model_dir), "args": vars(args), "simulator": SIMULATOR}
    config0, task0, selected0 = prepared(0, args.limit)
    if args.warmup:
        warm = EngineBackend(engine(timed=False))  # (its graphs would be captured only to be dropped)
        run_task(task0, selected0[:args.warmup], config0, warm, tokenizer)
        del warm
    row, ours0 = timed_run("tinyvllm 0-shot", config0, task0, selected0,
                           EngineBackend(engine(), deadline=time.perf_counter() + args.max_seconds), sync)
    rows.append(row)
    if not args.no_hf:
        from tinyvllm.evaluation.hf_scoring import HFBackend, load_hf_model
        hf_model = load_hf_model(model.model_dir, args.hf_device, "bfloat16")
        warm = HFBackend(hf_model, args.hf_batch_tokens)
        run_task(task0, selected0[:args.warmup or 1], config0, warm, tokenizer)
        hf = HFBackend(hf_model, args.hf_batch_tokens, deadline=time.perf_counter() + args.max_seconds)
        row, ref0 = timed_run("HF bf16 0-shot", config0, task0, selected0, hf, hf.synchronize)
        row["backend"] = hf.name
        same = [(a.prediction == b.prediction) for a, b in zip(ours0.results, ref0.results)
                if a.evaluated and b.evaluated]
        report["same_answer_as_hf"] = {"questions": len(same), "same": sum(same)}
        rows.append(row)
        del hf_model, warm, hf
    if args.fewshot_limit:
        config5, task5, selected5 = prepared(5, args.fewshot_limit)
        for caching in (True, False):
            name = f"tinyvllm 5-shot, prefix caching {'on' if caching else 'off'}"
            backend = EngineBackend(engine(caching), deadline=time.perf_counter() + args.max_seconds)
            rows.append(timed_run(name, config5, task5, selected5, backend, sync)[0])
    report["rows"] = rows
    report["ratios"] = ratios(rows)
    report["wall_seconds"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = format_table(rows, report)
    (out / "eval-bench.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "eval-bench.md").write_text(f"# tinyvllm eval speed: `{model.model_dir}`\n\n{table}\n")
    print(table)
    return 0


def ratios(rows: list[dict]) -> dict:
    by = {r["run"]: r for r in rows}
    out = {}
    ours, hf = by.get("tinyvllm 0-shot"), by.get("HF bf16 0-shot")
    if ours and hf and ours["prompt_tok_per_s"] and hf["prompt_tok_per_s"]:
        out["tinyvllm_over_hf_0shot"] = ours["prompt_tok_per_s"] / hf["prompt_tok_per_s"]
    on, off = by.get("tinyvllm 5-shot, prefix caching on"), by.get("tinyvllm 5-shot, prefix caching off")
    if on and off and on["prompt_tok_per_s"] and off["prompt_tok_per_s"]:
        out["prefix_caching_speedup_5shot"] = on["prompt_tok_per_s"] / off["prompt_tok_per_s"]
    return out


def format_table(rows: list[dict], report: dict) -> str:
    lines = ["| run | questions done | too long | wall s | prompt tokens | prompt tok/s | accuracy | prefix hit rate |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        hit = r.get("prefix_cache_hit_rate")
        lines.append(f"| {r['run']} | {r['done']}/{r['questions']} | {r['too_long']} | {r['seconds']:.1f} | "
                     f"{r['prompt_tokens']} | {r['prompt_tok_per_s'] or 0:.0f} | "
                     f"{100 * (r['accuracy'] or 0):.2f} % | {'' if hit is None else f'{100 * hit:.1f} %'} |")
    for name, value in report["ratios"].items():
        lines.append(f"\n{name}: {value:.2f}x")
    if "same_answer_as_hf" in report:
        s = report["same_answer_as_hf"]
        lines.append(f"\nsame answer as HF bf16 on {s['same']} of {s['questions']} questions")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
