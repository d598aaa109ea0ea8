"""Sweep the launch shapes of the per-row kernels of a decode step on the GPU: add_rmsnorm and argmax.

    python scripts/sweep_row_kernels.py [--rows 1,64,256] [--threads 64,128,256,512,1024] [--per-thread 4,8,16,32]
- add_rmsnorm, the launch between two layers (x + residual -> h, rmsnorm(h) in float32 and as bf16 bits for the
  next GEMM), hidden 2048 (Llama-3.2-1B), per block size (--threads);
- argmax over 128,256 logits a row (the LM head's output), per logits a thread (--per-thread; blocks of
  sampling.ARGMAX_THREADS).
Random inputs; each launch timed inside a CUDA graph as the decode graphs run it (scripts/sweep_gemv.py's
time_in_graph), on its own copy of the rows. GB/s counts the bytes a launch must move (add_rmsnorm: x, residual
and the gains read, h, the output and its bf16 bits written; argmax: the logits).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

COPIES = 8


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,64,256")
    p.add_argument("--threads", default="64,128,256,512,1024")
    p.add_argument("--per-thread", default="4,8,16,32")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    from kernels_numba.common import cuda
    from kernels_numba.rmsnorm import add_rmsnorm
    from kernels_numba.sampling import argmax
    from sweep_gemv import time_in_graph
    rng = np.random.default_rng(0)

    def randn(shape):
        return rng.standard_normal(shape).astype(np.float32)

    gains = cuda.to_device((randn(args.hidden).view(np.uint32) >> 16).astype(np.uint16))
    print(f"{'kernel':<12} {'rows':>5} {'shape':>12} {'us':>8} {'GB/s':>8}")
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = [cuda.to_device(randn((rows, args.hidden))) for _ in range(COPIES)]
        residuals = [cuda.to_device(randn((rows, args.hidden))) for _ in range(COPIES)]
        h, out = cuda.device_array((rows, args.hidden), np.float32), cuda.device_array((rows, args.hidden), np.float32)
        bits = cuda.device_array((rows, args.hidden), np.uint16)
        moved = rows * args.hidden * (4 + 4 + 4 + 4 + 2) + args.hidden * 2
        for threads in [int(t) for t in args.threads.split(",")]:
            seconds = time_in_graph(lambda i: add_rmsnorm(xs[i % COPIES], residuals[i % COPIES], gains, 1e-5, out=out,
                                                          h_out=h, threads=threads, out_bits=bits), args.repeats)
            print(f"{'add_rmsnorm':<12} {rows:5d} {f'{threads} threads':>12} {seconds * 1e6:8.2f} "
                  f"{moved / seconds / 1e9:8.1f}", flush=True)
        logits = [cuda.to_device(randn((rows, args.vocab))) for _ in range(COPIES)]
        ids = cuda.device_array(rows, np.int32)
        for per_thread in [int(t) for t in args.per_thread.split(",")]:
            seconds = time_in_graph(lambda i: argmax(logits[i % COPIES], out=ids, per_thread=per_thread), args.repeats)
            print(f"{'argmax':<12} {rows:5d} {f'{per_thread} a thread':>12} {seconds * 1e6:8.2f} "
                  f"{rows * args.vocab * 4 / seconds / 1e9:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
