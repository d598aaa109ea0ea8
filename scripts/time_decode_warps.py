"""decode_gqa vs decode_warps on a bf16 KV pool, on a GPU: decode attention at the large batches of the
256-request workload.

    python scripts/time_decode_warps.py [--cases 64x1024,256x512,256x1024] [--repeats 20] [--warps 4]
                                        [--max-registers 0] [--no-timing]
    NUMBA_ENABLE_CUDASIM=1 python scripts/time_decode_warps.py --no-timing --cases 2x70   # the check, in the simulator

Each case is BATCHxCONTEXT on Llama-3.2-1B's attention shape (32 query heads, 8 KV heads, head_dim 64, blocks of
16, shuffled block tables), every query at the end of its context, K/V random normal rounded to bf16.

Correctness first, on each case: both launchers on the same inputs (out poisoned with NaN before each), their max
|diff|, and decode_warps' max |diff| against paged_attention_ref (numpy, float64, on the same rounded K/V). Both
kernels compute float32 math on the same values and differ only in summation order: PASS needs both <= 1e-5.

Then, unless --no-timing: time per launch by CUDA events around `repeats` launches captured in one CUDA graph
(sweep_gemv.time_in_graph, as time_kv_dtype_decode.py and sweep_decode_attention.py time them), each on another copy
of the pools while one pool would fit in the 50 MB L2; GB/s = the KV bytes a kernel must read (batch x context x K
and V rows of 8 x 64 bf16) per second. decode_gqa as the runner launches it; decode_warps with each --warps (warps
per block) and --max-registers (0: the compiler's choice) given, comma-separated.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16
TOLERANCE = 1e-5


def decode_case(rng, batch: int, context: int, table_keys: int = 0):
    """One BATCHxCONTEXT decode case on Llama-3.2-1B's attention shape, on the host: (q, k_pool, v_pool,
    block_tables, query_seq, query_pos); K/V random normal rounded to bf16, the sequences' blocks shuffled, every
    query at the end of its context. A table_keys wider than the context pads the tables to that many keys with a
    spare block, as a CUDA graph's tables are padded to the model's length."""
    from kernels_numba.kv_dtype import kv_encode_ref
    used = -(-context // BLOCK_SIZE)
    table_blocks = max(used, -(-table_keys // BLOCK_SIZE))
    num_blocks = batch * used + (table_blocks > used)
    pool_shape = (num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_DIM)
    k_pool = kv_encode_ref(rng.standard_normal(pool_shape, np.float32), np.uint16)
    v_pool = kv_encode_ref(rng.standard_normal(pool_shape, np.float32), np.uint16)
    tables = np.full((batch, table_blocks), num_blocks - 1, np.int32)
    tables[:, :used] = rng.permutation(batch * used).astype(np.int32).reshape(batch, used)
    q = rng.standard_normal((batch, N_HEADS, HEAD_DIM), np.float32)
    return (q, k_pool, v_pool, tables, np.arange(batch, dtype=np.int32), np.full(batch, context - 1, np.int32))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="64x1024,256x512,256x1024")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warps", default="4", help="decode_warps' WARPS values to time (comma-separated)")
    parser.add_argument("--max-registers", default="0", help="decode_warps' MAX_REGISTERS values to time (0: none)")
    parser.add_argument("--no-timing", action="store_true", help="the correctness part only (runs in the simulator)")
    args = parser.parse_args()
    from numba import cuda
    import kernels_numba.attention.decode_warps as decode_warps_module
    from kernels_numba.attention import paged_attention_decode_gqa, paged_attention_decode_warps, paged_attention_ref
    variants = [(w, r) for w in _ints(args.warps) for r in _ints(args.max_registers)]
    default_warps, default_registers = decode_warps_module.WARPS, decode_warps_module.MAX_REGISTERS
    rng = np.random.default_rng(0)
    scale = np.float32(HEAD_DIM ** -0.5)
    diffs, speedups = [0.0], []
    for case in args.cases.split(","):
        batch, context = (int(v) for v in case.split("x"))
        q_host, k_host, v_host, tables_host, seqs_host, positions_host = decode_case(rng, batch, context)
        tables, q = cuda.to_device(tables_host), cuda.to_device(q_host)
        seqs, positions = cuda.to_device(seqs_host), cuda.to_device(positions_host)
        out = cuda.device_array((batch, N_HEADS, HEAD_DIM), np.float32)
        k_pool, v_pool = cuda.to_device(k_host), cuda.to_device(v_host)

        def run(launcher):
            out.copy_to_device(np.full(out.shape, np.nan, np.float32))
            launcher(q, k_pool, v_pool, tables, seqs, positions, scale, out)
            return out.copy_to_host()

        want = paged_attention_ref(q_host, k_host, v_host, tables_host, seqs_host, positions_host, scale)
        gqa = run(paged_attention_decode_gqa)
        diffs_gqa, diffs_ref = [], []
        for warps, registers in variants:
            decode_warps_module.WARPS, decode_warps_module.MAX_REGISTERS = warps, registers
            got = run(paged_attention_decode_warps)
            diffs_gqa.append(np.abs(got - gqa).max())  # NaN where an output was left unwritten (np.max keeps it)
            diffs_ref.append(np.abs(got - want).max())
        diff_gqa, diff_ref = float(np.max(diffs_gqa)), float(np.max(diffs_ref))
        diffs += [diff_gqa, diff_ref]
        line = (f"batch {batch:3d} x {context:5d}  max |diff| decode_warps vs decode_gqa {diff_gqa:.1e}, "
                f"vs reference {diff_ref:.1e}")
        if args.no_timing:
            print(line, flush=True)
            continue
        from sweep_gemv import time_in_graph  # scripts/ is on the path when a script runs
        kv_bytes = batch * context * N_KV_HEADS * HEAD_DIM * 2 * 2  # K and V rows read, bf16
        copies = max(1, min(args.repeats, -(-256 * 2**20 // (k_host.nbytes + v_host.nbytes))))  # >= 256 MB: 5x L2
        pools = [(cuda.to_device(k_host), cuda.to_device(v_host)) for _ in range(copies)]

        def timed(launcher, pools):
            return time_in_graph(lambda i: launcher(q, *pools[i % copies], tables, seqs, positions, scale, out),
                                 args.repeats)

        t_gqa = timed(paged_attention_decode_gqa, pools)
        cells = [f"decode_gqa {t_gqa * 1e6:7.1f} us {kv_bytes / t_gqa / 1e9:5.0f} GB/s"]
        best = t_gqa
        for warps, registers in variants:
            decode_warps_module.WARPS, decode_warps_module.MAX_REGISTERS = warps, registers
            t = timed(paged_attention_decode_warps, pools)
            best = min(best, t)
            label = f"warps x{warps}" + (f" regs {registers}" if registers else "")
            cells.append(f"{label} {t * 1e6:7.1f} us {kv_bytes / t / 1e9:5.0f} GB/s ({t_gqa / t:4.2f}x)")
        del pools
        speedups.append(t_gqa / best)
        print(line + "\n    " + " | ".join(cells), flush=True)
    decode_warps_module.WARPS, decode_warps_module.MAX_REGISTERS = default_warps, default_registers
    worst = float(np.max(diffs))
    passed = worst <= TOLERANCE  # False for NaN
    timing = f"; best decode_warps speedup per case {', '.join(f'{s:.2f}x' for s in speedups)}" if speedups else ""
    print(f"{'PASS' if passed else 'FAIL'}: decode_warps = decode_gqa = the reference within {TOLERANCE:.0e} "
          f"(worst {worst:.1e}){timing}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
