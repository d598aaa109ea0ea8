"""Attention: causal grouped-query attention with an online softmax over the paged KV pool, one file per kernel.

    out[t, h] = sum_{j<=p} softmax_j(scale * q[t, h] . K[j, g]) V[j, g]     p = the query's position,
                                                                           g = h // (n_heads // n_kv_heads)

Which step runs which (the choice: tinyvllm/runner/kernel_plan.py, `KernelPlan.attention`):

| step                                  | GPU                                             | simulator  |
|---------------------------------------|-------------------------------------------------|------------|
| decode, < DECODE_GQA_MIN_BLOCKS pairs | decode_warps.paged_attention_flash_decode_warps | per_query  |
| decode, from DECODE_GQA_MIN_BLOCKS    | decode_gqa.paged_attention_decode_gqa           | per_query  |
| decode, from DECODE_WARPS_MIN_BLOCKS  | decode_warps.paged_attention_decode_warps       | per_query  |
| with prefill chunks, fp32 precision   | prefill_gqa.paged_attention_prefill_gqa         | per_query  |
| with prefill chunks, fast precision   | prefill_tc.paged_attention_prefill_tc           | prefill_tc |
| the same on Hopper, bf16 pool         | prefill_wgmma.paged_attention_prefill_wgmma     | prefill_tc |

(pairs: the step's (query, KV head) pairs; on Llama-3.2-1B the two thresholds are decode batches 8 and 64.)

The files:
- paged_kv: the pool layout, write_kv_paged (every step's K/V write outside the fused kernels), the launchers'
  shared checks, and paged_attention_ref, the numpy twin of every launcher.
- per_query: a thread per (query, head), the readable kernel; the simulator's for every fp32 step.
- decode_gqa: a block per (query, KV head), each K/V chunk read once for the group's query heads.
- decode_warps: decode_gqa's blocks, each warp its own online softmax over its own 32-key chunks, merged once
  per block; flash_decode_warps adds a block per key partition.
- partitions: flash-decoding's merge of key partitions' softmax states, by the last of their blocks to finish.
- prefill: the query tiles every prefill kernel takes (build_prefill_tiles; prefill_tiles_host and
  max_prefill_tiles pad them to a fixed count for prefill CUDA graphs), and paged_attention_prefill, the readable
  tiled kernel whose contract prefill_gqa and prefill_tc keep (no step launches it).
- prefill_gqa: FlashAttention-2 on CUDA cores, a block per (query tile, KV head).
- prefill_tc: FlashAttention-2 on tensor cores (bf16 mma.sync), a block per (query tile, KV head).
- prefill_wgmma: prefill_tc's kernel with both products on Hopper's wgmma (warpgroup-wide, operands from shared
  memory; P from registers): the same tiles, arithmetic and bits.

Readable and superseded variants that no step runs live in lessons/ (lessons/README.md): the contiguous KV cache,
split-keys decode, prefill_tc's original options.

KV pool dtype (tinyvllm.runner.kv_pool.KVPool, --kv-cache-dtype): float32 (the reference) or bf16 bit patterns in
uint16 (half the bytes). Writers store kernels_numba.kv_dtype.kv_from_f32(x, pool) (rounded to nearest even for
bf16): write_kv_paged, rope.rope_qkv with the pools (prefill steps, and every step in the simulator) and the fused
GEMV's RopeKVEpilogue (GPU decode steps). Every launcher above reads either pool (kv_to_f32 on each element, float32
math after it; numba compiles one kernel per pool dtype); decode_gqa loads a bf16 pool
KV_BF16_PER_LOAD elements at a time (uint64 words by default) and unpack them into their float32 tiles; decode_warps
loads uint64 words too and keeps K packed in shared memory (each lane unpacks its own key's row); prefill_tc copies
a bf16 pool's rows into its bf16 tiles by 16-byte cp.async (the next key tile's while it computes on this one)
instead of rounding float32 ones.

Every paged launcher has the same contract: q [T, n_heads, head_dim], query t of sequence query_seq[t] (a row
of block_tables) at position query_pos[t] attends to that sequence's keys 0..query_pos[t] in the pools
(paged_kv's docstring has the layout). Each module's docstring says what its blocks and threads own. A kernel's
launch constants (GQA_DECODE_KEY_CHUNK, GQA_ROWS, TC_WARPS, ...) live in its own module and are read at launch:
override them there (kernels_numba.attention.decode_gqa.GQA_DECODE_KEY_CHUNK), not on this package.
"""
from .paged_kv import MAX_HEAD_DIM, write_kv_paged, write_kv_paged_ref, paged_attention_ref
from .per_query import attend_to_key, paged_attention_per_query, paged_attention_decode, paged_attention_decode_ref
from .decode_gqa import DECODE_GQA_MIN_BLOCKS, paged_attention_decode_gqa
from .decode_warps import DECODE_WARPS_MIN_BLOCKS, paged_attention_decode_warps, paged_attention_flash_decode_warps
from .prefill import (QTILE, PrefillTiles, build_prefill_tiles, max_prefill_tiles, paged_attention_prefill,
                      prefill_tiles_host)
from .prefill_gqa import (GQA_SHARED_BYTES, build_prefill_gqa_tiles, gqa_shape, paged_attention_prefill_gqa)
from .prefill_tc import build_prefill_tc_tiles, paged_attention_prefill_tc
from .prefill_wgmma import build_prefill_wgmma_tiles, paged_attention_prefill_wgmma
