"""Time the fast path's MLP pieces alone at T tokens (Llama-3.2-1B shape): host wall time of each launch with a
synchronize after it (what profile_prefill.py's stages see), median of 5.

    python scripts/time_mlp_fast.py [--tokens 128,4096]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def timed(fn, repeats=5):
    from kernels_numba.common import cuda
    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="128,4096")
    args = parser.parse_args()
    from kernels_numba.activation import residual_add, silu_mul, silu_mul_bf16, silu_mul_gate_up
    from kernels_numba.common import cuda
    from kernels_numba.gemm_tc import gemm_tc, tile_for, to_bf16_rows
    rng = np.random.default_rng(0)
    hidden, inter = 2048, 8192
    w_gu = cuda.to_device(rng.integers(0x3c00, 0x3d00, (2 * inter, hidden)).astype(np.uint16))
    w_d = cuda.to_device(rng.integers(0x3c00, 0x3d00, (hidden, inter)).astype(np.uint16))
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = cuda.to_device(rng.standard_normal((tokens, hidden), np.float32))
        gu = gemm_tc(x, w_gu, tile=tile_for(tokens, 2 * inter))
        h = silu_mul_bf16(gu[:, :inter], gu[:, inter:])
        rows = {
            "alloc f32 [T, 2I]": lambda: cuda.device_array((tokens, 2 * inter), np.float32),
            "to_bf16_rows x": lambda: to_bf16_rows(x),
            "gemm_tc gate|up (f32 x)": lambda: gemm_tc(x, w_gu, tile=tile_for(tokens, 2 * inter)),
            "gemm_tc gate|up (out given)": lambda: gemm_tc(x, w_gu, out=gu, tile=tile_for(tokens, 2 * inter)),
            "silu_mul_bf16 (slices)": lambda: silu_mul_bf16(gu[:, :inter], gu[:, inter:]),
            "silu_mul_gate_up bf16 (in place)": lambda: silu_mul_gate_up(gu, bf16=True),
            "gemm_tc down (bf16 h)": lambda: gemm_tc(h, w_d, tile=tile_for(tokens, hidden)),
        }
        gate_c, up_c = gu[:, :inter].copy_to_host(), gu[:, inter:].copy_to_host()
        d_gate, d_up = cuda.to_device(np.ascontiguousarray(gate_c)), cuda.to_device(np.ascontiguousarray(up_c))
        rows["silu_mul_bf16 (contiguous)"] = lambda: silu_mul_bf16(d_gate, d_up)
        rows["silu_mul f32 (contiguous)"] = lambda: silu_mul(d_gate, d_up)
        rows["residual_add f32 (contiguous)"] = lambda: residual_add(d_gate, d_up)
        for name, fn in rows.items():
            print(f"T={tokens} {name:<30} {timed(fn):8.3f} ms", flush=True)
        from sweep_gemv import time_in_graph
        for name in ("silu_mul_bf16 (slices)", "silu_mul_gate_up bf16 (in place)", "silu_mul_bf16 (contiguous)", "residual_add f32 (contiguous)"):
            fn = rows[name]
            print(f"T={tokens} {name:<30} {time_in_graph(lambda i: fn(), 5) * 1e3:8.3f} ms GPU (graph)", flush=True)


if __name__ == "__main__":
    main()
