"""Decode attention variants on the H200: split_keys (with and without key partitions), decode_gqa (key
chunk x threads per block) and flash_decode_warps (partition keys), KV GB/s.

    python scripts/sweep_decode_attention.py [--cases 1x512,64x512,256x1024] [--max-context 4112]
Each case is BATCHxCONTEXT on Llama-3.2-1B's attention shape (32 query heads, 8 KV heads, head_dim 64,
blocks of 16, shuffled block tables, -1 padded to --max-context keys as a decode graph's are: split_keys' and
flash_decode_warps' partitions cover that width; default: the case's context); time per launch by CUDA events
around `repeats` launches captured in one CUDA graph (as a decode step runs them: eager launches from Python
cost more than a small batch's attention), each on another copy of the KV pools when one pool would fit in the
50 MB L2; and the KV bytes each kernel must read at least once (batch x context x K and V rows of 8 x 64
float32) per second. Before timing, each variant runs twice on the same buffers, out poisoned before each run,
and its output is compared with the first variant's.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16


def replayed(launch, out) -> np.ndarray:
    """out after launch(0) ran again on the buffers it recorded (a BufferArena, as a decode graph replays it),
    out poisoned before each run: a kernel that leaves an output unwritten, or a counter it does not reset
    (flash_decode_warps), shows as NaN or as a diff."""
    from kernels_numba.common import BufferArena, launching_into
    arena = BufferArena()
    with launching_into(0, arena):
        for run in range(2):
            out.copy_to_device(np.full(out.shape, np.nan, np.float32))
            if run:
                arena.rewind()
            launch(0)
    return out.copy_to_host()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="1x512,64x512,256x1024")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--max-context", type=int, default=0, help="block table width in keys (0: the context)")
    args = parser.parse_args()
    from numba import cuda
    import lessons.split_keys as sk
    import kernels_numba.attention.decode_gqa as gqa
    import kernels_numba.attention.decode_warps as warps
    from sweep_gemv import time_in_graph  # scripts/ is on the path when a script runs
    rng = np.random.default_rng(0)
    default_partition_below = sk.SPLIT_PARTITION_BELOW_BLOCKS  # before a variant overrides it
    for case in args.cases.split(","):
        batch, context = (int(v) for v in case.split("x"))
        blocks_per_seq = -(-context // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq
        pool_shape = (num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_DIM)
        kv_bytes = batch * context * 2 * N_KV_HEADS * HEAD_DIM * 4
        copies = max(1, min(args.repeats, -(-256 * 2**20 // kv_bytes)))  # >= 256 MB of KV: 5x the L2
        k_host = rng.standard_normal(pool_shape, np.float32)
        v_host = rng.standard_normal(pool_shape, np.float32)
        pools = [(cuda.to_device(k_host), cuda.to_device(v_host)) for _ in range(copies)]
        table_width = max(blocks_per_seq, -(-args.max_context // BLOCK_SIZE))
        tables = np.full((batch, table_width), -1, np.int32)
        tables[:, :blocks_per_seq] = rng.permutation(num_blocks).astype(np.int32).reshape(batch, blocks_per_seq)
        tables = cuda.to_device(tables)
        q = cuda.to_device(rng.standard_normal((batch, N_HEADS, HEAD_DIM), np.float32))
        seqs = cuda.to_device(np.arange(batch, dtype=np.int32))
        positions = cuda.to_device(np.full(batch, context - 1, np.int32))
        out = cuda.device_array((batch, N_HEADS, HEAD_DIM), np.float32)
        reference = None
        variants = [("split_keys", None, None), ("split_keys", None, "no partitions")] + [
            ("decode_gqa", chunk, threads) for chunk, threads in ((16, 128), (32, 128), (64, 128), (32, 256), (64, 256))
        ] + [("flash_decode_warps", partition, None) for partition in (128, 256, 512)]
        for name, chunk, option in variants:
            if name == "split_keys":
                sk.SPLIT_PARTITION_BELOW_BLOCKS = 0 if option else default_partition_below
                launch = lambda i: sk.paged_attention_split_keys(q, *pools[i % copies], tables, seqs, positions, 0.125,
                                                                 out)
            elif name == "decode_gqa":
                gqa.GQA_DECODE_KEY_CHUNK = gqa.GQA_DECODE_KEY_CHUNK_FEW_BLOCKS = chunk
                gqa.GQA_DECODE_THREADS = option
                launch = lambda i: gqa.paged_attention_decode_gqa(q, *pools[i % copies], tables, seqs, positions, 0.125,
                                                                 out)
            else:
                warps.FLASH_PARTITION_KEYS = chunk
                launch = lambda i: warps.paged_attention_flash_decode_warps(q, *pools[i % copies], tables, seqs,
                                                                            positions, 0.125, out)
            result = replayed(launch, out)
            seconds = time_in_graph(launch, args.repeats)
            reference = result if reference is None else reference
            err = float(np.abs(result - reference).max())  # the first variant is the reference; NaN: unwritten
            if name == "split_keys":
                label = f"{name}, {option or 'partitions below ' + str(default_partition_below) + ' blocks'}"
            elif name == "decode_gqa":
                label = f"{name} chunk {chunk:2d} threads {option}"
            else:
                label = f"{name} partition {chunk:3d}"
            print(f"batch {batch:3d} context {context:5d}  {label:<48} {seconds * 1e6:9.1f} us "
                  f"{kv_bytes / seconds / 1e9:7.1f} GB/s  (max diff vs split_keys {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
