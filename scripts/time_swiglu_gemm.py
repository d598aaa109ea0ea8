"""Time the fast plan's gate|up + SwiGLU gate both ways on the GPU (Llama-3.2-1B shape: hidden 2048, intermediate
8192): fused, one gemm_tc launch with SwiGLUEpilogue(bf16=True) writing bf16 [T, I]; unfused, gemm_tc writing float32
gate|up [T, 2 I] then activation.silu_mul_gate_up(bf16=True). Both take float32 x as the plan does (gemm_tc's
to_bf16_rows first, the same in both) at the plan's tile (tile_for(T, 2 I)), outputs allocated once.

    python scripts/time_swiglu_gemm.py [--tokens 1024,4096] [--repeats 20] [--hidden 2048] [--intermediate 8192]

Per size: ms per call from CUDA events, launched eagerly back to back and captured in one CUDA graph
(sweep_gemv.time_in_graph: no host launch overhead), the unfused / fused ratio, and whether the two outputs are
the same bits (they should be: the same float32 gate and up through the same gate arithmetic).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--eager-only", action="store_true", help="no CUDA graph (e.g. a smoke run in the simulator)")
    args = parser.parse_args()
    from kernels_numba.activation import silu_mul_gate_up
    from kernels_numba.common import cuda
    from kernels_numba.epilogues import SwiGLUEpilogue
    from kernels_numba.gemm_tc import gemm_tc, gemm_tc_fused, tile_for
    from sweep_gemv import time_in_graph, time_launches
    rng = np.random.default_rng(0)
    hidden, inter = args.hidden, args.intermediate
    w_gu = cuda.to_device(rng.integers(0x3C00, 0x3D00, (2 * inter, hidden)).astype(np.uint16))  # bf16 in [1, 2)
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = cuda.to_device(rng.standard_normal((tokens, hidden), np.float32) * np.float32(0.05))
        tile = tile_for(tokens, 2 * inter)
        gate_up = cuda.device_array((tokens, 2 * inter), np.float32)
        gated_fused = cuda.device_array((tokens, inter), np.uint16)
        gated_pair = cuda.device_array((tokens, inter), np.uint16)

        def fused():
            gemm_tc_fused(x, w_gu, SwiGLUEpilogue(bf16=True), out=gated_fused, tile=tile)

        def unfused():
            silu_mul_gate_up(gemm_tc(x, w_gu, out=gate_up, tile=tile), out=gated_pair, bf16=True)

        fused()
        unfused()
        cuda.synchronize()
        same = np.array_equal(gated_fused.copy_to_host(), gated_pair.copy_to_host())
        eager = {name: time_launches(fn, args.repeats) * 1e3
                 for name, fn in (("fused", fused), ("unfused", unfused))}
        graph = {} if args.eager_only else {name: time_in_graph(lambda i, fn=fn: fn(), args.repeats) * 1e3
                                            for name, fn in (("fused", fused), ("unfused", unfused))}
        tile_name = "x".join(str(v) for v in (tile.block_m, tile.block_n, tile.block_k, tile.warps_m, tile.warps_n,
                                               tile.stages))
        for mode, times in (("eager", eager), ("graph", graph)) if graph else (("eager", eager),):
            print(f"T={tokens} I={inter} H={hidden} tile {tile_name} {mode}: fused {times['fused']:.3f} ms, "
                  f"unfused {times['unfused']:.3f} ms, unfused / fused {times['unfused'] / times['fused']:.3f}",
                  flush=True)
        print(f"T={tokens} fused == unfused bit for bit: {same}", flush=True)


if __name__ == "__main__":
    main()
