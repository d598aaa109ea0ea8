"""Where gemv_coalesced (token passes, weights re-read from L2) stops beating gemm_blocked (64x64 tiles).

    python scripts/crossover_linear.py [--tokens 16,32,64,128,256,512,2048]
Times gemv_coalesced and gemm_blocked (also without split-K, and with 8x8 micro-tiles) on one
Llama-3.2-1B layer's projections (q|k|v, o, gate|up, down) with CUDA events and prints ms per layer for
each token count, and each projection's ms and TFLOP/s (so a kernel that leaves SMs idle on the narrow
projections shows); the last line is `crossover=T`: the largest token count at which gemv_coalesced is
still faster (the value for TINYVLLM_MAX_COALESCED_TOKENS). The launches are timed back to back from
Python, so a kernel shorter than a launch's host cost (tens of microseconds on the H200's host) is timed
at that cost: split-K's extra launch looks dearer here than inside a CUDA graph.
"""
import argparse
import functools
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYER = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="16,32,64,128,256,512,2048")
    parser.add_argument("--gemv-up-to", type=int, default=512, help="skip gemv_coalesced past this many tokens")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from numba import cuda
    from kernels_numba.matmul import gemm_blocked, gemv_coalesced
    from sweep_gemv import time_launches  # scripts/ is on the path when a script runs
    kernels = {"gemv_coalesced": gemv_coalesced, "gemm_blocked": gemm_blocked,
               "gemm_blocked_no_split": functools.partial(gemm_blocked, splits=1),
               "gemm_blocked_8x8": functools.partial(gemm_blocked, thread_features=8)}
    rng = np.random.default_rng(0)
    weights = {name: cuda.to_device(rng.integers(0x3C00, 0x3F00, shape).astype(np.uint16))
               for name, shape in LAYER.items()}
    crossover = 0
    print(f"ms for one layer's projections, per kernel; then per projection: ms and TFLOP/s ({', '.join(kernels)})")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        times = {}
        xs = {n: cuda.to_device(rng.standard_normal((tokens, k)).astype(np.float32)) for n, (_, k) in LAYER.items()}
        outs = {n: cuda.device_array((tokens, n_out), np.float32) for n, (n_out, _) in LAYER.items()}
        for name, kernel in kernels.items():
            if name == "gemv_coalesced" and tokens > args.gemv_up_to:
                continue
            for n in LAYER:
                times[name, n] = 1e3 * time_launches(lambda: kernel(xs[n], weights[n], outs[n]), args.repeats)
        ran = [name for name in kernels if (name, "qkv") in times]
        total = {name: sum(times[name, n] for n in LAYER) for name in ran}
        print(f"{tokens:>6} tokens: " + "  ".join(f"{name} {total[name]:.3f}" for name in ran), flush=True)
        for n in LAYER:
            flops = 2 * tokens * math.prod(LAYER[n])
            print(f"         {n:<8} " + "  ".join(f"{times[name, n]:.3f} ms {flops / times[name, n] / 1e9:.1f} TF/s"
                                               for name in ran), flush=True)
        if "gemv_coalesced" in total and total["gemv_coalesced"] < total["gemm_blocked"]:
            crossover = tokens
    print(f"crossover={crossover}")


if __name__ == "__main__":
    main()
