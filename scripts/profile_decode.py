"""Where a batch-1 decode step's time goes on the GPU: host (Python, launches, allocations) vs device.

    python scripts/profile_decode.py [--model-dir /tmp/llama-1b-random] [--steps 20]
Prints the wall time per step with per-stage synchronisation off and on, and cProfile's top entries.
"""
import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    from kernels_numba.common import cuda
    from tinyvllm.engine import EngineConfig, LLMEngine
    from tinyvllm.sampling_params import SamplingParams
    engine = LLMEngine(args.model_dir, EngineConfig(num_blocks=64, max_model_len=1024))
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    engine.add_request(list(range(1000, 1128)), params)
    for _ in range(5):  # prefill + warm-up decode steps (compilation)
        engine.step()
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    cuda.synchronize()
    print(f"decode step, batch 1: {(time.perf_counter() - start) / args.steps * 1e3:.2f} ms")
    per_stage = {}
    for stage in engine.step_stages(synchronize=True):
        per_stage.setdefault(stage.name.split(".")[-1], []).append(stage.seconds)
    print("one step with per-stage synchronisation, ms per stage kind (summed over layers):")
    for name, seconds in per_stage.items():
        print(f"  {name:<14} {sum(seconds) * 1e3:8.2f}  ({len(seconds)}x)")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        engine.step()
    cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
