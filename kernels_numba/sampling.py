"""Choosing the next token of each row of logits on the GPU: greedy `argmax`, and `sample` (temperature,
top-k, top-p, seeded). Only the chosen ids ever cross to the host.

Greedy, matching torch.argmax:
    out[b] = min { i : logits[b, i] = max_j logits[b, j] }     (a NaN counts as the maximum: first NaN wins)
Launch layout: two kernels. `argmax_parts_kernel`, a block per (row, part of ARGMAX_THREADS x ARGMAX_PER_THREAD logits):
each thread loads its ARGMAX_PER_THREAD logits at once and keeps its best (value, index), a shared-memory tree
reduction (power-of-two block) merges the block's pairs into the part's; `argmax_merge_kernel`, a block per row,
merges the parts' pairs the same way. `beats` is a strict total order on (value, index) pairs, so any merge
order picks the same winner: the split changes the speed (a row spread over many SMs, every load of a thread in
flight together), never the answer.

Sampling, by the Gumbel-max trick (argmax of s_i + Gumbel noise is a draw from softmax(s) over `keep`):
    s = logits / T;   out = argmax_{i in keep} s_i + g_i,   g_i = -log(-log(u_i)),  u_i = U(hash(seed, step, i))
    keep = top-k(s) & top-p(softmax(s))
A row with T = 0 returns exactly argmax's answer; so does a row whose scaled max is not finite (NaN or
+inf logits, all -inf, or a T so small that logits / T overflows): sampling's limit as T -> 0.
Launch layout: one block per row, each thread owning a strided share of the row:
1. Row max: argmax's winner, by one block's scan and tree reduction. Greedy rows stop here. m = max / T (dividing by a positive
   number keeps the order, so this is the max of s).
2. top-k (only if 0 < k < V): the k-th largest s, by bisection on `order_key`, an order-preserving uint32
   of the float32 bit pattern: the largest key K with #{key(s_i) >= K} >= k, at most 32 rounds, each a
   block-wide count. Keep key(s_i) >= K (ties with the k-th value stay, as in HF's top-k).
3. top-p (only if top_p < 1): each top-k survivor gets an integer mass q_i = floor(2^32 exp(s_i - m)):
   integer block sums are exact in any order, so the kernel and its numpy twin agree bit for bit (and with
   V <= 2^17 every sum is below 2^49, exact in float64). The threshold is the largest T' with
   sum_{q_i >= T'} q_i >= top_p * sum_i q_i, bisected over [0, 2^32] (33 rounds); keep q_i >= T': the
   smallest set of most likely tokens holding top_p of the mass, ties at the threshold included.
4. Gumbel-max over the survivors, ties to the lowest index, the same tree reduction as step 1.
A bisection round costs one barrier: every thread writes its partial sums, then every thread adds up all
partials in the same order (so all reach the same decision); the partials are double-buffered, so one
round's writes never race the previous round's reads.

The noise is counter-based: u_i depends only on (seed, step, i), through `mix32` (lowbias32 by C. Wellons,
a bijective 32-bit integer hash) on uint64 values below 2^32, so no product overflows and the same pure
arithmetic runs in the kernel, in the simulator and in the numpy twin (on whole arrays there): the same
seed and step give the same token everywhere. The logs and exps run in float64 and are rounded to float32,
so the GPU's libdevice and the host's libm agree in all but astronomically rare cases.
"""
import functools
import math

import numpy as np

from .common import SIMULATOR, cuda, device_function_with_cuda, host_version, jit, launch_stream, device_empty

MAX_THREADS = 1024
NO_INDEX = np.int32(2**31 - 1)  # loses every tie, so a thread that saw no element never wins
# A simulated syncthreads waits for every thread of the block to be scheduled (~2.5 ms per thread per
# barrier), so the simulator gets tiny blocks: 4 threads still run the tree reduction, 15x faster than 32.
DEFAULT_THREADS = 4 if SIMULATOR else 256
# argmax's first kernel: a block of ARGMAX_THREADS per part of a row, each thread ARGMAX_PER_THREAD logits loaded
# together (one memory round trip), so a 128256-logit row is 63 blocks over as many SMs, not one block's long
# chain of dependent loads. The merge kernel's block covers a row's parts in one pass at that size.
ARGMAX_THREADS = 4 if SIMULATOR else 256
ARGMAX_PER_THREAD = 4 if SIMULATOR else 8
ARGMAX_MERGE_THREADS = 4 if SIMULATOR else 64


@jit(device=True)
def beats(value, index, best_value, best_index):
    """Does (value, index) win over (best_value, best_index)? NaN > everything; ties -> lower index."""
    if math.isnan(best_value):
        return math.isnan(value) and index < best_index
    if math.isnan(value):
        return True
    return value > best_value or (value == best_value and index < best_index)


@device_function_with_cuda
def _block_best(best_value, best_index, best_values, best_indices):
    """The block's best (value, index) of every thread's pair, by a shared-memory tree (power-of-two block);
    every thread gets it. The arrays are free again once every thread has returned (a barrier before reuse)."""
    tid = cuda.threadIdx.x
    best_values[tid] = best_value
    best_indices[tid] = best_index
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            other = tid + stride
            if beats(best_values[other], best_indices[other], best_values[tid], best_indices[tid]):
                best_values[tid] = best_values[other]
                best_indices[tid] = best_indices[other]
        cuda.syncthreads()
        stride //= 2
    return best_values[0], best_indices[0]


@functools.cache
def argmax_parts_kernel(per_thread: int):
    @jit
    def kernel(logits, part_values, part_indices):
        """Block (row, part): the best pair of logits[row, part * per_thread * blockDim : ...]."""
        row = cuda.blockIdx.x
        part = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        best_values = cuda.shared.array(MAX_THREADS, np.float32)
        best_indices = cuda.shared.array(MAX_THREADS, np.int32)
        vocab = logits.shape[1]
        first = part * per_thread * n_threads + tid
        values = cuda.local.array(per_thread, np.float32)
        for k in range(per_thread):  # every load first: one round trip to memory, not per_thread
            values[k] = logits[row, min(first + k * n_threads, vocab - 1)]
        best_value = np.float32(-math.inf)
        best_index = NO_INDEX
        for k in range(per_thread):
            col = first + k * n_threads
            if col < vocab and beats(values[k], col, best_value, best_index):
                best_value = values[k]
                best_index = col
        value, index = _block_best(best_value, best_index, best_values, best_indices)
        if tid == 0:
            part_values[row, part] = value
            part_indices[row, part] = index
    return kernel


@jit
def argmax_merge_kernel(part_values, part_indices, out):
    """Block per row: the best of the row's parts' pairs; its index is the row's argmax."""
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    best_values = cuda.shared.array(MAX_THREADS, np.float32)
    best_indices = cuda.shared.array(MAX_THREADS, np.int32)
    best_value = np.float32(-math.inf)
    best_index = NO_INDEX
    for part in range(tid, part_values.shape[1], cuda.blockDim.x):
        if beats(part_values[row, part], part_indices[row, part], best_value, best_index):
            best_value = part_values[row, part]
            best_index = part_indices[row, part]
    _, index = _block_best(best_value, best_index, best_values, best_indices)
    if tid == 0:
        out[row] = index


def argmax(logits, out=None, threads=None, per_thread=None):
    """logits float32 [B, V] -> int32 [B] (device arrays). `threads`: the parts kernel's block (a power of two),
    `per_thread` the logits each of its threads loads (a part is threads * per_thread logits)."""
    n_rows, vocab = logits.shape
    threads = ARGMAX_THREADS if threads is None else threads
    per_thread = ARGMAX_PER_THREAD if per_thread is None else per_thread
    assert 0 < threads <= MAX_THREADS and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    assert vocab > 0, "argmax of an empty row"
    out = device_empty((n_rows,), np.int32) if out is None else out
    assert out.shape == (n_rows,), (out.shape, n_rows)
    if n_rows:
        parts = -(-vocab // (threads * per_thread))
        part_values = device_empty((n_rows, parts), np.float32)
        part_indices = device_empty((n_rows, parts), np.int32)
        stream = launch_stream()
        argmax_parts_kernel(per_thread)[(n_rows, parts), threads, stream](logits, part_values, part_indices)
        argmax_merge_kernel[n_rows, ARGMAX_MERGE_THREADS, stream](part_values, part_indices, out)
    return out


def argmax_ref(logits: np.ndarray) -> np.ndarray:
    # np.argmax, like torch.argmax, returns the first maximum and treats NaN as the maximum.
    return np.argmax(logits, axis=-1).astype(np.int32)


# ---- sampling ---------------------------------------------------------------------------------------------
MASK32 = np.uint64(0xFFFFFFFF)
MASS_ONE = np.float32(2.0**32)         # q = floor(MASS_ONE * p): the integer mass of probability p
MAX_MASS = np.uint64(2**32)            # the mass of the row max (p = 1)
MAX_VOCAB = 2**17                      # keeps V * MAX_MASS < 2^49, exact in float64 (Llama 3: 128256)
STREAM_SALTS = (np.uint64(0x5851F42D), np.uint64(0x14057B7E))  # two independent keys per (seed, step)
# partials[buffer, quantity, thread]: top-k's rounds fill quantity COUNT, top-p's TOTAL and AT_LEAST
COUNT = TOTAL = 0
AT_LEAST = 1


@jit(device=True)
def mix32(x):
    """lowbias32: a bijective, well-mixed hash of uint64 x < 2^32 (scalar or array); result < 2^32."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x21F0AAAD)) & MASK32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x735A2D97)) & MASK32
    return x ^ (x >> np.uint64(15))


@jit(device=True)
def stream_key(seed, step, salt):
    """A 32-bit key of one draw: mix32 chained over (salt, seed low, seed high, step); injective in step."""
    seed = np.uint64(seed)
    key = mix32(salt)
    key = mix32(key ^ (seed & MASK32))
    key = mix32(key ^ (seed >> np.uint64(32)))
    return mix32(key ^ np.uint64(np.int64(step) & np.int64(0xFFFFFFFF)))


@jit(device=True)
def noise_bits(key_a, key_b, index):
    """32 random bits for vocabulary entry `index` (scalar or uint64 array) of the draw keyed (key_a, key_b):
    mix32(mix32(index ^ key_a) ^ key_b). Injective in index; two keys, so no two draws' noise is a permutation
    of each other's."""
    return mix32(mix32(np.uint64(index) ^ key_a) ^ key_b)


@jit(device=True)
def open_uniform(bits):
    """bits < 2^32 -> float64 u = (bits + 1/2) / 2^32, exactly; never 0 or 1, so -log(-log(u)) is finite."""
    return (np.float64(bits) + 0.5) * 2.0**-32


@jit(device=True)
def order_key(x):
    """float32 (scalar or array) -> uint64 key < 2^32 with key(a) < key(b) iff a < b (not NaN; -0.0 = +0.0)."""
    bits = np.uint64((np.float32(x) + np.float32(0.0)).view(np.uint32))  # -0.0 + 0.0 = +0.0
    sign = bits >> np.uint64(31)
    # negative: flip every bit (a larger magnitude gets a smaller key); positive: set the sign bit
    return bits ^ ((sign * np.uint64(0x7FFFFFFF)) | np.uint64(0x80000000))


@jit
def sample_kernel(logits, temperatures, top_ks, top_ps, seeds, steps, out):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    vocab = logits.shape[1]
    best_values = cuda.shared.array(MAX_THREADS, np.float32)
    best_indices = cuda.shared.array(MAX_THREADS, np.int32)
    partials = cuda.shared.array((2, 2, MAX_THREADS), np.uint64)  # [buffer, quantity, thread]

    # 1. row max: argmax's winner (beats' order), the row scanned by this one block
    best_value = np.float32(-math.inf)
    best_index = NO_INDEX
    for col in range(tid, vocab, n_threads):
        v = logits[row, col]
        if beats(v, col, best_value, best_index):
            best_value = v
            best_index = col
    row_max, row_argmax = _block_best(best_value, best_index, best_values, best_indices)

    temperature = temperatures[row]
    scaled_max = np.float32(math.inf)
    if temperature != 0:
        scaled_max = row_max / temperature
    if math.isinf(scaled_max) or math.isnan(scaled_max):  # greedy (block-uniform: every thread returns)
        if tid == 0:
            out[row] = row_argmax
        return
    cuda.syncthreads()  # every thread has read best_*[0] before step 4 reuses the arrays
    buf = 0

    # 2. top-k: the largest key K with #{i : key(s_i) >= K} >= k
    top_k = top_ks[row]
    key_floor = np.uint64(0)  # keeps everything
    if 0 < top_k < vocab:
        lo = np.uint64(0)
        hi = order_key(scaled_max)
        while lo < hi:
            mid = lo + ((hi - lo + np.uint64(1)) >> np.uint64(1))
            count = np.uint64(0)
            for col in range(tid, vocab, n_threads):
                if order_key(logits[row, col] / temperature) >= mid:
                    count += np.uint64(1)
            partials[buf, COUNT, tid] = count
            cuda.syncthreads()
            total = np.uint64(0)
            for j in range(n_threads):
                total += partials[buf, COUNT, j]
            buf = 1 - buf
            if total >= np.uint64(top_k):
                lo = mid
            else:
                hi = mid - np.uint64(1)
        key_floor = lo

    # 3. top-p: the largest mass threshold T' with sum_{q_i >= T'} q_i >= top_p * sum_i q_i
    top_p = top_ps[row]
    use_top_p = top_p < 1
    mass_floor = np.uint64(0)
    if use_top_p:
        lo = np.uint64(0)
        hi = MAX_MASS
        while lo < hi:
            mid = lo + ((hi - lo + np.uint64(1)) >> np.uint64(1))
            total_mass = np.uint64(0)  # the same every round; summed along for free, saving a round
            mass_at_least = np.uint64(0)
            for col in range(tid, vocab, n_threads):
                s = logits[row, col] / temperature
                if order_key(s) >= key_floor:
                    q = np.uint64(np.float32(math.exp(np.float64(s - scaled_max))) * MASS_ONE)
                    total_mass += q
                    if q >= mid:
                        mass_at_least += q
            partials[buf, TOTAL, tid] = total_mass
            partials[buf, AT_LEAST, tid] = mass_at_least
            cuda.syncthreads()
            total_mass = np.uint64(0)
            mass_at_least = np.uint64(0)
            for j in range(n_threads):
                total_mass += partials[buf, TOTAL, j]
                mass_at_least += partials[buf, AT_LEAST, j]
            buf = 1 - buf
            if np.float64(mass_at_least) >= np.float64(top_p) * np.float64(total_mass):
                lo = mid
            else:
                hi = mid - np.uint64(1)
        mass_floor = lo

    # 4. Gumbel-max over the survivors
    key_a = stream_key(seeds[row], steps[row], STREAM_SALTS[0])
    key_b = stream_key(seeds[row], steps[row], STREAM_SALTS[1])
    best_value = np.float32(-math.inf)
    best_index = NO_INDEX
    for col in range(tid, vocab, n_threads):
        s = logits[row, col] / temperature
        keep = order_key(s) >= key_floor
        if keep and use_top_p:
            keep = np.uint64(np.float32(math.exp(np.float64(s - scaled_max))) * MASS_ONE) >= mass_floor
        if keep:
            score = s + np.float32(-math.log(-math.log(open_uniform(noise_bits(key_a, key_b, col)))))
            if beats(score, col, best_value, best_index):
                best_value = score
                best_index = col
    _, index = _block_best(best_value, best_index, best_values, best_indices)
    if tid == 0:
        out[row] = index


SAMPLE_INPUTS = (("temperatures", (np.float32,)), ("top_ks", (np.int32,)), ("top_ps", (np.float32,)),
                 ("seeds", (np.uint64, np.int64)), ("steps", (np.int32,)))


def sample(logits, temperatures, top_ks, top_ps, seeds, steps, out=None, threads=None):
    """Per-row sampling, device arrays in and out: logits float32 [B, V]; temperatures float32 [B] (>= 0,
    0 = greedy); top_ks int32 [B] (<= 0 or >= V: off); top_ps float32 [B] (in (0, 1], 1: off);
    seeds uint64 or int64 [B]; steps int32 [B] (>= 0, e.g. tokens generated so far) -> int32 [B] ids."""
    threads = DEFAULT_THREADS if threads is None else threads
    assert 0 < threads <= MAX_THREADS and threads & (threads - 1) == 0, f"threads={threads}: need a power of two"
    n_rows, vocab = logits.shape
    assert 0 < vocab <= MAX_VOCAB, f"vocab {vocab} outside [1, {MAX_VOCAB}]: top-p mass sums would not be exact"
    for (name, dtypes), array in zip(SAMPLE_INPUTS, (temperatures, top_ks, top_ps, seeds, steps)):
        assert array.shape == (n_rows,), f"{name}: shape {array.shape}, want ({n_rows},)"
        assert array.dtype in dtypes, f"{name}: dtype {array.dtype}, want one of {dtypes}"
    out = device_empty((n_rows,), np.int32) if out is None else out
    assert out.shape == (n_rows,), (out.shape, n_rows)
    if n_rows:
        sample_kernel[n_rows, threads, launch_stream()](logits, temperatures, top_ks, top_ps, seeds, steps, out)
    return out


def _scaled_row(x, temperature):
    """(s, m) of a row that samples, None for a greedy one (T = 0 or a non-finite scaled max)."""
    if temperature == 0:
        return None
    with np.errstate(over="ignore"):  # an overflowing x / T is a case handled here, not an accident
        m = x[np.argmax(x)] / temperature  # argmax's pick, as the kernel's step 1
        return (x / temperature, m) if np.isfinite(m) else None


def _keep_row(x, temperature, top_k, top_p):
    scaled = _scaled_row(x, temperature)
    if scaled is None:
        return np.arange(len(x)) == np.argmax(x)
    s, m = scaled
    keep = np.ones(len(x), bool)
    if 0 < top_k < len(x):
        keys = host_version(order_key)(s)
        keep = keys >= np.sort(keys)[::-1][top_k - 1]  # the k-th largest key
    if top_p < 1:
        mass = (np.exp((s - m).astype(np.float64)).astype(np.float32) * MASS_ONE).astype(np.uint64)
        mass[~keep] = 0
        descending = np.sort(mass)[::-1]
        enough = np.cumsum(descending).astype(np.float64) >= np.float64(top_p) * np.float64(mass.sum())
        keep &= mass >= descending[np.argmax(enough)]  # the first (largest) q whose prefix holds top_p
    return keep


def _per_row(n_rows, value, dtype):
    return np.broadcast_to(np.asarray(value).astype(dtype), (n_rows,))


def keep_mask_ref(logits, temperature, top_k, top_p) -> np.ndarray:
    """bool [B, V]: the tokens each row may sample (parameters per row or scalar); greedy rows: the argmax."""
    logits = np.asarray(logits, np.float32)
    n_rows = len(logits)
    rows = zip(logits, _per_row(n_rows, temperature, np.float32), _per_row(n_rows, top_k, np.int64),
               _per_row(n_rows, top_p, np.float32))
    return np.array([_keep_row(*row) for row in rows], bool).reshape(logits.shape)


def sample_ref(logits, temperatures, top_ks, top_ps, seeds, steps) -> np.ndarray:
    """numpy twin of `sample` on host arrays (or scalars): the same survivors, the same noise, the same ids."""
    logits = np.asarray(logits, np.float32)
    n_rows, vocab = logits.shape
    temperatures = _per_row(n_rows, temperatures, np.float32)
    seeds, steps = _per_row(n_rows, seeds, np.uint64), _per_row(n_rows, steps, np.int32)
    keep = keep_mask_ref(logits, temperatures, top_ks, top_ps)
    out = np.empty(n_rows, np.int32)
    for row in range(n_rows):
        scaled = _scaled_row(logits[row], temperatures[row])
        if scaled is None:
            out[row] = np.argmax(keep[row])
            continue
        key_a, key_b = (host_version(stream_key)(seeds[row], steps[row], salt) for salt in STREAM_SALTS)
        u = host_version(open_uniform)(host_version(noise_bits)(key_a, key_b, np.arange(vocab, dtype=np.uint64)))
        scores = scaled[0] + (-np.log(-np.log(u))).astype(np.float32)
        out[row] = np.argmax(np.where(keep[row], scores, np.float32(-np.inf)))
    return out


# ---- min_tokens: stop tokens may not be chosen yet -------------------------------------------------
# logits[rows[j], token_ids[j]] = -inf for every pair j. One thread per pair.

@jit
def suppress_tokens_kernel(logits, rows, token_ids):
    j = cuda.grid(1)
    if j < rows.size:
        logits[rows[j], token_ids[j]] = -np.inf


def suppress_tokens(logits, rows, token_ids):
    """In place: make token_ids[j] impossible in row rows[j] (int32 device arrays of equal length)."""
    assert rows.shape == token_ids.shape and rows.ndim == 1, (rows.shape, token_ids.shape)
    if rows.size > 0:
        suppress_tokens_kernel[1 if SIMULATOR else -(-rows.size // 128), rows.size if SIMULATOR else 128, launch_stream()](
            logits, rows, token_ids)


def suppress_tokens_ref(logits: np.ndarray, rows: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    out = logits.copy()
    out[rows, token_ids] = -np.inf
    return out
