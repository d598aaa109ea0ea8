"""flash_decode_warps per partition size on a bf16 KV pool, on a GPU, beside decode_gqa (a block per (query, KV
head), its keys not split): decode attention at the small batches of batch-1 generation.

    python scripts/time_flash_decode.py [--cases 1x128,1x384,1x1024,1x4096,4x512] [--table-keys 4352]
                                        [--partition-keys 128,256,512] [--repeats 50] [--no-timing]
    NUMBA_ENABLE_CUDASIM=1 python scripts/time_flash_decode.py --no-timing --cases 2x70 --table-keys 160 \\
        --partition-keys 64                                                  # the check, in the simulator
Each case is BATCHxCONTEXT on Llama-3.2-1B's attention shape (32 query heads, 8 KV heads, head_dim 64, blocks of
16, shuffled blocks), every query at the end of its context, K/V random normal rounded to bf16; the block tables
are --table-keys wide, as a CUDA graph's are padded to the model's length (the grid has a block per partition of
that width; those past a context leave at once).

Correctness first: each variant's max |diff| against paged_attention_ref (numpy, float64, on the same rounded
K/V), out poisoned with NaN before each; PASS needs <= 1e-5 (float32 math on the same values, another summation
order). Then, unless --no-timing, time per launch by CUDA events around `repeats` launches captured in one CUDA
graph (sweep_gemv.time_in_graph), on copies of the pools past the 50 MB L2; flash_decode_warps once per
--partition-keys (its FLASH_PARTITION_KEYS).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_decode_warps import BLOCK_SIZE, HEAD_DIM, N_HEADS, N_KV_HEADS, TOLERANCE, decode_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="1x128,1x384,1x1024,1x4096,4x512")
    parser.add_argument("--table-keys", type=int, default=4352)
    parser.add_argument("--partition-keys", default="128,256,512")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-timing", action="store_true", help="the correctness part only (runs in the simulator)")
    args = parser.parse_args()
    from kernels_numba.common import cuda
    import kernels_numba.attention.decode_warps as decode_warps_module
    from kernels_numba.attention import paged_attention_decode_gqa, paged_attention_ref
    from kernels_numba.attention.decode_warps import paged_attention_flash_decode_warps
    partition_keys = [int(v) for v in args.partition_keys.split(",")]
    default_keys = decode_warps_module.FLASH_PARTITION_KEYS
    rng = np.random.default_rng(0)
    scale = np.float32(HEAD_DIM ** -0.5)
    worst = 0.0
    for case in args.cases.split(","):
        batch, context = (int(v) for v in case.split("x"))
        q_host, k_host, v_host, tables_host, seqs_host, positions_host = decode_case(rng, batch, context,
                                                                                    args.table_keys)
        tables, q = cuda.to_device(tables_host), cuda.to_device(q_host)
        seqs, positions = cuda.to_device(seqs_host), cuda.to_device(positions_host)
        out = cuda.device_array((batch, N_HEADS, HEAD_DIM), np.float32)
        want = paged_attention_ref(q_host, k_host, v_host, tables_host, seqs_host, positions_host, scale)
        variants = [("decode_gqa", paged_attention_decode_gqa, None)] + [
            (f"flash_decode_warps {keys}", paged_attention_flash_decode_warps, keys) for keys in partition_keys]
        kv_bytes = batch * context * N_KV_HEADS * HEAD_DIM * 2 * 2  # K and V rows read, bf16
        copies = max(1, min(args.repeats, -(-256 * 2**20 // (k_host.nbytes + v_host.nbytes))))
        pools = [(cuda.to_device(k_host), cuda.to_device(v_host)) for _ in range(copies)]
        cells = []
        for name, launcher, keys in variants:
            if keys is not None:
                decode_warps_module.FLASH_PARTITION_KEYS = keys
            out.copy_to_device(np.full(out.shape, np.nan, np.float32))
            launcher(q, *pools[0], tables, seqs, positions, scale, out)
            diff = float(np.abs(out.copy_to_host() - want).max())  # NaN where an output was left unwritten
            worst = max(worst, diff) if diff == diff else float("nan")
            cell = f"{name}: |diff| {diff:.1e}"
            if not args.no_timing:
                from sweep_gemv import time_in_graph
                seconds = time_in_graph(lambda i: launcher(q, *pools[i % copies], tables, seqs, positions, scale, out),
                                        args.repeats)
                cell += f", {seconds * 1e6:6.1f} us ({kv_bytes / seconds / 1e9:5.0f} GB/s)"
            cells.append(cell)
        decode_warps_module.FLASH_PARTITION_KEYS = default_keys
        print(f"batch {batch} x {context} keys (tables {tables_host.shape[1] * BLOCK_SIZE} keys)\n    " + "\n    ".join(cells),
              flush=True)
    passed = worst <= TOLERANCE
    print(f"{'PASS' if passed else 'FAIL'}: every variant = the reference within {TOLERANCE:.0e} (worst {worst:.1e})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
