"""Where gemv_coalesced (token passes, weights re-read from L2) stops beating gemm_blocked (64x64 tiles).

    python scripts/crossover_linear.py [--tokens 16,32,64,128,256,512]
Times both kernels on one Llama-3.2-1B layer's projections (q|k|v, o, gate|up, down) with CUDA events
and prints ms per layer for each token count, and each projection's ms and TFLOP/s (so a kernel that
leaves SMs idle on the narrow projections shows); the last line is `crossover=T`: the largest token count
at which gemv_coalesced is still faster (the value for TINYVLLM_MAX_COALESCED_TOKENS).
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYER = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="16,32,64,128,256,512")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from numba import cuda
    from kernels_numba.matmul import gemm_blocked, gemv_coalesced
    from sweep_gemv import time_launches  # scripts/ is on the path when a script runs
    rng = np.random.default_rng(0)
    weights = {name: cuda.to_device(rng.integers(0x3C00, 0x3F00, shape).astype(np.uint16))
               for name, shape in LAYER.items()}
    crossover = 0
    print(f"{'tokens':>6} {'gemv_coalesced ms':>18} {'gemm_blocked ms':>16}  (one layer's projections; per "
          f"projection: ms and TFLOP/s, gemv / gemm)")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        times = {}
        for kernel in (gemv_coalesced, gemm_blocked):
            xs = {n: cuda.to_device(rng.standard_normal((tokens, k)).astype(np.float32)) for n, (_, k) in LAYER.items()}
            outs = {n: cuda.device_array((tokens, n_out), np.float32) for n, (n_out, _) in LAYER.items()}
            for n in LAYER:
                times[kernel.__name__, n] = 1e3 * time_launches(lambda: kernel(xs[n], weights[n], outs[n]),
                                                                args.repeats)
        total = {k.__name__: sum(times[k.__name__, n] for n in LAYER) for k in (gemv_coalesced, gemm_blocked)}
        detail = "  ".join(
            f"{n} {times['gemv_coalesced', n]:.3f}/{times['gemm_blocked', n]:.3f} ms "
            f"{2 * tokens * math.prod(LAYER[n]) / times['gemv_coalesced', n] / 1e9:.1f}/"
            f"{2 * tokens * math.prod(LAYER[n]) / times['gemm_blocked', n] / 1e9:.1f} TF/s" for n in LAYER)
        print(f"{tokens:>6} {total['gemv_coalesced']:>18.3f} {total['gemm_blocked']:>16.3f}  {detail}", flush=True)
        if total["gemv_coalesced"] < total["gemm_blocked"]:
            crossover = tokens
    print(f"crossover={crossover}")


if __name__ == "__main__":
    main()
