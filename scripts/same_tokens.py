"""Greedy tokens and logprobs of one engine run, written as JSON, to show that two versions of tinyvllm behave
the same: run it once per version over the same model (only the public API is used), then compare the files with
--compare A B (bit for bit: every token id and every logprob float).

    python same_tokens.py --model DIR --out A.json [--precision fp32|fast] [--prompts 48]
    python same_tokens.py --compare A.json B.json
"""
import argparse
import json
import sys
import time

import numpy as np


def run(args) -> None:
    import tinyvllm
    from tinyvllm import EngineConfig, LLMEngine, SamplingParams
    print(f"tinyvllm from {tinyvllm.__file__}", flush=True)
    rng = np.random.default_rng(1234)
    lengths = rng.integers(20, args.max_prompt_len, size=args.prompts)
    out = {}
    for precision in args.precision.split(","):
        engine = LLMEngine(args.model, EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                                    precision=precision))
        vocab = engine.model.config.vocab_size
        prompts = [rng.integers(100, min(vocab, 50000), size=int(n)).tolist() for n in lengths]
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=1, ignore_eos=True)
        start = time.perf_counter()
        results = engine.generate(prompts, params)
        seconds = time.perf_counter() - start
        out[precision] = [{"tokens": r.token_ids,
                           "logprobs": [[[int(t), float(lp)] for t, lp in sorted(d.items())] for d in r.logprobs]}
                          for r in results]
        print(f"{precision}: {len(results)} requests, {sum(len(r.token_ids) for r in results)} tokens "
              f"in {seconds:.1f} s", flush=True)
        del engine
    with open(args.out, "w") as f:
        json.dump(out, f)


def compare(a_path: str, b_path: str) -> int:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    worst = 0
    for precision in sorted(set(a) | set(b)):
        ra, rb = a.get(precision), b.get(precision)
        if ra is None or rb is None:
            print(f"{precision}: only in one file"); worst = 1; continue
        same_tokens = sum(x["tokens"] == y["tokens"] for x, y in zip(ra, rb))
        same_all = sum(x == y for x, y in zip(ra, rb))
        diffs = [abs(p[1] - q[1]) for x, y in zip(ra, rb) for da, db in zip(x["logprobs"], y["logprobs"])
                 for p, q in zip(da, db) if p[0] == q[0]]
        print(f"{precision}: greedy tokens identical {same_tokens}/{len(ra)}, tokens and logprobs bit-identical "
              f"{same_all}/{len(ra)}, largest logprob difference {max(diffs, default=0.0):.3g}")
        if same_all != len(ra) or len(ra) != len(rb):
            worst = 1
    print("SAME" if worst == 0 else "DIFFERENT")
    return worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--precision", default="fp32,fast")
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--max-prompt-len", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
