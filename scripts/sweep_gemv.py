"""Sweep gemv_coalesced's launch variants on the GPU: GB/s of weight reads per decode projection shape.

    python scripts/sweep_gemv.py [--tokens 1] [--repeats 50]
Shapes are Llama-3.2-1B's decode projections (q|k|v, o, gate|up, down, LM head). Each variant is
(threads, rows per block, loads in flight per row, bf16 per load); the table gives GB/s of weight bytes
(the kernel's minimum traffic) timed with CUDA events over `repeats` launches captured in one CUDA graph,
as a decode step runs them (eager launches from Python cost more than a small projection takes), each
launch on another copy of the weights so they come from HBM, not the 50 MB L2; beside torch's bf16
matmul (cuBLAS, eager) on the same shape when torch is there.
    python scripts/sweep_gemv.py --shapes qkv,o_proj,gate_up,down
"""
import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
          "lm_head": (128256, 2048)}
VARIANTS = [(threads, rows, unroll, word) for threads, rows, unroll, word in itertools.product(
    (64, 128, 256), (1, 2, 4), (2, 4, 8), (2, 4)) if rows * unroll * word <= 64]


def time_launches(launch, repeats: int) -> float:
    """Mean seconds per launch over `repeats` back-to-back launches (CUDA events), after one untimed one."""
    from numba import cuda
    launch()
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(repeats):
        launch()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / repeats


def time_in_graph(launch, repeats: int) -> float:
    """Mean seconds per launch of `launch(i)` for i in range(repeats), captured into one CUDA graph and
    replayed (after one untimed replay). Buffers the launchers allocate are recorded by one eager launch
    and handed out again to each captured one (a BufferArena, as the decode graphs do)."""
    from cuda.core import Device, Stream
    from kernels_numba.common import BufferArena, cuda, launching_into
    arena = BufferArena()
    with launching_into(0, arena):
        launch(0)
    cuda.synchronize()
    builder = Device().create_graph_builder()
    builder.begin_building()
    with launching_into(builder, arena):
        for i in range(repeats):
            arena.rewind()
            launch(i)
    graph = builder.end_building().complete()
    stream = Stream.from_handle(0)
    graph.launch(stream)
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    start.record()
    graph.launch(stream)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    from numba import cuda
    from kernels_numba.matmul import gemv_coalesced
    rng = np.random.default_rng(0)
    best = {}
    rows_out = []
    shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
    for name, (n, k) in shapes.items():
        weight_bytes = n * k * 2
        copies = max(1, min(args.repeats, -(-256 * 2**20 // weight_bytes)))  # >= 256 MB: 5x the L2
        w_one = rng.integers(0x3C00, 0x3F00, (n, k)).astype(np.uint16)  # bf16 in [0.0078, 0.5)
        weights = [cuda.to_device(w_one) for _ in range(copies)]
        x = cuda.to_device(rng.standard_normal((args.tokens, k)).astype(np.float32))
        out = cuda.device_array((args.tokens, n), np.float32)
        for threads, rows, unroll, word in VARIANTS:
            seconds = time_in_graph(lambda i: gemv_coalesced(x, weights[i % copies], out, threads=threads, rows=rows,
                                                             unroll=unroll, word_elements=word), args.repeats)
            gbs = weight_bytes / seconds / 1e9
            rows_out.append((name, threads, rows, unroll, word, seconds * 1e6, gbs))
            if gbs > best.get(name, (0,))[0]:
                best[name] = (gbs, threads, rows, unroll, word)
        print(f"{name} {n}x{k}: best {best[name][0]:.0f} GB/s with threads={best[name][1]} rows={best[name][2]} "
              f"unroll={best[name][3]} word={best[name][4]}", flush=True)
    try:
        import torch
        for name, (n, k) in shapes.items():
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(args.tokens, k, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                x @ w.T
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.repeats):
                x @ w.T
            stop.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(stop) / 1e3 / args.repeats
            print(f"torch bf16 {name}: {n * k * 2 / seconds / 1e9:.0f} GB/s ({seconds * 1e6:.1f} us)")
    except ImportError:
        print("torch not importable: no cuBLAS reference")
    print("shape threads rows unroll word us GB/s")
    for r in sorted(rows_out, key=lambda r: (r[0], -r[6]))[:]:
        print(f"{r[0]} {r[1]} {r[2]} {r[3]} {r[4]} {r[5]:.1f} {r[6]:.0f}")


if __name__ == "__main__":
    main()
