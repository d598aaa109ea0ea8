"""Sweep gemv_coalesced's launch variants on the GPU: GB/s of weight reads per decode projection shape.

    python scripts/sweep_gemv.py [--tokens 1] [--repeats 50]
Shapes are Llama-3.2-1B's decode projections (q|k|v, o, gate|up, down, LM head). Each variant is
(threads, rows per block, loads in flight per row, bf16 per load, block reduction); the table gives GB/s of
weight bytes (the kernel's minimum traffic) timed with CUDA events over `repeats` launches captured in one
CUDA graph, as a decode step runs them (eager launches from Python cost more than a small projection takes),
each launch on another copy of the weights so they come from HBM, not the 50 MB L2; beside torch's bf16
matmul (cuBLAS, eager) on the same shape when torch is there.
    python scripts/sweep_gemv.py --shapes qkv,o_proj,gate_up,down
`--kinds` adds the fused-GEMV layer's epilogues on the shapes that run them (KINDS: norm, norm_rope and
norm_then_rope_qkv, the two launches it replaces, on q|k|v; norm_swiglu on gate|up; residual on o_proj and
down), `--reduce shuffle,tree` times both block reductions (warp shuffles, the shared-memory tree; default:
the launchers' own, matmul.WARP_REDUCE), and `--variants default` times only the launch shape each launcher
picks by itself (a few compiles, not ~100):
    python scripts/sweep_gemv.py --shapes qkv,o_proj,gate_up,down --kinds all --reduce shuffle,tree --variants default
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
# The fused launchers read 4 bf16 a load: block size x rows a block (4 or 8: 2 or 4 pairs with SwiGLU or RoPE)
# x loads in flight.
FUSED_VARIANTS = [(threads, rows, unroll, None) for threads, rows, unroll in itertools.product(
    (64, 128, 256), (4, 8), (1, 2, 4)) if rows * unroll <= 16]
DEFAULT_VARIANT = (None, None, None, None)  # what the launcher picks
KINDS = {"qkv": ("plain", "norm", "norm_rope", "norm_then_rope_qkv"), "o_proj": ("plain", "residual"),
         "gate_up": ("plain", "norm_swiglu"), "down": ("plain", "residual"), "lm_head": ("plain",)}
REDUCES = {"shuffle": True, "tree": False, "default": None}  # None: matmul.WARP_REDUCE (for 1-2 tokens)
N_HEADS, N_KV_HEADS, HEAD_DIM = 32, 8, 64  # Llama-3.2-1B: q|k|v is (32 + 2 * 8) * 64 = 3072 rows


def make_launch(kind: str, tokens: int, n: int, k: int, rng):
    """launch(w, variant, warp_reduce) for one kind of epilogue on an n x k weight, its inputs and outputs
    allocated once here (fresh random activations, and for RoPE positions, slots and KV pools)."""
    from numba import cuda
    from kernels_numba.epilogues import RMSNormPrologue, ResidualEpilogue, RopeKVEpilogue, SwiGLUEpilogue
    from kernels_numba.matmul import gemv_coalesced, gemv_fused
    from kernels_numba.rope import rope_inv_freq, rope_qkv
    x = cuda.to_device(rng.standard_normal((tokens, k)).astype(np.float32))
    gains = cuda.to_device(rng.integers(0x3F00, 0x3F90, k).astype(np.uint16))  # bf16 in [0.5, 1.1)
    normed = cuda.device_array((tokens, k), np.float32)
    out = cuda.device_array((tokens, n // 2 if kind == "norm_swiglu" else n), np.float32)
    residual, residual_out = cuda.device_array_like(out), cuda.device_array_like(out)
    positions = cuda.to_device(np.arange(100, 100 + tokens, dtype=np.int32))
    slots = cuda.to_device(np.arange(tokens, dtype=np.int32))
    inv_freq = cuda.to_device(rope_inv_freq(HEAD_DIM, 500000.0, None))
    pools = tuple(cuda.device_array((64, 16, N_KV_HEADS, HEAD_DIM), np.float32) for _ in range(2))
    qkv_out = (cuda.device_array((tokens, N_HEADS, HEAD_DIM), np.float32),
               cuda.device_array((tokens, N_KV_HEADS, HEAD_DIM), np.float32),
               cuda.device_array((tokens, N_KV_HEADS, HEAD_DIM), np.float32))

    def launch(w, variant, warp_reduce):
        threads, rows, unroll, word = variant
        if kind == "plain":
            gemv_coalesced(x, w, out, threads=threads, rows=rows, unroll=unroll, word_elements=word,
                           warp_reduce=warp_reduce)
        elif kind == "residual":
            gemv_fused(x, w, epilogue=ResidualEpilogue(residual, residual_out), out=out, threads=threads,
                       unroll=unroll, warp_reduce=warp_reduce, rows=rows)
        elif kind in ("norm", "norm_swiglu", "norm_then_rope_qkv"):
            gemv_fused(x, w, RMSNormPrologue(gains, 1e-5, normed), SwiGLUEpilogue() if kind == "norm_swiglu" else None,
                       out, threads=threads, unroll=unroll, warp_reduce=warp_reduce, rows=rows)
            if kind == "norm_then_rope_qkv":
                rope_qkv(out, positions, inv_freq, N_HEADS, N_KV_HEADS, HEAD_DIM, *qkv_out, kv_pools=pools,
                         slot_mapping=slots)
        elif kind == "norm_rope":
            gemv_fused(x, w, RMSNormPrologue(gains, 1e-5, normed),
                       RopeKVEpilogue(positions, inv_freq, N_HEADS, N_KV_HEADS, HEAD_DIM, pools, slots, *qkv_out),
                       threads=threads, unroll=unroll, warp_reduce=warp_reduce, rows=rows)
        else:
            raise ValueError(f"unknown kind {kind!r}; known: {sorted({k for ks in KINDS.values() for k in ks})}")
    return launch


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
    parser.add_argument("--kinds", default="plain", help="comma-separated epilogues (see KINDS), or 'all'")
    parser.add_argument("--reduce", default="default",
                        help="block reductions to time, comma-separated: shuffle, tree, default (the launchers' own)")
    parser.add_argument("--variants", default="all", choices=("all", "default"),
                        help="all: the launch-shape sweep; default: the launchers' own choice only")
    args = parser.parse_args()
    from numba import cuda
    rng = np.random.default_rng(0)
    best = {}
    rows_out = []
    shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
    reduces = [REDUCES[r] for r in args.reduce.split(",")]
    for name, (n, k) in shapes.items():
        weight_bytes = n * k * 2
        copies = max(1, min(args.repeats, -(-256 * 2**20 // weight_bytes)))  # >= 256 MB: 5x the L2
        w_one = rng.integers(0x3C00, 0x3F00, (n, k)).astype(np.uint16)  # bf16 in [0.0078, 0.5)
        weights = [cuda.to_device(w_one) for _ in range(copies)]
        kinds = [kind for kind in KINDS[name] if args.kinds == "all" or kind in args.kinds.split(",")]
        for kind in kinds:
            launch = make_launch(kind, args.tokens, n, k, rng)
            if args.variants == "default":
                variants = [DEFAULT_VARIANT]
            else:
                variants = VARIANTS if kind == "plain" else FUSED_VARIANTS
            for variant, warp_reduce in itertools.product(variants, reduces):
                seconds = time_in_graph(lambda i: launch(weights[i % copies], variant, warp_reduce), args.repeats)
                gbs = weight_bytes / seconds / 1e9
                reduce = {True: "shuffle", False: "tree", None: "default"}[warp_reduce]
                rows_out.append((name, kind, reduce, *(v or "-" for v in variant), seconds * 1e6, gbs))
                key = (name, kind, reduce)
                if gbs > best.get(key, (0,))[0]:
                    best[key] = (gbs, seconds * 1e6, variant)
                if variants == [DEFAULT_VARIANT]:
                    print(f"{name} {kind} {reduce}: {seconds * 1e6:.1f} us ({gbs:.0f} GB/s)", flush=True)
            for reduce in REDUCES:
                if (name, kind, reduce) in best:
                    gbs, us, (threads, rows, unroll, word) = best[name, kind, reduce]
                    print(f"{name} {n}x{k} {kind} {reduce}: best {gbs:.0f} GB/s ({us:.1f} us) with threads={threads} "
                          f"rows={rows} unroll={unroll} word={word}", flush=True)
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
    print("shape kind reduce threads rows unroll word us GB/s")
    for r in sorted(rows_out, key=lambda r: (r[0], r[1], -r[8])):
        print(f"{r[0]} {r[1]} {r[2]} {r[3]} {r[4]} {r[5]} {r[6]} {r[7]:.1f} {r[8]:.0f}")


if __name__ == "__main__":
    main()
