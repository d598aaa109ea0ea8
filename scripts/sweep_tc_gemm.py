"""Sweep gemm_tc's tile shapes (and split-K) on the GPU: TFLOP/s per prefill projection shape, against gemm_blocked
(fp32 CUDA cores, the current prefill GEMM) and torch's bf16 matmul (cuBLAS) when torch has CUDA.

    python scripts/sweep_tc_gemm.py [--tokens 128,512,1024,4096] [--shapes qkv,o_proj,gate_up,down] [--repeats 20]
                                    [--tiles all|default|0,5,6|128x128x64x2x2x3,...] [--splits 1,2,4,8]
    python scripts/sweep_tc_gemm.py --tokens 64,256 --splits 1,2,4,8 --tiles 4,5,6,7   # decode batches, split-K
    python scripts/sweep_tc_gemm.py --tiles default --wgmma-tiles 256x2x4,64x1x6 --no-fp32  # and gemm_wgmma (Hopper)
Shapes are Llama-3.2-1B's projections (N x K). gemm_tc is timed on bf16 activations (the kernel alone; the
float32 -> bf16 rounding gemm_tc does first for float32 x is timed once per shape, `to_bf16`), launches captured
in one CUDA graph and replayed (sweep_gemv.time_in_graph), each launch on another copy of the weights while
they are small enough for copies to exceed the L2. Every variant's output is checked first against numpy
float64 on 64 rows x 256 columns: `err/bound` is the worst error over gemm_tc's stated bound (<= 1 passes).
The last lines give each shape's best tile (x splits), what the plan picks (gemm_tc.tile_for, split_for) and its
time beside the best, and the tile with the best geometric mean over all cases. `--splits`: every tile at each of
those split-K splits (those past K's slices skipped); splits 1 is the one-pass kernel. `--wgmma-tiles`: gemm_wgmma
at each WgmmaTile written BLOCK_NxCONSUMERSxSTAGES, timed and checked the same way (Hopper only); `--no-fp32`
skips gemm_blocked.
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
          "lm_head": (128256, 2048)}
# (block_m, block_n, block_k, warps_m, warps_n, stages); TileShape.check rejects what passes 227 KB of shared memory.
# `--tiles` takes indices into this list (new tiles go at its end, so old indices keep naming the same tile).
TILES = [(128, 128, 32, 2, 2, 2), (128, 128, 16, 2, 2, 3), (128, 128, 32, 2, 4, 2), (128, 128, 32, 4, 2, 2),
         (128, 64, 32, 2, 2, 3), (64, 128, 32, 2, 2, 3), (64, 64, 32, 2, 2, 4), (64, 64, 64, 2, 2, 2),
         (128, 256, 16, 2, 4, 2), (256, 128, 16, 4, 2, 2),
         # 10-19: past the 48 KB a static shared declaration allowed (dynamic shared memory, opted in at launch):
         # deeper pipelines and block_k 64; warps of 64 x 64 (128 accumulators a thread) or 64 x 32 / 32 x 64
         (128, 128, 32, 2, 2, 3), (128, 128, 32, 2, 2, 4), (128, 128, 64, 2, 2, 3), (128, 128, 64, 2, 2, 4),
         (128, 128, 64, 2, 4, 3), (64, 128, 32, 2, 2, 4), (64, 128, 64, 2, 2, 3), (128, 256, 32, 2, 4, 3),
         (256, 128, 32, 4, 2, 3), (128, 256, 64, 2, 4, 3)]


def parse_tiles(spec: str) -> list[tuple]:
    """'all', or comma-separated indices into TILES and literal shapes written 128x128x64x2x2x3."""
    if spec == "all":
        return list(TILES)
    return [tuple(int(v) for v in item.split("x")) if "x" in item else TILES[int(item)] for item in spec.split(",")]


def check(got_rows, x_bits, w_bits, rows, columns):
    """Worst |err| / bound on the sampled rows and columns (bound: K 2^-23 sum |x w|, see gemm_tc)."""
    import ml_dtypes
    x = x_bits[rows].view(ml_dtypes.bfloat16).astype(np.float64)
    w = w_bits[columns].view(ml_dtypes.bfloat16).astype(np.float64)
    want = x @ w.T
    bound = x.shape[1] * 2.0**-23 * (np.abs(x) @ np.abs(w).T)
    got = got_rows[:, columns].astype(np.float64)
    if np.isnan(got).any():
        return math.inf
    return float((np.abs(got - want) / bound).max())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="128,512,1024,4096")
    parser.add_argument("--shapes", default="qkv,o_proj,gate_up,down")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiles", default="all", help="'all', 'default', or indices into TILES and shapes like "
                                                       "128x128x64x2x2x3 (block m, n, k, warps m, n, stages), "
                                                       "comma-separated")
    parser.add_argument("--splits", default="1", help="split-K splits to time each tile at (comma-separated)")
    parser.add_argument("--wgmma-tiles", default="", help="gemm_wgmma tiles BLOCK_NxCONSUMERSxSTAGES, comma-separated")
    parser.add_argument("--no-fp32", action="store_true", help="skip gemm_blocked (fp32 CUDA cores)")
    args = parser.parse_args()
    from kernels_numba.gemm_wgmma import WgmmaTile, gemm_wgmma
    wgmma_tiles = [WgmmaTile(*(int(v) for v in item.split("x"))) for item in filter(None, args.wgmma_tiles.split(","))]
    from kernels_numba.common import cuda
    from kernels_numba.gemm_tc import (DEFAULT_TILE, TileShape, gemm_tc, gemm_tc_kernel, split_for, tile_for,
                                       to_bf16_rows)
    from kernels_numba.matmul import gemm_blocked
    from sweep_gemv import time_in_graph
    if args.tiles == "default":
        tiles = [DEFAULT_TILE]
    else:
        tiles = []
        for spec in parse_tiles(args.tiles):
            tile = TileShape(*spec)
            try:
                gemm_tc_kernel(tile)
                tiles.append(tile)
            except AssertionError as e:
                print(f"skip {spec}: {e}")
    for tile in tiles:
        print(f"tile {tile}: {tile.threads} threads, {tile.shared_bytes()} B of shared memory "
              f"({tile.shared_bytes() / 1024:.1f} KB)", flush=True)
    try:
        import torch
        torch_cuda = torch.cuda.is_available()
    except ImportError:
        torch_cuda = False
    rng = np.random.default_rng(0)
    split_counts = [int(s) for s in args.splits.split(",")]
    rows_out, best, scores, plan, best_one_pass = [], {}, {}, {}, {}
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        weight_bytes = n * k * 2
        copies = max(1, min(args.repeats, -(-256 * 2**20 // weight_bytes)))  # >= 256 MB of weights: 5x the L2
        w_host = rng.integers(0x3C00, 0x3F00, (n, k)).astype(np.uint16)  # bf16 in [0.0078, 0.5)
        w_host[:, ::2] |= 0x8000  # half of them negative
        weights = [cuda.to_device(w_host) for _ in range(copies)]
        for m in (int(t) for t in args.tokens.split(",")):
            flops = 2.0 * m * n * k
            x_host = rng.standard_normal((m, k)).astype(np.float32)
            x = cuda.to_device(x_host)
            x_bits = to_bf16_rows(x)
            x_bits_host = x_bits.copy_to_host()
            out = cuda.device_array((m, n), np.float32)
            sample_rows = np.sort(rng.choice(m, size=min(m, 64), replace=False))
            sample_cols = np.sort(rng.choice(n, size=min(n, 256), replace=False))
            seconds = time_in_graph(lambda i: to_bf16_rows(x, x_bits), args.repeats)
            print(f"{name} {n}x{k} M={m}: to_bf16 {seconds * 1e6:.1f} us", flush=True)
            plan_tile = tile_for(m, n)
            plan[name, m] = (plan_tile, split_for(m, n, k, plan_tile))
            variants = [(tile, splits) for tile in tiles for splits in split_counts if splits <= -(-k // tile.block_k)]
            if plan[name, m] not in variants:
                variants.append(plan[name, m])
            for tile, splits in variants:
                out.copy_to_device(np.full((m, n), np.nan, np.float32))
                gemm_tc(x_bits, weights[0], out, tile=tile, splits=splits)
                ratio = check(out.copy_to_host()[sample_rows], x_bits_host, w_host, sample_rows, sample_cols)
                seconds = time_in_graph(lambda i: gemm_tc(x_bits, weights[i % copies], out, tile=tile, splits=splits),
                                        args.repeats)
                tflops = flops / seconds / 1e12
                label = "gemm_tc " + ",".join(str(v) for v in (tile.block_m, tile.block_n, tile.block_k, tile.warps_m,
                                                                 tile.warps_n, tile.stages))
                label += f" splits {splits}" if len(split_counts) > 1 or splits > 1 else ""
                rows_out.append((name, m, label, seconds * 1e6, tflops, ratio))
                scores.setdefault((tile, splits), []).append(tflops)
                if ratio <= 1 and tflops > best.get((name, m), (0, None))[0]:
                    best[name, m] = (tflops, (tile, splits))
                if ratio <= 1 and splits == 1 and seconds < best_one_pass.get((name, m), math.inf):
                    best_one_pass[name, m] = seconds
                if (tile, splits) == plan[name, m]:
                    plan[name, m] += (seconds,)
                print(f"  {label}: {seconds * 1e6:.1f} us, {tflops:.1f} TFLOP/s, "
                      f"{weight_bytes / seconds / 1e9:.0f} GB/s of weights, err/bound {ratio:.3f}"
                      f"{'' if ratio <= 1 else '  FAIL'}", flush=True)
            for tile in wgmma_tiles:
                out.copy_to_device(np.full((m, n), np.nan, np.float32))
                gemm_wgmma(x_bits, weights[0], out, tile=tile)
                ratio = check(out.copy_to_host()[sample_rows], x_bits_host, w_host, sample_rows, sample_cols)
                seconds = time_in_graph(lambda i: gemm_wgmma(x_bits, weights[i % copies], out, tile=tile),
                                        args.repeats)
                label = f"gemm_wgmma {tile.block_n}x{tile.consumers}x{tile.stages}"
                rows_out.append((name, m, label, seconds * 1e6, flops / seconds / 1e12, ratio))
                print(f"  {label}: {seconds * 1e6:.1f} us, {flops / seconds / 1e12:.1f} TFLOP/s, "
                      f"{weight_bytes / seconds / 1e9:.0f} GB/s of weights, err/bound {ratio:.3f}"
                      f"{'' if ratio <= 1 else '  FAIL'}", flush=True)
            if not args.no_fp32:
                seconds = time_in_graph(lambda i: gemm_blocked(x, weights[i % copies], out), args.repeats)
                rows_out.append((name, m, "gemm_blocked (fp32)", seconds * 1e6, flops / seconds / 1e12, float("nan")))
                print(f"  gemm_blocked (fp32): {seconds * 1e6:.1f} us, {flops / seconds / 1e12:.1f} TFLOP/s",
                      flush=True)
            if torch_cuda:
                tw = torch.from_numpy(w_host.view(np.int16)).cuda().view(torch.bfloat16)
                tx = torch.from_numpy(x_bits_host.view(np.int16)).cuda().view(torch.bfloat16)
                for _ in range(3):
                    tx @ tw.T
                torch.cuda.synchronize()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.repeats):
                    tx @ tw.T
                stop.record()
                torch.cuda.synchronize()
                seconds = start.elapsed_time(stop) / 1e3 / args.repeats
                rows_out.append((name, m, "torch bf16 (cuBLAS, eager)", seconds * 1e6, flops / seconds / 1e12,
                                 float("nan")))
                print(f"  torch bf16: {seconds * 1e6:.1f} us, {flops / seconds / 1e12:.1f} TFLOP/s, "
                      f"{weight_bytes / seconds / 1e9:.0f} GB/s of weights", flush=True)
    print("\nshape M kernel us TFLOP/s err/bound")
    for r in rows_out:
        print(f"{r[0]} {r[1]} {r[2]} {r[3]:.1f} {r[4]:.1f} {r[5]:.3f}")
    print()
    for (name, m), (tflops, (tile, splits)) in best.items():
        n, k = SHAPES[name]
        best_us = 2.0 * m * n * k / tflops / 1e6
        plan_tile, plan_splits, plan_seconds = plan[name, m]
        print(f"best {name} M={m}: {tflops:.1f} TFLOP/s ({best_us:.1f} us) with {tile} splits {splits}; the plan's "
              f"{plan_tile} splits {plan_splits}: {plan_seconds * 1e6:.1f} us ({best_us / plan_seconds / 1e6:.0%} of "
              f"the best's speed)" + (f"; the best one-pass (splits 1): {best_one_pass[name, m] * 1e6:.1f} us"
                                       if (name, m) in best_one_pass and splits > 1 else ""))
    scores = {key: s for key, s in scores.items() if len(s) == max(len(v) for v in scores.values())}  # every case
    means = {key: math.exp(np.mean(np.log(s))) for key, s in scores.items() if s}
    if means:
        top = max(means, key=means.get)
        print(f"best geometric mean over all cases: {means[top]:.1f} TFLOP/s with {top[0]} splits {top[1]}")
    failed = [r for r in rows_out if not r[5] <= 1 and not math.isnan(r[5])]
    print("correctness: " + ("PASS (every variant within its bound)" if not failed else f"FAIL ({len(failed)} cases)"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
