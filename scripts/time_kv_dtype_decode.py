"""Decode attention on a float32 vs a bf16 KV pool on a GPU: what halving the bytes decode attention reads is worth.

    python scripts/time_kv_dtype_decode.py [--cases 8x1024,64x1024,256x1024] [--repeats 20]

Each case is BATCHxCONTEXT on Llama-3.2-1B's attention shape (32 query heads, 8 KV heads, head_dim 64, blocks of
16, shuffled block tables), through decode_gqa (the kernel whose loads KV_BF16_PER_LOAD sizes). Time per launch
by CUDA events around `repeats` launches captured in one CUDA graph (sweep_gemv.time_in_graph, as
sweep_decode_attention.py times them), each on another copy of the pools while one pool would fit in the 50 MB L2;
GB/s = the KV bytes the kernel must read (batch x context x K and V rows of 8 x 64 elements, 4 or 2 bytes each) per
second. The bf16 pool is timed with each
word size decode_gqa can load it in (KV_BF16_PER_LOAD: 1, 2 or 4 bf16 per load; the default marked *).

Correctness, before timing: the bf16 pool holds the float32 pool's values rounded (kv_encode_ref); the same kernel on
a float32 pool holding exactly those rounded values must give the same output (the kernels compute the float32
math on the decoded values: "diff vs f32 on rounded" should be 0, or a few float32 ulps), and on the unrounded pool
it differs by the rounding's effect only ("diff vs f32": ~1e-3 here, random K/V of unit scale).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="8x1024,64x1024,256x1024")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--key-chunks", default="", help="also time the bf16 pool with decode_gqa's "
                        "GQA_DECODE_KEY_CHUNK set to each of these (comma-separated; default: only its own value)")
    parser.add_argument("--no-timing", action="store_true", help="the correctness part only (runs in the simulator)")
    args = parser.parse_args()
    from numba import cuda
    import kernels_numba.attention.decode_gqa as decode_gqa_module
    from kernels_numba.attention import paged_attention_decode_gqa
    default_per_load = decode_gqa_module.KV_BF16_PER_LOAD
    from kernels_numba.kv_dtype import kv_decode_ref, kv_encode_ref
    rng = np.random.default_rng(0)
    scale = HEAD_DIM ** -0.5
    rows = []
    for case in args.cases.split(","):
        batch, context = (int(v) for v in case.split("x"))
        blocks_per_seq = -(-context // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq
        pool_shape = (num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_DIM)
        k_f32 = rng.standard_normal(pool_shape, np.float32)
        v_f32 = rng.standard_normal(pool_shape, np.float32)
        k_bf16, v_bf16 = kv_encode_ref(k_f32, np.uint16), kv_encode_ref(v_f32, np.uint16)
        tables = cuda.to_device(rng.permutation(num_blocks).astype(np.int32).reshape(batch, blocks_per_seq))
        q = cuda.to_device(rng.standard_normal((batch, N_HEADS, HEAD_DIM), np.float32))
        seqs = cuda.to_device(np.arange(batch, dtype=np.int32))
        positions = cuda.to_device(np.full(batch, context - 1, np.int32))
        out = cuda.device_array((batch, N_HEADS, HEAD_DIM), np.float32)
        launcher, name = paged_attention_decode_gqa, "decode_gqa"

        def run(k_pool, v_pool):
            out.copy_to_device(np.full(out.shape, np.nan, np.float32))
            launcher(q, k_pool, v_pool, tables, seqs, positions, scale, out)
            return out.copy_to_host()

        f32 = run(cuda.to_device(k_f32), cuda.to_device(v_f32))
        f32_rounded = run(cuda.to_device(kv_decode_ref(k_bf16)), cuda.to_device(kv_decode_ref(v_bf16)))
        diff_rounded = 0.0
        for per_load in (1, 2, 4):
            decode_gqa_module.KV_BF16_PER_LOAD = per_load
            bf16 = run(cuda.to_device(k_bf16), cuda.to_device(v_bf16))
            assert np.isfinite(bf16).all() and np.isfinite(f32).all(), "an output left unwritten (NaN)"
            diff_rounded = max(diff_rounded, float(np.abs(bf16 - f32_rounded).max()))
        decode_gqa_module.KV_BF16_PER_LOAD = default_per_load
        diff = float(np.abs(bf16 - f32).max())
        if args.no_timing:
            print(f"batch {batch:3d} context {context:5d} {name:<12}  diff vs f32 on rounded {diff_rounded:.1e}, "
                  f"vs f32 {diff:.1e}", flush=True)
            rows.append((diff_rounded, 1.0))
            continue
        from sweep_gemv import time_in_graph  # scripts/ is on the path when a script runs
        timings = {}
        for label, per_load, (k_host, v_host) in (("float32", 1, (k_f32, v_f32)), ("bf16 x1", 1, (k_bf16, v_bf16)),
                                                   ("bf16 x2", 2, (k_bf16, v_bf16)), ("bf16 x4", 4, (k_bf16, v_bf16))):
            decode_gqa_module.KV_BF16_PER_LOAD = per_load
            kv_bytes = k_host.nbytes + v_host.nbytes
            copies = max(1, min(args.repeats, -(-256 * 2**20 // kv_bytes)))  # >= 256 MB of KV: 5x the L2
            pools = [(cuda.to_device(k_host), cuda.to_device(v_host)) for _ in range(copies)]
            seconds = time_in_graph(
                lambda i: launcher(q, *pools[i % copies], tables, seqs, positions, scale, out), args.repeats)
            timings[label] = (seconds, kv_bytes)
            del pools
        default_chunk = decode_gqa_module.GQA_DECODE_KEY_CHUNK
        for chunk in [int(c) for c in args.key_chunks.split(",") if c]:
            for per_load in (2, 4):
                decode_gqa_module.GQA_DECODE_KEY_CHUNK, decode_gqa_module.KV_BF16_PER_LOAD = chunk, per_load
                got = run(cuda.to_device(k_bf16), cuda.to_device(v_bf16))
                diff_rounded = max(diff_rounded, float(np.abs(got - f32_rounded).max()))
                kv_bytes = k_bf16.nbytes + v_bf16.nbytes
                copies = max(1, min(args.repeats, -(-256 * 2**20 // kv_bytes)))
                pools = [(cuda.to_device(k_bf16), cuda.to_device(v_bf16)) for _ in range(copies)]
                seconds = time_in_graph(
                    lambda i: launcher(q, *pools[i % copies], tables, seqs, positions, scale, out), args.repeats)
                timings[f"bf16 x{per_load} chunk {chunk}"] = (seconds, kv_bytes)
                del pools
        decode_gqa_module.GQA_DECODE_KEY_CHUNK = default_chunk
        decode_gqa_module.KV_BF16_PER_LOAD = default_per_load
        t32 = timings["float32"][0]
        cells = [f"{label}{'*' if label == f'bf16 x{default_per_load}' else ''} {t * 1e6:7.1f} us {b / t / 1e9:6.0f} GB/s"
                 for label, (t, b) in timings.items()]
        t16 = timings[f"bf16 x{default_per_load}"][0]
        print(f"batch {batch:3d} x {context:5d} {name:<12} " + " | ".join(cells) + f" | speedup {t32 / t16:4.2f}x"
              f" | diff vs f32 on rounded {diff_rounded:.1e}, vs f32 {diff:.1e}", flush=True)
        rows.append((diff_rounded, t32 / t16))
    worst = max(d for d, _ in rows)
    print(f"{'PASS' if worst <= 1e-5 else 'FAIL'}: bf16 pool = float32 math on the rounded K/V (worst diff {worst:.1e}); "
          f"speedups {', '.join(f'{s:.2f}x' for _, s in rows)}")
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
