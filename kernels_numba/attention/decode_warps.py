"""Paged decode attention with warps that never wait for each other: the GPU's decode kernel for large batches
(`paged_attention_decode_warps`) and, split over key partitions, for small ones (`paged_attention_flash_decode_warps`).

    out[t, h] = sum_j exp(s_j - M) V[j] / sum_j exp(s_j - M),  s_j = scale * q[t, h] . K[j],  j = 0..query_pos[t]

The same contract and pool layout as every paged launcher (paged_kv); the same work split as decode_gqa (one
block per (query, KV head), serving the group's query heads from one read of each K/V row), but decode_gqa's block
goes through each 16-key chunk together, four block-wide barriers per chunk, and unpacks every bf16 into a float32
shared tile. Here each warp runs its own online softmax over its own keys, and only warp barriers (syncwarp) stand
in its way:

- Keys are cut into chunks of CHUNK_KEYS = 32, one per lane. Warp w of the block's WARPS takes chunks w, w + WARPS,
  w + 2 WARPS, ... Every warp runs the same number of rounds, cdiv(chunks, WARPS): a chunk past the context is all
  masked (its loads read the last key again). That keeps every warp_barrier count uniform across the block, which
  the simulator needs (common.warp_barrier).
- Who owns what in a round. Loads and PV: lane = (key set, word); a pool row of the KV head is `row_words` words
  (4 bf16 in a uint64 each, or one float32), LANES_PER_KEY = min(32, row_words) lanes share a row, so the warp
  covers KEY_SETS = 32 // LANES_PER_KEY rows at once (2 for Llama's 16-word bf16 rows) and key set s owns keys
  s, s + KEY_SETS, ... of the chunk. Each lane loads its words of its keys' K and V rows (coalesced: consecutive
  lanes, consecutive words of a row) into registers. Scores: lane j owns key j.
- A round, in a warp:
  1. the K words (in registers) go into the warp's own shared K tile as loaded (bf16 stays packed: no unpack, no
     float32 tile); warp barrier; the next round's K loads are issued (they land during 2-4);
  2. lane j unpacks K row j once and scores key j for every head of the group (q pre-scaled in shared memory,
     read as broadcasts; row stride row_words + 1 keeps the 32 lanes' rows in distinct banks); masked keys -inf;
     warp barrier;
  3. every lane reads the 32 scores of each head (broadcasts), takes the chunk max, raises the running max m and
     turns its own key's scores into weights exp(s - m); warp barrier;
  4. PV: each lane rescales its acc and l by exp(m_old - m_new), then adds weight x V for its words (its own
     registers: V never goes through shared memory) over its key set's keys; then the next round's V loads.
  A warp with no key yet (all its chunks so far masked) has m = -inf: exponents are taken against 0 instead, so
  its weights and rescale are 0, not exp(-inf + inf) = NaN.
- After the loop every (warp, key set) writes its state (m per head, l and acc per dim) to shared memory, one
  block barrier, and a thread per (head, dim) merges them:
      out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p,   M = max_p m_p  (finite: warp 0 holds key 0).

flash_decode_warps: at batch 1 a block per (query, KV head) is 8 blocks on a 132-SM GPU, so the keys are cut into
FLASH_PARTITION_KEYS partitions too, a block each (grid (T, n_kv_heads, partitions)). Each block runs the loop above
over its partition's keys only; where the context is one partition, its block writes out as above, else its merged
(m, l, acc) goes to global memory and the last block of the (query, KV head) to finish merges the partitions
(partitions.py).

Costs per 32-key chunk and lane (bf16 pool, head_dim 64, group 4): 16 + 16 global uint64 loads, 16 shared uint64
stores, 3 warp barriers (decode_gqa: 4 block barriers per 16 keys); shared reads: the K row (16 words), q (64
float4 broadcasts), scores and weights (48 float4 broadcasts); 512 FMAs. ptxas (sm_90, compiled without a GPU):
128 registers, no spills, 30.9 KB of shared memory a block of 4 warps (decode_gqa: 68 registers, 10 KB).
"""
import functools
import math

import numpy as np

from ..common import (SIMULATOR, SHARED_ALIGN, STATIC_SHARED_LIMIT, cuda, jit, cdiv, device_empty, device_zeros,
                      launch_stream, warp_barrier)
from .decode_gqa import _BF16_WORDS, _load_rows, _unpack_bf16, _unpack_element
from .paged_kv import _ix, _check_pool, _check_queries, _output
from .partitions import last_to_arrive, merged_output

# Warps per block. Each keeps up to 16 + 16 uint64 loads a lane in flight (bf16, head_dim 64); 4 warps: 128 threads,
# as decode_gqa (8 would need 61 KB of shared memory at group 4); 4 warps run about twice decode_gqa's speed from
# batch 64, and 2 warps fall behind 4 at batch 64 (scripts/time_decode_warps.py; measured: docs/bench-h200.md).
# The simulator: 2 warps (64 Python threads a block), so a 65-key context already runs its warps over uneven rounds.
WARPS = 2 if SIMULATOR else 4
# The runner's switch from decode_gqa to this kernel: from 512 (query, KV head) pairs, a decode batch of 64 on
# Llama-3.2-1B, the smallest batch timed (above); decode_gqa keeps batches 8-63 (its 64-key chunks while the grid is
# small) until a sweep there says otherwise.
DECODE_WARPS_MIN_BLOCKS = 512
LANES = 32           # threads per warp (cuda.warpsize, in the simulator too)
CHUNK_KEYS = LANES   # one key per lane when scoring
# flash_decode_warps' key partitions: a block of WARPS warps per (query, KV head, FLASH_PARTITION_KEYS keys), each
# warp FLASH_PARTITION_KEYS / (32 WARPS) rounds of 32-key chunks. 128 keys (one round of 4 warps) beat 256 and 512
# from 128 to 1,024 keys at batch 1 and 4; 256 wins at 4,096 (scripts/time_flash_decode.py; measured:
# docs/bench-h200.md). The simulator: 64 keys, one round of its 2 warps, so its tests' contexts of up to 130 keys
# cross 3 partitions.
FLASH_PARTITION_KEYS = 64 if SIMULATOR else 128
# A register cap per thread (0: the compiler's choice; sm_90, bf16 pool, head_dim 64, group 4: 128 registers, 4
# blocks of 4 warps per SM; a cap of 96 spills ~300 bytes). scripts/time_decode_warps.py --max-registers tries some.
MAX_REGISTERS = 0
# A bf16 pool's elements per load: 4 (uint64 words: a 64-dim row of one KV head is 16 words, two rows per warp
# load instruction, 256 contiguous bytes); halved until it divides head_dim.
BF16_PER_LOAD = 4


def kv_per_load(pool_dtype, head_dim: int) -> int:
    """Pool elements per K/V load: 1 from a float32 pool; BF16_PER_LOAD from a bf16 one, halved until it divides
    head_dim."""
    per_load = BF16_PER_LOAD if np.dtype(pool_dtype) == np.uint16 else 1
    while head_dim % per_load:
        per_load //= 2
    return per_load


@functools.cache
def paged_attention_decode_warps_kernel(head_dim: int, block_size: int, group: int, warps: int,
                                        pool_dtype=np.float32, per_load: int = 1, max_registers: int = 0,
                                        partition_keys: int = 0):
    """The kernel for one shape (compile-time constants size the shared arrays and unroll the loops): a block of
    `warps` warps per (query, KV head), the pools as rows of words of per_load elements (_load_rows);
    max_registers > 0 caps its registers per thread (GPU only). partition_keys > 0 makes it flash_decode_warps'
    kernel: block z takes keys [z * partition_keys, (z + 1) * partition_keys) of its query's context, and where the
    context has more than one partition, writes its state for the last block to merge (partitions.py); otherwise
    the state_* and `arrivals` arguments are unused."""
    bf16 = np.dtype(pool_dtype) == np.uint16
    assert per_load == 1 or bf16, "float32 pools load one element at a time"
    assert head_dim % per_load == 0, (head_dim, per_load)
    load_type = _BF16_WORDS[per_load] if bf16 else np.float32
    unpack = _unpack_bf16 if per_load > 1 else _unpack_element
    row_words = head_dim // per_load                  # words of one KV head's K (or V) row
    lanes_per_key = min(LANES, row_words)
    key_sets = LANES // lanes_per_key                 # keys a warp loads at once
    active_lanes = key_sets * lanes_per_key           # the rest only score (row_words not dividing 32)
    keys_per_set = cdiv(CHUNK_KEYS, key_sets)
    ragged_sets = CHUNK_KEYS % key_sets != 0          # then a key set's last key may lie past the chunk
    words_per_lane = cdiv(row_words, LANES)           # > 1 for rows of more than 32 words
    ragged_words = row_words % LANES != 0 and words_per_lane > 1
    dims_per_lane = words_per_lane * per_load
    partials = warps * key_sets                       # (warp, key set) states merged at the end
    tile_stride = row_words + 1                       # lane j reads row j: rows start in different banks
    threads = warps * LANES
    partitioned = partition_keys > 0
    assert partition_keys % CHUNK_KEYS == 0, (partition_keys, CHUNK_KEYS)
    shared_bytes = (4 * group * head_dim + np.dtype(load_type).itemsize * warps * CHUNK_KEYS * tile_stride
                    + 4 * 2 * warps * CHUNK_KEYS * group + 4 * (warps + partials) * group
                    + 4 * partials * group * head_dim)
    assert shared_bytes <= STATIC_SHARED_LIMIT, (
        f"decode_warps: {shared_bytes} B of shared memory for head_dim {head_dim}, group {group}, {warps} warps "
        f"(limit {STATIC_SHARED_LIMIT}): use fewer warps")

    @jit(device=True)
    def load_words(rows, block_tables, b, column, chunk_start, last, lane, loaded):
        """This lane's words of its key set's rows of the chunk, into registers: load (i, u) is key
        s + i * key_sets of the chunk (clamped to the last key of the context), word w + u * LANES of its row."""
        if lane < active_lanes:
            key_set = lane // lanes_per_key
            word = lane % lanes_per_key
            for i in range(keys_per_set):
                key = min(_ix(chunk_start) + _ix(key_set) + _ix(i * key_sets), _ix(last))
                row = _ix(block_tables[b, key // _ix(block_size)]) * _ix(block_size) + key % _ix(block_size)
                for u in range(words_per_lane):
                    if not ragged_words or word + u * LANES < row_words:
                        loaded[i, u] = rows[row, _ix(column) + _ix(word) + _ix(u * LANES)]

    @jit(**({"max_registers": max_registers} if max_registers else {}))
    def kernel(q, k_rows, v_rows, block_tables, query_seq, query_pos, scale, out, state_max, state_sum, state_acc,
               arrivals):
        t = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp = tid // LANES
        lane = tid % LANES
        key_set = lane // lanes_per_key
        word = lane % lanes_per_key
        first_head = kv_head * group
        column = kv_head * row_words  # this KV head's first word of a pool row
        b = query_seq[t]
        context_len = query_pos[t] + 1  # causal: keys 0..position
        keys_begin = 0
        keys_end = context_len
        if partitioned:
            keys_begin = cuda.blockIdx.z * partition_keys
            if keys_begin >= context_len:
                return  # the grid covers the longest context the block tables address; this one is shorter
            keys_end = min(context_len, keys_begin + partition_keys)
        last = keys_end - 1
        # one shared array per line: the simulator aliases two declared on the same line
        q_scaled = cuda.shared.array((group, head_dim), np.float32, alignment=SHARED_ALIGN)
        k_tile = cuda.shared.array((warps, CHUNK_KEYS, tile_stride), load_type)
        scores = cuda.shared.array((warps, CHUNK_KEYS, group), np.float32, alignment=SHARED_ALIGN)
        weights = cuda.shared.array((warps, CHUNK_KEYS, group), np.float32, alignment=SHARED_ALIGN)
        part_max = cuda.shared.array((warps, group), np.float32)
        part_sum = cuda.shared.array((partials, group), np.float32)
        part_acc = cuda.shared.array((partials, group, head_dim), np.float32)
        merging = cuda.shared.array(1, np.int32)  # partitioned: whether this block merges the partitions
        k_loaded = cuda.local.array((keys_per_set, words_per_lane), load_type)
        v_loaded = cuda.local.array((keys_per_set, words_per_lane), load_type)
        running_max = cuda.local.array(group, np.float32)  # m per head: the same in every lane of the warp
        running_sum = cuda.local.array(group, np.float32)  # l per head over this lane's key set
        acc = cuda.local.array((group, dims_per_lane), np.float32)
        dot = cuda.local.array(group, np.float32)
        chunk_max = cuda.local.array(group, np.float32)
        rescale = cuda.local.array(group, np.float32)
        for e in range(tid, group * head_dim, threads):
            q_scaled[e // head_dim, e % head_dim] = q[t, first_head + e // head_dim, e % head_dim] * scale
        for g in range(group):
            running_max[g] = np.float32(-math.inf)
            running_sum[g] = np.float32(0.0)
            for d in range(dims_per_lane):
                acc[g, d] = np.float32(0.0)
        chunks = (keys_end - keys_begin + CHUNK_KEYS - 1) // CHUNK_KEYS
        rounds = (chunks + warps - 1) // warps  # the same in every warp of the block
        load_words(k_rows, block_tables, b, column, keys_begin + warp * CHUNK_KEYS, last, lane, k_loaded)
        load_words(v_rows, block_tables, b, column, keys_begin + warp * CHUNK_KEYS, last, lane, v_loaded)
        cuda.syncthreads()  # q_scaled

        for r in range(rounds):
            chunk_start = keys_begin + (warp + r * warps) * CHUNK_KEYS
            # 1. this chunk's K words into the warp's tile, as loaded; then the next round's K loads
            if lane < active_lanes:
                for i in range(keys_per_set):
                    j = key_set + i * key_sets
                    if not ragged_sets or j < CHUNK_KEYS:
                        for u in range(words_per_lane):
                            if not ragged_words or word + u * LANES < row_words:
                                k_tile[warp, _ix(j), _ix(word) + _ix(u * LANES)] = k_loaded[i, u]
            warp_barrier()
            if r + 1 < rounds:
                load_words(k_rows, block_tables, b, column, chunk_start + warps * CHUNK_KEYS, last, lane, k_loaded)
            # 2. lane j scores key j for every head of the group, from one unpack of its K row
            for g in range(group):
                dot[g] = np.float32(0.0)
            for w in range(row_words):
                k_word = k_tile[warp, lane, _ix(w)]
                for part in range(per_load):
                    k_value = unpack(k_word, part)
                    for g in range(group):
                        dot[g] += q_scaled[g, _ix(w) * _ix(per_load) + _ix(part)] * k_value
            masked = chunk_start + lane >= keys_end
            for g in range(group):
                scores[warp, lane, g] = np.float32(-math.inf) if masked else dot[g]
            warp_barrier()
            # 3. the chunk's max per head raises the running max; this lane's key's weights
            for g in range(group):
                chunk_max[g] = scores[warp, 0, g]
            for j0 in range(0, CHUNK_KEYS, 4):  # (unrolled by 4: one float4 read per key where group is 4)
                for j in range(j0, j0 + 4):
                    for g in range(group):
                        chunk_max[g] = max(chunk_max[g], scores[warp, _ix(j), g])
            for g in range(group):
                new_max = max(running_max[g], chunk_max[g])
                base = new_max if new_max != -math.inf else np.float32(0.0)  # no key yet: every weight is 0
                rescale[g] = np.float32(math.exp(running_max[g] - base))     # 0 for the warp's first keys
                running_max[g] = new_max
                weights[warp, lane, g] = np.float32(0.0) if masked else np.float32(math.exp(dot[g] - base))
            warp_barrier()
            # 4. acc += weights @ V over the lane's key set, from the V words in its registers; then the next V
            for g in range(group):
                running_sum[g] *= rescale[g]
                for d in range(dims_per_lane):
                    acc[g, d] *= rescale[g]
            if lane < active_lanes:
                for i in range(keys_per_set):
                    j = key_set + i * key_sets
                    if not ragged_sets or j < CHUNK_KEYS:
                        for g in range(group):
                            running_sum[g] += weights[warp, _ix(j), g]
                        for u in range(words_per_lane):
                            if not ragged_words or word + u * LANES < row_words:
                                for part in range(per_load):
                                    v_value = unpack(v_loaded[i, u], part)
                                    for g in range(group):
                                        acc[g, u * per_load + part] += weights[warp, _ix(j), g] * v_value
            if r + 1 < rounds:
                load_words(v_rows, block_tables, b, column, chunk_start + warps * CHUNK_KEYS, last, lane, v_loaded)

        # Each (warp, key set)'s state into shared memory, then a thread per (head, dim) merges them all: into out,
        # or, where the context has more partitions than this one, into this partition's state (partitions.py).
        partial = warp * key_sets + key_set
        if lane < active_lanes:
            for u in range(words_per_lane):
                if not ragged_words or word + u * LANES < row_words:
                    for part in range(per_load):
                        for g in range(group):
                            part_acc[partial, g, (word + u * LANES) * per_load + part] = acc[g, u * per_load + part]
            if word == 0:
                for g in range(group):
                    part_sum[partial, g] = running_sum[g]
        if lane == 0:
            for g in range(group):
                part_max[warp, g] = running_max[g]
        cuda.syncthreads()
        partitions = (context_len + partition_keys - 1) // partition_keys if partitioned else 1
        for item in range(tid, group * head_dim, threads):
            g = item // head_dim
            d = item % head_dim
            merged_max = part_max[0, g]
            for w in range(1, warps):
                merged_max = max(merged_max, part_max[w, g])
            numerator = np.float32(0.0)
            denominator = np.float32(0.0)
            for w in range(warps):
                warp_weight = np.float32(math.exp(part_max[w, g] - merged_max))  # 0 for a warp without keys
                for s in range(key_sets):
                    numerator += warp_weight * part_acc[w * key_sets + s, g, d]
                    denominator += warp_weight * part_sum[w * key_sets + s, g]
            if partitions == 1:
                out[t, first_head + g, d] = numerator / denominator
            else:
                state_acc[t, first_head + g, cuda.blockIdx.z, d] = numerator
                if d == 0:
                    state_max[t, first_head + g, cuda.blockIdx.z] = merged_max
                    state_sum[t, first_head + g, cuda.blockIdx.z] = denominator
        if partitions > 1 and last_to_arrive(arrivals, t, kv_head, partitions, merging):
            for item in range(tid, group * head_dim, threads):
                h = first_head + item // head_dim
                out[t, h, item % head_dim] = merged_output(state_max, state_sum, state_acc, t, h, item % head_dim,
                                                           partitions)

    return kernel


def paged_attention_decode_warps(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """Same contract as paged_attention_decode_gqa: a block of WARPS warps per (query, KV head) serving all its
    query heads, each warp an online softmax over its own 32-key chunks, merged at the end."""
    return _launch(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out, partition_keys=0)


def paged_attention_flash_decode_warps(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out=None):
    """Same contract as paged_attention_decode_warps, split over key partitions of FLASH_PARTITION_KEYS (flash-
    decoding): grid (T, n_kv_heads, partitions of the longest context the block tables address), blocks past their
    query's context leave at once; a context of one partition is finished by its block alone, longer ones merged
    by the last of their blocks, in the same launch (partitions.py). The decode kernel for small GPU batches, whose
    T x n_kv_heads blocks alone would leave most of the GPU idle."""
    return _launch(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out,
                   partition_keys=FLASH_PARTITION_KEYS)


def _launch(q, k_pool, v_pool, block_tables, query_seq, query_pos, scale, out, partition_keys: int):
    """Both launchers: grid (T, n_kv_heads), or with partition_keys (T, n_kv_heads, partitions), the partitions'
    states and counters beside it (the counters zeroed once: device_zeros)."""
    num_queries, n_heads, _ = q.shape
    _check_pool(q, k_pool, v_pool, block_tables)
    _check_queries(num_queries, query_seq, query_pos)
    out = _output(q, out)
    if num_queries == 0:
        return out
    _, block_size, n_kv_heads, head_dim = k_pool.shape
    if partition_keys:
        partitions = cdiv(block_tables.shape[1] * block_size, partition_keys)  # static per CUDA graph
        grid = (num_queries, n_kv_heads, partitions)
        state_max = device_empty((num_queries, n_heads, partitions), np.float32)
        state_sum = device_empty((num_queries, n_heads, partitions), np.float32)
        state_acc = device_empty((num_queries, n_heads, partitions, head_dim), np.float32)
        arrivals = device_zeros((num_queries, n_kv_heads), np.int32)  # blocks done per (query, KV head)
    else:  # unused: any arrays of the right ranks and types
        grid = (num_queries, n_kv_heads)
        state_max = state_sum = out
        state_acc = out.reshape((num_queries, n_heads, 1, head_dim))
        arrivals = block_tables
    per_load = kv_per_load(k_pool.dtype, head_dim)
    kernel = paged_attention_decode_warps_kernel(head_dim, block_size, n_heads // n_kv_heads, WARPS,
                                                 k_pool.dtype.type, per_load, MAX_REGISTERS, partition_keys)
    kernel[grid, WARPS * LANES, launch_stream()](
        q, *_load_rows(k_pool, v_pool, per_load), block_tables, query_seq, query_pos, np.float32(scale), out,
        state_max, state_sum, state_acc, arrivals)
    return out
