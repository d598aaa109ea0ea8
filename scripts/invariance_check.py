"""Batch invariance measured: N prompts, each run alone and then all together, compared bit for bit.

    python scripts/invariance_check.py [--model DIR | FILE.gguf] [--prompts 48] [--max-prompt-len 400]
        [--max-tokens 48] [--precision fp32,fast] [--batch-invariant on,off] [--json OUT] [--expect-identical]

The prompts are random token ids from the model's vocabulary, seeded, their lengths uniform in [--min-prompt-len,
--max-prompt-len] (20 and 400; from 1 when the longest is below the shortest), run greedy with ignore_eos and
logprobs=1. One engine per (precision, batch invariance) combination; in it each prompt runs alone (one generate
call each, nothing else in flight), then all N together in one generate call (max_num_seqs N: they decode
together, and their prefills share steps in chunks of --max-num-batched-tokens).
Prefix caching is off unless --prefix-caching, so both runs compute every prompt token (with it, the batched run
reuses the blocks the alone runs cached, which must not change a bit either).

Per combination: the prompts whose tokens are identical, those whose logprobs are bit-identical too, the step of
each other prompt's first differing token, and the largest |logprob difference| before it (over the token ids
both runs logged at a step). The model is anything --model of the CLI takes (default: the demo model; a random
Llama-3.2-1B-shaped dir: scripts/write_random_1b.py; a .gguf file). It runs where kernels_numba runs: on the GPU,
or in numba's CUDA simulator with NUMBA_ENABLE_CUDASIM=1; the report says which. --expect-identical: exit status 1
when a combination with batch invariance on is not bit-identical for every prompt.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyvllm.errors import TinyVLLMError  # noqa: E402

PRECISIONS = ("fp32", "fast")
INVARIANCE = {"on": True, "off": False}


@dataclasses.dataclass
class Run:
    """One prompt's greedy tokens and, per token, {token id: logprob}."""
    tokens: list[int]
    logprobs: list[dict[int, float]]

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "logprobs": [[[t, lp] for t, lp in step.items()] for step in self.logprobs]}


def compare(alone: Run, together: Run) -> dict:
    """Where two runs of one prompt part: the first differing token (None: none), whether every logprob is the
    same float, and the largest |logprob difference| before the first differing token."""
    first = next((i for i, (a, b) in enumerate(zip(alone.tokens, together.tokens)) if a != b),
                 None if len(alone.tokens) == len(together.tokens) else min(len(alone.tokens), len(together.tokens)))
    steps = zip(alone.logprobs[:first], together.logprobs[:first])
    diffs = [abs(a[t] - b[t]) for a, b in steps for t in a.keys() & b.keys()]
    return {"first_divergence": first, "logprobs_identical": first is None and alone.logprobs == together.logprobs,
            "max_logprob_diff": max(diffs, default=0.0)}


def summarize(precision: str, invariant: bool, pairs: list[tuple[Run, Run]], prompts: list[list[int]]) -> dict:
    per_prompt = [dict(compare(a, b), prompt_len=len(p), prompt_ids=p, alone=a.to_json(), together=b.to_json())
                  for (a, b), p in zip(pairs, prompts)]
    firsts = [p["first_divergence"] for p in per_prompt if p["first_divergence"] is not None]
    return {"precision": precision, "batch_invariant": invariant, "prompts": len(pairs),
            "identical_tokens": len(pairs) - len(firsts),
            "identical_logprobs": sum(p["logprobs_identical"] for p in per_prompt),
            "first_divergence_steps": sorted(firsts),
            "first_divergence_histogram": {str(k): v for k, v in sorted(Counter(firsts).items())},
            "max_logprob_diff_before_divergence": max((p["max_logprob_diff"] for p in per_prompt), default=0.0),
            "per_prompt": per_prompt}


def not_invariant(combinations: list[dict]) -> list[dict]:
    """The combinations with batch invariance on in which some prompt's tokens or logprobs were not the same bits
    alone and together (identical logprobs imply identical tokens: compare)."""
    return [c for c in combinations if c["batch_invariant"] and c["identical_logprobs"] < c["prompts"]]


def random_prompts(seed: int, n: int, min_len: int, max_len: int, vocab_size: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, n)
    return [rng.integers(0, vocab_size, int(length)).tolist() for length in lengths]


def measure(model, prompts: list[list[int]], precision: str, invariant: bool, args, log) -> list[tuple[Run, Run]]:
    """Each prompt alone, then all together, through one fresh engine; the engine is freed before returning."""
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams
    config = EngineConfig(max_num_seqs=len(prompts), max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=max(map(len, prompts)) + args.max_tokens,
                          enable_prefix_caching=args.prefix_caching, precision=precision,
                          batch_invariant=invariant)
    engine = LLMEngine(model, config, log=log)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=1)
    as_run = lambda out: Run(list(out.token_ids), [dict(step) for step in out.logprobs])
    start, alone = time.perf_counter(), []
    for i, prompt in enumerate(prompts):
        (out,) = engine.generate([prompt], params)
        alone.append(as_run(out))
        if (i + 1) % 8 == 0 or i + 1 == len(prompts):
            log(f"  alone: {i + 1}/{len(prompts)} prompts ({time.perf_counter() - start:.1f} s)")
    start = time.perf_counter()
    together = [as_run(out) for out in engine.generate(prompts, params)]
    log(f"  together: {len(prompts)} prompts in one generate call ({time.perf_counter() - start:.1f} s)")
    del engine
    free_device_memory()
    return list(zip(alone, together))


def free_device_memory() -> None:
    """Free the last engine's KV pool now (numba frees lazily), before the next engine sizes its own."""
    from kernels_numba.common import SIMULATOR, cuda
    gc.collect()
    if not SIMULATOR:
        cuda.current_context().deallocations.clear()


def format_table(report: dict) -> str:
    s = report["settings"]
    lines = [f"{report['model']} on {report['device']}: {s['prompts']} prompts of {s['min_prompt_len']}-"
             f"{s['max_prompt_len']} tokens, {s['max_tokens']} greedy tokens, logprobs=1, each alone vs all together"
             f" (prefix caching {'on' if s['prefix_caching'] else 'off'})",
             f"{'precision':<10}{'invariant':<10}{'same tokens':>12}{'same logprobs':>15}{'max |dlogprob|':>16}"
             "  first divergence (step: prompts)"]
    for c in report["combinations"]:
        n = c["prompts"]
        steps = " ".join(f"{k}:{v}" for k, v in c["first_divergence_histogram"].items()) or "-"
        lines.append(f"{c['precision']:<10}{'on' if c['batch_invariant'] else 'off':<10}"
                     f"{c['identical_tokens']:>8}/{n:<3}{c['identical_logprobs']:>11}/{n:<3}"
                     f"{c['max_logprob_diff_before_divergence']:>16.3g}  {steps}")
    return "\n".join(lines)


def names(text: str, allowed, flag: str) -> list[str]:
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in chosen if x not in allowed]
    if not chosen or bad:
        raise TinyVLLMError(f"{flag} takes a comma-separated subset of {','.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(chosen))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", help="HF Llama dir or .gguf file (default: the demo model)")
    p.add_argument("--prompts", type=int, default=48, metavar="N", help="how many prompts (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts' lengths and ids")
    p.add_argument("--min-prompt-len", type=int, default=20, metavar="N",
                   help="shortest prompt (default: %(default)s; 1 when --max-prompt-len is below it)")
    p.add_argument("--max-prompt-len", type=int, default=400, metavar="N", help="longest prompt (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=48, metavar="N",
                   help="greedy tokens per prompt (default: %(default)s)")
    p.add_argument("--precision", default="fp32,fast", metavar="LIST",
                   help="comma-separated: fp32, fast (default: %(default)s)")
    p.add_argument("--batch-invariant", default="on,off", metavar="LIST",
                   help="comma-separated: on, off (default: %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, metavar="N",
                   help="the engine's token budget per step (default: %(default)s)")
    p.add_argument("--prefix-caching", action="store_true", help="let the batched run reuse the alone runs' blocks")
    p.add_argument("--json", metavar="OUT", help="write the report, every prompt's tokens and logprobs included")
    p.add_argument("--expect-identical", action="store_true",
                   help="exit status 1 unless every combination with batch invariance on is bit-identical")
    args = p.parse_args(argv)
    for flag in ("prompts", "max_prompt_len", "min_prompt_len", "max_tokens", "max_num_batched_tokens"):
        if getattr(args, flag) < 1:
            raise TinyVLLMError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.json and not os.access(Path(args.json).resolve().parent, os.W_OK):   # before the runs, not after
        raise TinyVLLMError(f"cannot write --json {args.json}: its directory is missing or not writable")
    if args.min_prompt_len > args.max_prompt_len:
        args.min_prompt_len = 1
    args.precisions = names(args.precision, PRECISIONS, "--precision")
    args.invariance = [INVARIANCE[x] for x in names(args.batch_invariant, tuple(INVARIANCE), "--batch-invariant")]
    return args


def run(args) -> int:
    from kernels_numba.common import SIMULATOR, cuda
    from tinyvllm.model.loader import load_model
    log = lambda message: print(message, file=sys.stderr, flush=True)
    model = load_model(args.model, log=log)
    prompts = random_prompts(args.seed, args.prompts, args.min_prompt_len, args.max_prompt_len,
                             model.config.vocab_size)
    device = "numba CUDA simulator" if SIMULATOR else cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else str(device)
    combinations = []
    for precision in args.precisions:
        for invariant in args.invariance:
            log(f"precision {precision}, batch invariance {'on' if invariant else 'off'}")
            pairs = measure(model, prompts, precision, invariant, args, log)
            combinations.append(summarize(precision, invariant, pairs, prompts))
            c = combinations[-1]
            log(f"  {c['identical_tokens']}/{c['prompts']} identical tokens, {c['identical_logprobs']}/"
                f"{c['prompts']} bit-identical logprobs")
    settings = {k: getattr(args, k) for k in ("prompts", "seed", "min_prompt_len", "max_prompt_len", "max_tokens",
                                              "max_num_batched_tokens", "prefix_caching")}
    report = {"format": "tinyvllm-invariance-check/1", "model": str(model.model_dir), "device": device,
              "simulator": SIMULATOR, "settings": settings, "combinations": combinations}
    print(format_table(report))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report) + "\n")
        except OSError as e:   # the table above stands; the report is lost, said in one line
            raise TinyVLLMError(f"cannot write --json {args.json}: {e.strerror}") from e
        log(f"wrote {args.json}")
    differs = not_invariant(combinations)
    if args.expect_identical and differs:
        log("not batch-invariant: " + ", ".join(f"{c['precision']} ({c['identical_logprobs']}/{c['prompts']} "
                                                 "bit-identical)" for c in differs))
        return 1
    return 0


def main(argv=None) -> int:
    try:
        return run(parse_args(argv))
    except TinyVLLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
