"""Where a prefill's time goes on the GPU: one prompt of T tokens, its first engine step, stage by stage.

    python scripts/profile_prefill.py [--model-dir /tmp/llama-1b-random] [--tokens 128,1024,4096] [--precision fast]
For each T: the wall time of the step as the engine runs it (launches asynchronous, then one synchronize), and the
same step with a synchronize after each stage, whose per-stage host wall times (Stage.seconds) are summed by stage
kind (q, attn, mlp, ...) and by kernel. Launch overhead shows as the gap between the synchronized stages' sum and
the kernels' GPU time (CUDA events around the whole step).
"""
import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_step(engine, tokens: int, rng, synchronize: bool):
    from kernels_numba.common import cuda
    from tinyvllm.engine.sampling_params import SamplingParams
    ids = rng.integers(1, min(engine.model.config.vocab_size, 20000), tokens).tolist()
    engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    stages = []
    cuda.synchronize()
    start = time.perf_counter()
    generator = engine.step_stages(synchronize=synchronize)
    try:
        while True:
            stages.append(next(generator))
    except StopIteration:
        pass
    cuda.synchronize()
    seconds = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return seconds, stages


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--tokens", default="128,1024,4096")
    parser.add_argument("--precision", default="fast")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    sizes = [int(t) for t in args.tokens.split(",")]
    engine = LLMEngine(args.model_dir, EngineConfig(precision=args.precision, max_model_len=max(sizes) + 8,
                                                    max_num_batched_tokens=max(sizes), max_num_seqs=4,
                                                    num_blocks=max(sizes) // 16 + 64, enable_prefix_caching=False),
                       log=print)
    rng = np.random.default_rng(0)
    for tokens in sizes:
        one_step(engine, tokens, rng, False)  # compile this size's kernels
        free = sorted(one_step(engine, tokens, rng, False)[0] for _ in range(args.repeats))[args.repeats // 2]
        synced, stages = one_step(engine, tokens, rng, True)
        by_kind, by_kernel = collections.Counter(), collections.Counter()
        for s in stages:
            kind = s.name.split(".")[-1] if s.name.startswith("layers.") else s.name
            by_kind[kind] += s.seconds
            by_kernel[s.kernel] += s.seconds
        total = sum(s.seconds for s in stages)
        print(f"\nT={tokens} precision {engine.precision}: step {free * 1e3:.1f} ms as the engine runs it (median of "
              f"{args.repeats}); synchronized per stage {synced * 1e3:.1f} ms, of which stages {total * 1e3:.1f} ms "
              f"over {len(stages)} stages", flush=True)
        for kind, sec in by_kind.most_common(12):
            print(f"  stage {kind:<22} {sec * 1e3:8.2f} ms")
        for kernel, sec in by_kernel.most_common(12):
            print(f"  kernel {kernel:<50} {sec * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
