"""The `tinyvllm` command: generate text, check a model against golden files."""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from .errors import TinyVLLMError

DEFAULT_MAX_TOKENS = 32


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except TinyVLLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: say so plainly, traceback on request
        if os.environ.get("TINYVLLM_DEBUG"):
            traceback.print_exc()
        print(f"internal error: {type(e).__name__}: {e} (set TINYVLLM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 70


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinyvllm", description=__doc__)
    sub = parser.add_subparsers(metavar="COMMAND")

    def model_args(p):
        p.add_argument("--model", metavar="DIR", help="HF Llama model directory (default: the demo model)")
        p.add_argument("--max-model-len", type=int, metavar="N", help="context length held in the KV cache")
        p.add_argument("--max-seqs", type=int, default=8, metavar="N", help="sequences decoded together")

    g = sub.add_parser("generate", help="greedy-decode one or more prompts")
    model_args(g)
    g.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    g.add_argument("--prompts-file", metavar="FILE", help="one prompt per line")
    g.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    g.add_argument("--system", metavar="TEXT", help="system message for --chat")
    g.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N", help="new tokens per prompt")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence tokens")
    g.set_defaults(run=_generate)

    c = sub.add_parser("check-goldens", help="compare every stage of the forward pass with a golden file")
    model_args(c)
    c.add_argument("--goldens", metavar="FILE", help="golden .npz (default: goldens/demo.npz)")
    c.add_argument("--rtol", type=float, help="max error relative to each stage's largest value")
    c.add_argument("--no-greedy", action="store_true", help="skip the greedy continuation check")
    c.set_defaults(run=_check_goldens)
    return parser


def _load(args):
    from .model import load_model
    return load_model(args.model, max_seqs=args.max_seqs, max_seq_len=args.max_model_len)


def _read_prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise TinyVLLMError(f"cannot read prompts file {args.prompts_file}: {e.strerror}") from e
    if not prompts:
        raise TinyVLLMError("no prompt given: use --prompt TEXT (repeatable) or --prompts-file FILE")
    return prompts


def _generate(args) -> int:
    from .generate import generate_greedy
    if args.max_tokens < 1:
        raise TinyVLLMError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    prompts = _read_prompts(args)
    model = _load(args)
    tok = model.tokenizer
    if args.chat:
        def messages(p):
            return ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": p}]
        prompt_ids = [tok.encode_chat(messages(p)) for p in prompts]
    else:
        prompt_ids = [tok.encode(p) for p in prompts]
    print(f"generating for {len(prompts)} prompt(s), up to {args.max_tokens} new tokens each (greedy)",
          file=sys.stderr)
    start = time.perf_counter()
    completions = generate_greedy(model, prompt_ids, args.max_tokens, stop_on_eos=not args.ignore_eos)
    elapsed = time.perf_counter() - start
    for i, (prompt, c) in enumerate(zip(prompts, completions)):
        print(f"[{i}] {prompt!r}")
        if c.error:
            print(f"    error: {c.error}")
        else:
            print(f"    -> {c.text!r}  ({len(c.token_ids)} tokens, {c.finish_reason})")
    new_tokens = sum(len(c.token_ids) for c in completions)
    print(f"{new_tokens} tokens in {elapsed:.2f} s ({new_tokens / elapsed:.1f} tok/s, compilation included)",
          file=sys.stderr)
    return 1 if any(c.error for c in completions) else 0


def _check_goldens(args) -> int:
    from .golden_check import DEFAULT_GOLDENS, DEFAULT_RTOL, GreedyResult, Goldens, check_goldens
    goldens = Goldens.load(args.goldens or DEFAULT_GOLDENS)
    model = _load(args)
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

    report = check_goldens(model, goldens, rtol=rtol, check_greedy=not args.no_greedy, on_result=show)
    worst = max((s for s in report.stages if s.max_rel == s.max_rel), key=lambda s: s.max_rel, default=None)
    if worst:
        print(f"worst stage: prompt {worst.prompt} {worst.stage} rel err {worst.max_rel:.3e}")
    if report.passed:
        print(f"all {len(report.stages)} stages and {len(report.greedy)} greedy continuations PASS")
        return 0
    first = report.first_failure
    print("FAIL" + (f": first failing stage is prompt {first.prompt} {first.stage}" if first else ": greedy tokens differ"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
