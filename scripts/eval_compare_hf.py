"""Cross-check `tinyvllm eval` against HF transformers on the same questions, prompts and continuations.

Both score every question by log-likelihood (lm-evaluation-harness's mmlu / gpqa prompts): tinyvllm through
its engine (float32 compute on bf16 weights), HF transformers in float32 (eager attention) on the same
weights rounded to bf16. PASS, per task: every question scored by both, the same answer picked except
where HF's top two choices are within --margin nats (a near tie that float32 rounding may flip), and no
choice score further than --score-tol from HF's. Writes OUT/compare.json and OUT/compare.md, prints the table.

Why these tolerances: both sides differ only in float32 summation order; the golden checks see stage
errors ~1e-5 of the largest value, i.e. logit errors ~1e-3 on a model whose logits reach 30-50 after 30
layers, so a score (a sum of 1-3 logprobs) moves by a few 1e-3: --margin 5e-3, --score-tol 2e-2. A real
defect (a wrong row, position, token or kernel) moves scores by 1e-1 or more.

    python scripts/eval_compare_hf.py --model DIR [--tasks mmlu,gpqa_diamond] [--limit 500] [--num-fewshot 0]
                                      [--hf-device cuda] [--out out/eval-compare]
    # dry run in the simulator on the demo model:
    NUMBA_ENABLE_CUDASIM=1 python scripts/eval_compare_hf.py --limit 8 --seed 3 --max-context 140 \\
        --hf-device cpu --num-blocks 64 --tasks mmlu
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
    p.add_argument("--model", help="HF model directory (default: the demo model; a GGUF: `tinyvllm convert` it first)")
    p.add_argument("--tasks", default="mmlu,gpqa_diamond")
    p.add_argument("--limit", type=int, default=500, help="stratified subset per task (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-fewshot", type=int, default=0)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--margin", type=float, default=5e-3, help="near-tie margin, nats")
    p.add_argument("--score-tol", type=float, default=2e-2, help="largest allowed |score difference|, nats")
    p.add_argument("--hf-device", default="cuda")
    p.add_argument("--hf-batch-tokens", type=int, default=16384)
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--out", default=str(ROOT / "out" / "eval-compare"))
    args = p.parse_args()
    t0 = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr, flush=True)

    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.evaluation.backends import EngineBackend
    from tinyvllm.evaluation.compare import compare_runs, format_comparison
    from tinyvllm.evaluation.hf_scoring import HFBackend, load_hf_model
    from tinyvllm.evaluation.runner import EvalConfig, prepare_task, run_task, select
    from tinyvllm.model.loader import load_model

    model = load_model(args.model, log=log)
    engine = LLMEngine(model, EngineConfig(max_num_seqs=args.max_num_seqs,
                                           max_num_batched_tokens=args.max_num_batched_tokens,
                                           num_blocks=args.num_blocks, max_model_len=args.max_context,
                                           precision="fp32"), log=log)  # HF float32: the fp32 path
    config = EvalConfig(tasks=tuple(args.tasks.split(",")), num_fewshot=args.num_fewshot, limit=args.limit or None,
                        seed=args.seed, max_context=min(args.max_context, engine.max_model_len))
    tokenizer = engine.tokenizer
    prepared = [prepare_task(task, config, tokenizer) for task in config.tasks]
    selection = select(prepared, config)
    ours = [run_task(p_, selection[p_.task], config, EngineBackend(engine), tokenizer) for p_ in prepared]
    log("tinyvllm done; loading HF transformers (float32, eager)")
    hf = HFBackend(load_hf_model(model.model_dir, args.hf_device, "float32"), batch_tokens=args.hf_batch_tokens)
    refs = [run_task(p_, selection[p_.task], config, hf, tokenizer) for p_ in prepared]
    rows = [compare_runs(a, b, args.margin, args.score_tol) for a, b in zip(ours, refs)]
    table = format_comparison(rows, "tinyvllm", "HF")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": str(model.model_dir), "hf": hf.name, "config": vars(args), "tasks": rows,
              "passed": all(r["passed"] for r in rows), "wall_seconds": time.perf_counter() - t0}
    (out / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "compare.md").write_text(
        f"# tinyvllm eval vs HF transformers\n\nmodel `{model.model_dir}`, {hf.name}, "
        f"{config.num_fewshot}-shot loglikelihood, --limit {args.limit} (seed {args.seed}), margin {args.margin} "
        f"nats, score tolerance {args.score_tol} nats\n\n{table}\n")
    print(table)
    for r in rows:
        for d in r["differ"][:10]:
            print(f"  {r['task']} {d['id']}: tinyvllm {'ABCD'[d['ours']]} HF {'ABCD'[d['ref']]} "
                  f"(HF margin {d['ref_margin']:.2e}, max score diff {d['max_score_diff']:.2e})")
    print("PASS" if report["passed"] else "FAIL")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
