"""Flash-decoding's merge: a query's keys cut into partitions, a block each, and the partitions' softmax states
merged in the same launch by whichever of the blocks finishes last.

    partition p's state, per query head: m_p = max_j s_j,  l_p = sum_j exp(s_j - m_p),  acc_p = sum_j exp(s_j - m_p) V_j
    out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p,   M = max_p m_p     (a running merge, p in order)

Each block writes its state (part_max and part_sum [T, n_heads, P], part_acc [T, n_heads, P, head_dim]), then checks
in (`last_to_arrive`): every thread fences its writes, thread 0 counts the block on its (query, KV head)'s counter
with an atomic add, and the block that brings the count to the number of partitions with keys merges them all
(`merged_output`), in partition order, so the result is the same whichever block is last; it also sets the counter
back to 0 for the next launch (a CUDA graph replays it; the launcher zeroes it once, with device_zeros).
"""
import math

import numpy as np

from ..common import cuda, device_function_with_cuda, jit


@device_function_with_cuda
def last_to_arrive(arrivals, t, kv_head, partitions, merging):
    """Check this block in on (t, kv_head)'s counter; True in every thread of the last of `partitions` blocks to
    arrive (which then resets the counter). `merging`: a 1-element int32 shared array. Call from every thread."""
    cuda.threadfence()  # each thread publishes its state GPU-wide before thread 0 counts the block
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        merging[0] = cuda.atomic.add(arrivals, (t, kv_head), 1) == partitions - 1
        cuda.threadfence()  # the other blocks' states, published before they checked in, are seen
    cuda.syncthreads()
    last = merging[0] != 0
    if last and cuda.threadIdx.x == 0:
        arrivals[t, kv_head] = 0  # every partition has arrived: ready for the next launch
    return last


@jit(device=True)
def merged_output(part_max, part_sum, part_acc, t, h, d, partitions):
    """out[t, h, d] from the states of partitions 0 .. partitions - 1 (each with keys: every m_p is finite)."""
    merged_max = np.float32(-math.inf)
    acc = np.float32(0.0)
    sums = np.float32(0.0)
    for p in range(partitions):
        m = part_max[t, h, p]
        new_max = max(merged_max, m)
        old_weight = np.float32(math.exp(merged_max - new_max))  # 0 for partition 0
        weight = np.float32(math.exp(m - new_max))
        sums = sums * old_weight + part_sum[t, h, p] * weight
        acc = acc * old_weight + part_acc[t, h, p, d] * weight
        merged_max = new_max
    return acc / sums
