"""Time prefill attention on the GPU: paged_attention_prefill_tc (tensor cores) against paged_attention_prefill_gqa
(CUDA cores, the runner's prefill kernel), one prompt of T tokens at Llama-3.2-1B's shape (32 heads over 8 KV heads,
head_dim 64, blocks of 16), launches captured in a CUDA graph (sweep_gemv.time_in_graph).

    python scripts/time_prefill_attention.py [--tokens 1024,4096] [--repeats 10] [--kv-dtype bfloat16] [--ablate]
                                             [--max-registers 128] [--tc-variants 8x64,8x32]
                                             [--wgmma-variants 2x64,2x128] [--torch]
--kv-dtype: the pool's dtype (float32, or bfloat16: the same random K/V rounded to bf16 bits by kv_dtype's encoder,
as the fast precision's default pool holds them; prefill_tc then copies its key tiles by cp.async).
Runs prefill_gqa, "prefill_tc original" (prefill_tc.ORIGINAL_OPTIONS: every refinement off) and "prefill_tc"
(TC_OPTIONS, what the runner launches); with --ablate "prefill_tc without X" for each refinement X of TcOptions
(all others on: what X alone is worth); with --max-registers "prefill_tc max_registers=N" (TC_OPTIONS capped at N
registers a thread: two 8-warp blocks an SM fit at 128); then each WARPSxKEYS of --tc-variants (warps per block x
keys per shared K/V tile) with TC_OPTIONS; on a Hopper GPU with a bf16 pool, each WARPGROUPSxKEYS of
--wgmma-variants (prefill_wgmma: warpgroups per block x keys per tile [x stages]; 2x64 is prefill_tc's default
block and tile, whose bits it should give: the script says whether each does); with --torch the peer, torch's
scaled_dot_product_attention (bf16, causal, GQA) on the same K/V, timed by CUDA events over --repeats calls. TFLOP/s counts the causal half: 2 T^2 head_dim n_heads FLOPs (Q K^T
and P V). Then max |difference| of the new prefill_tc against the original and against prefill_gqa (float32 math
on the pool's values): ~1e-2 expected for both (the tensor-core kernels round q and P to bf16; the new one rounds
q * scale * log2(e), the original q * scale).
"""
import argparse
import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 64, 16


def kernels(spec: str, ablate: bool, max_registers: str, seq, pos, wgmma_spec: str = ""):
    """(name, launcher, tiles): prefill_gqa, prefill_tc's original and current options, then --tc-variants."""
    from kernels_numba.attention import (build_prefill_gqa_tiles, build_prefill_tc_tiles, paged_attention_prefill_gqa,
                                         paged_attention_prefill_tc)
    from kernels_numba.attention.prefill_tc import TC_OPTIONS
    from lessons.prefill_tc_original import ORIGINAL_OPTIONS
    group = N_HEADS // N_KV_HEADS
    yield "prefill_gqa", paged_attention_prefill_gqa, build_prefill_gqa_tiles(seq, pos, HEAD_DIM, group)
    tc_tiles = build_prefill_tc_tiles(seq, pos, group)
    yield ("prefill_tc original", functools.partial(paged_attention_prefill_tc, options=ORIGINAL_OPTIONS), tc_tiles)
    yield "prefill_tc", paged_attention_prefill_tc, tc_tiles
    for field in dataclasses.fields(TC_OPTIONS) if ablate else ():  # each refinement's worth: the kernel without it
        if getattr(TC_OPTIONS, field.name):
            without = dataclasses.replace(TC_OPTIONS, **{field.name: False})
            yield (f"prefill_tc without {field.name}", functools.partial(paged_attention_prefill_tc, options=without),
                   tc_tiles)
    for registers in (int(r) for r in filter(None, max_registers.split(","))):
        yield (f"prefill_tc max_registers={registers}",
               functools.partial(paged_attention_prefill_tc,
                                 options=dataclasses.replace(TC_OPTIONS, max_registers=registers)), tc_tiles)
    for item in filter(None, spec.split(",")):
        warps, keys = (int(v) for v in item.split("x"))
        yield (f"prefill_tc {warps}x{keys}",
               functools.partial(paged_attention_prefill_tc, warps=warps, keys_per_tile=keys),
               build_prefill_tc_tiles(seq, pos, group, warps))
    from kernels_numba.attention.prefill_wgmma import build_prefill_wgmma_tiles, paged_attention_prefill_wgmma
    for item in filter(None, wgmma_spec.split(",")):
        warpgroups, keys, stages = (int(v) for v in (item.split("x") + ["0"])[:3])
        yield (f"prefill_wgmma {item}",
               functools.partial(paged_attention_prefill_wgmma, warpgroups=warpgroups, keys_per_tile=keys,
                                 stages=stages or None),
               build_prefill_wgmma_tiles(seq, pos, group, warpgroups))


def time_torch(tokens: int, k_pool, v_pool, tables, q, repeats: int) -> tuple[float, np.ndarray]:
    """torch's scaled_dot_product_attention on the same K/V (in position order, through the block table), q and K/V
    as bf16: (seconds a call, its output)."""
    import torch
    from kernels_numba.kv_dtype import kv_decode_ref
    order = tables.copy_to_host()[0]
    k, v = (torch.tensor(kv_decode_ref(pool.copy_to_host())[order].reshape(-1, N_KV_HEADS, HEAD_DIM)[:tokens],
                         device="cuda") for pool in (k_pool, v_pool))
    query = torch.tensor(q.copy_to_host(), device="cuda")
    args = [t.to(torch.bfloat16).transpose(0, 1).unsqueeze(0) for t in (query, k, v)]

    def call():
        return torch.nn.functional.scaled_dot_product_attention(*args, is_causal=True, scale=0.125, enable_gqa=True)
    out = call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / repeats, out[0].transpose(0, 1).float().cpu().numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--kv-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--ablate", action="store_true", help="also prefill_tc without each TcOptions refinement")
    parser.add_argument("--max-registers", default="", help="also prefill_tc with each register cap, e.g. 128")
    parser.add_argument("--tc-variants", default="", help="prefill_tc WARPSxKEYS,... (default: its defaults only)")
    parser.add_argument("--wgmma-variants", default="2x64,2x128",
                        help="prefill_wgmma WARPGROUPSxKEYS[xSTAGES],... (Hopper and a bf16 pool only)")
    parser.add_argument("--torch", action="store_true", help="also torch's scaled_dot_product_attention (the peer)")
    args = parser.parse_args()
    from kernels_numba.wgmma import wgmma_available
    wgmma_spec = args.wgmma_variants if wgmma_available() and args.kv_dtype == "bfloat16" else ""
    from kernels_numba.common import cuda
    from kernels_numba.kv_dtype import kv_encode_ref, kv_storage_dtype
    from sweep_gemv import time_in_graph
    pool_dtype = kv_storage_dtype(args.kv_dtype)
    rng = np.random.default_rng(0)
    print(f"KV pool {args.kv_dtype}", flush=True)
    for tokens in (int(t) for t in args.tokens.split(",")):
        blocks = -(-tokens // BLOCK)
        pool_shape = (blocks, BLOCK, N_KV_HEADS, HEAD_DIM)
        k_pool = cuda.to_device(kv_encode_ref(rng.standard_normal(pool_shape, np.float32), pool_dtype))
        v_pool = cuda.to_device(kv_encode_ref(rng.standard_normal(pool_shape, np.float32), pool_dtype))
        tables = cuda.to_device(rng.permutation(blocks).astype(np.int32).reshape(1, blocks))
        q = cuda.to_device(rng.standard_normal((tokens, N_HEADS, HEAD_DIM), np.float32))
        seq = cuda.to_device(np.zeros(tokens, np.int32))
        pos = cuda.to_device(np.arange(tokens, dtype=np.int32))
        outs = {}
        flops = 2.0 * tokens * tokens * HEAD_DIM * N_HEADS
        for name, launcher, tiles in kernels(args.tc_variants, args.ablate, args.max_registers, seq, pos, wgmma_spec):
            out = cuda.to_device(np.full((tokens, N_HEADS, HEAD_DIM), np.nan, np.float32))
            launch = lambda i: launcher(q, k_pool, v_pool, tables, seq, pos, 0.125, out=out, tiles=tiles)
            launch(0)
            outs[name] = out.copy_to_host()
            seconds = time_in_graph(launch, args.repeats)
            print(f"T={tokens} {name}: {seconds * 1e3:.3f} ms, {flops / seconds / 1e12:.1f} TFLOP/s, "
                  f"unwritten {int(np.isnan(outs[name]).sum())}", flush=True)
        if args.torch:
            seconds, outs["torch sdpa"] = time_torch(tokens, k_pool, v_pool, tables, q, args.repeats)
            print(f"T={tokens} torch sdpa: {seconds * 1e3:.3f} ms, {flops / seconds / 1e12:.1f} TFLOP/s", flush=True)
        for other in ("prefill_tc original", "prefill_gqa", "torch sdpa"):
            if other in outs:
                diff = float(np.abs(outs["prefill_tc"] - outs[other]).max())
                print(f"T={tokens} max |prefill_tc - {other}| = {diff:.3e}", flush=True)
        for name in (n for n in outs if n.startswith("prefill_wgmma")):
            differ = int((outs[name].view(np.uint32) != outs["prefill_tc"].view(np.uint32)).sum())
            print(f"T={tokens} {name}: {differ} of {outs[name].size} outputs differ from prefill_tc's bits", flush=True)


if __name__ == "__main__":
    main()
