"""`tinyvllm check-goldens`: compare every stage of the forward pass with a golden file (HF float32), and
the greedy continuations."""
from __future__ import annotations

from tinyvllm.engine.args import add_engine_arguments, build_engine
from tinyvllm.errors import TinyVLLMError


def add_arguments(p) -> None:
    add_engine_arguments(p)
    p.add_argument("--goldens", metavar="FILE", help="golden .npz (default: the demo model's, tinyvllm/goldens/demo.npz)")
    p.add_argument("--rtol", type=float, help="max error relative to each stage's largest value")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy continuation check")
    p.set_defaults(precision="fp32")  # goldens are HF float32: the fp32 path only


def run(args) -> int:
    from tinyvllm.golden_check import DEFAULT_GOLDENS, DEFAULT_RTOL, Goldens, GreedyResult, check_goldens
    if args.precision == "fast":
        raise TinyVLLMError("check-goldens compares with HF float32 goldens at 1e-4: it runs --precision fp32 only "
                            "(scripts/fast_path_compare.py checks the fast path against HF bf16 on a GPU)")
    if args.kv_cache_dtype == "bfloat16":
        raise TinyVLLMError("check-goldens compares with HF float32 goldens at 1e-4: it runs a float32 KV cache only")
    args.precision = "fp32"  # auto too
    args.kv_cache_dtype = "float32"
    goldens = Goldens.load(args.goldens or DEFAULT_GOLDENS)
    engine = build_engine(args, reference=True)
    _announce(engine, goldens, check_greedy=not args.no_greedy)
    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    print(f"goldens: {goldens.path} ({len(goldens.prompts)} prompts, source: {goldens.meta.get('source', '?')})")
    print(f"pass when max|ours - golden| / max|golden| <= {rtol:g}")
    print(f"{'prompt':>6}  {'stage':<26} {'max abs err':>12} {'max rel err':>12}  result")

    def show(r):
        if isinstance(r, GreedyResult):
            print(f"{r.prompt:>6}  greedy: {r.agreeing_prefix}/{len(r.golden)} tokens agree  "
                  f"{'PASS' if r.passed else 'FAIL'}  ours={r.ours} golden={r.golden}")
        else:
            verdict = "PASS" if r.passed else "FAIL"
            if r.note:
                verdict += f" ({r.note})"
            print(f"{r.prompt:>6}  {r.stage:<26} {r.max_abs:12.3e} {r.max_rel:12.3e}  {verdict}", flush=True)

    report = check_goldens(engine, goldens, rtol=rtol, check_greedy=not args.no_greedy, on_result=show)
    worst = max((s for s in report.stages if s.max_rel == s.max_rel), key=lambda s: s.max_rel, default=None)
    if worst:
        print(f"worst stage: prompt {worst.prompt} {worst.stage} rel err {worst.max_rel:.3e}")
    if report.passed:
        print(f"all {len(report.stages)} stages and {len(report.greedy)} greedy continuations PASS")
        return 0
    first = report.first_failure
    print("FAIL" + (f": first failing stage is prompt {first.prompt} {first.stage}" if first else ": greedy tokens differ"))
    return 1


def _announce(engine, goldens, check_greedy: bool) -> None:
    """The simulator's notice for a long check: every golden prompt prefilled in one step with logits for every
    row, then the greedy continuations (golden_check.check_goldens)."""
    from tinyvllm.runtime_estimate import Work, announce, engine_estimate
    new_tokens = max((len(g["greedy_ids"]) for g in goldens.prompts if "greedy_ids" in g), default=1)
    prompts = tuple(len(g["input_ids"]) for g in goldens.prompts)
    work = Work(prompts, ((new_tokens if check_greedy else 1),) * len(prompts), engine.config.max_num_seqs,
                engine.config.max_num_batched_tokens, every_prompt_token_logits=True)
    announce(engine_estimate(engine, work), f"{len(prompts)} golden prompts"
             + (f" and {new_tokens} greedy tokens each" if check_greedy else ""))
