"""Attention: causal grouped-query attention with an online softmax, one file per variant.

    out[t, h] = sum_{j<=p} softmax_j(scale * q[t, h] . K[j, g]) V[j, g]     p = the query's position,
                                                                           g = h // (n_heads // n_kv_heads)

Which step runs which (tinyvllm/runner/model_runner.py, `ModelRunner._attention_for`; the fast precision: kernel_plan.py):

| file          | launcher                                   | runs                                                |
|---------------|--------------------------------------------|-----------------------------------------------------|
| contiguous    | attention, write_kv                        | nowhere: the readable version over a contiguous cache |
| paged_kv      | write_kv_paged, paged_attention_ref        | the pool layout and the numpy twin of every paged launcher |
| per_query     | paged_attention_per_query (+ _decode)      | every step in the simulator (a thread per query, head) |
| split_keys    | paged_attention_split_keys                 | nowhere now (flash_decode replaced it); sweeps      |
| decode_gqa    | paged_attention_decode_gqa                 | GPU decode steps from DECODE_GQA_MIN_BLOCKS (query, KV head) pairs to decode_warps' |
| decode_gqa    | paged_attention_flash_decode               | GPU decode steps below that (batch 1 to 7 on Llama-3.2-1B) |
| decode_warps  | paged_attention_decode_warps               | GPU decode steps from DECODE_WARPS_MIN_BLOCKS (query, KV head) pairs (batch 64 on Llama-3.2-1B): each warp its own online softmax over 32-key chunks |
| prefill       | paged_attention_prefill, build_prefill_tiles | nowhere: the readable tiled prefill; its query tiles serve prefill_gqa |
|               | prefill_tiles_host, max_prefill_tiles      | the tiles padded to a fixed count with empty ones (prefill CUDA graphs) |
| prefill_gqa   | paged_attention_prefill_gqa                | GPU steps with prefill chunks (FlashAttention-2 on CUDA cores) |
| prefill_tc    | paged_attention_prefill_tc                 | steps with prefill chunks in the fast precision (tinyvllm/runner/kernel_plan.py), simulator too: FlashAttention-2 on tensor cores (bf16 mma) |

KV pool dtype (tinyvllm.runner.kv_pool.KVPool, --kv-cache-dtype): float32 (the reference) or bf16 bit patterns in uint16
(half the bytes). Writers store kernels_numba.kv_dtype.kv_from_f32(x, pool) (rounded to nearest even for bf16):
write_kv_paged, rope.rope_qkv with the pools (prefill steps, and every step in the simulator) and the fused GEMV's
RopeKVEpilogue (GPU decode steps). Every paged launcher above reads either pool (kv_to_f32 on each element, float32
math after it; numba compiles one kernel per pool dtype); decode_gqa and flash_decode load a bf16 pool
KV_BF16_PER_LOAD elements at a time (uint64 words by default) and unpack them into their float32 tiles;
decode_warps loads uint64 words too and keeps K packed in shared memory (each lane unpacks its own key's row); prefill_tc
copies a bf16 pool's rows into its bf16 tiles by 16-byte cp.async (the next key tile's while it computes on
this one) instead of rounding float32 ones. The contiguous cache stays float32.

Every paged launcher has the same contract: q [T, n_heads, head_dim], query t of sequence query_seq[t] (a row
of block_tables) at position query_pos[t] attends to that sequence's keys 0..query_pos[t] in the pools
(paged_kv's docstring has the layout). Each module's docstring says what its blocks and threads own. A variant's
launch constants (SPLIT_THREADS, GQA_DECODE_KEY_CHUNK, GQA_ROWS, ...) live in its own module and are read at
launch: override them there (kernels_numba.attention.split_keys.SPLIT_THREADS), not on this package.
"""
from .contiguous import MAX_HEAD_DIM, attend_to_key, attention, attention_ref, write_kv, write_kv_ref
from .paged_kv import write_kv_paged, write_kv_paged_ref, paged_attention_ref
from .per_query import paged_attention_per_query, paged_attention_decode, paged_attention_decode_ref
from .split_keys import paged_attention_split_keys, split_partitions, combine_partitions_kernel
from .decode_gqa import DECODE_GQA_MIN_BLOCKS, paged_attention_decode_gqa, paged_attention_flash_decode
from .decode_warps import DECODE_WARPS_MIN_BLOCKS, paged_attention_decode_warps
from .prefill import (QTILE, PrefillTiles, build_prefill_tiles, max_prefill_tiles, paged_attention_prefill,
                      prefill_tiles_host)
from .prefill_gqa import (GQA_SHARED_BYTES, build_prefill_gqa_tiles, gqa_shape, paged_attention_prefill_gqa)
from .prefill_tc import build_prefill_tc_tiles, paged_attention_prefill_tc
