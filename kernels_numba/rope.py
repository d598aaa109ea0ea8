"""Rotary position embedding, HF "rotate-half" layout (the first and second half of a head pair up):

    h = hd/2, a = float32(pos) * inv_freq[i]:  out[i] = x[i] cos a - x[i+h] sin a,  out[i+h] = x[i+h] cos a + x[i] sin a
    rope_qkv:  qkv row = [q heads | k heads | v heads]  ->  q = rope(q heads), k = rope(k heads), v = v heads

Launch layout: one thread per (token, head, i < h) on the GPU, grid-stride so the simulator can run a
small grid; a thread reads both halves of its pair before writing them, so `out` may be `x` itself (in place).
rope_qkv_kernel: one thread per (token, head of q, k or v, i < h) of the fused projection's output, tokens over
the grid's y and a token's pairs over its x (common.rows_launch); it rotates its pair into q or k, or copies it
into v. Both kernels rotate with the same device function.
Fused because the decode step projects q, k and v with one matmul: one launch splits and rotates all three,
and (given the paged KV pools) stores k and v at their slots as well.
`rope_inv_freq` (host) builds inv_freq in float32 with the same operations, in the same order, as
transformers' modeling_rope_utils, so the angles match HF's bit for bit.
For the supported rope types HF's attention_scaling is 1.0, so cos and sin are not scaled.
"""
import math

import numpy as np

from .common import cuda, jit, grid_stride_launch, launch_stream, device_empty, rows_launch
from .kv_dtype import check_kv_pool_dtype, kv_from_f32

THREADS = 128
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    # HF: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), in float32
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    # torch's float32 pow is correctly rounded; numpy's float32 pow is off by up to 1 ulp, so take the
    # power in float64 and round once (checked bit-exact against transformers 5.24).
    powers = (np.float64(theta) ** exponents.astype(np.float64)).astype(np.float32)
    return np.float32(1.0) / powers


def _llama3_inv_freq(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    missing = [key for key in LLAMA3_KEYS if key not in scaling]
    if missing:
        raise ValueError(f"rope_type 'llama3' needs {', '.join(missing)} in the rope scaling config")
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    # Python scalars mixed with float32 arrays stay float32 (NEP 50), as scalars do with torch tensors.
    low_freq_wavelen = np.float32(old_context_len / low_freq_factor)
    high_freq_wavelen = np.float32(old_context_len / high_freq_factor)

    wavelen = np.float32(2 * math.pi) / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth_factor = ((np.float32(old_context_len) / wavelen - np.float32(low_freq_factor))
                     / np.float32(high_freq_factor - low_freq_factor))
    smoothed = ((np.float32(1) - smooth_factor) * inv_freq_llama / np.float32(factor)
                + smooth_factor * inv_freq_llama)
    is_medium_freq = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium_freq, smoothed, inv_freq_llama).astype(np.float32)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """float32 [head_dim // 2] inverse frequencies, as transformers computes them for this rope config.

    `scaling` is the config's rope_scaling / rope_parameters dict (or None); its "rope_type" (or the older
    "type") picks default, linear (inv_freq / factor) or llama3 (frequency bands smoothed by wavelength).
    """
    assert head_dim > 0 and head_dim % 2 == 0, f"head_dim must be even, got {head_dim}"
    scaling = scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    inv_freq = _default_inv_freq(head_dim, theta)
    if rope_type == "linear":
        inv_freq = inv_freq / np.float32(scaling["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    return inv_freq.astype(np.float32)


@jit(device=True)
def rotate_pair(x1, x2, position, freq):
    """(x[i], x[i+h]) rotated by the angle float32(position) * inv_freq[i]."""
    angle = np.float32(position) * freq
    c = np.float32(math.cos(angle))  # math.cos(float32) is float64 in the simulator: cast back
    s = np.float32(math.sin(angle))
    return x1 * c - x2 * s, x2 * c + x1 * s


@jit
def rope_kernel(x, positions, inv_freq, out):
    n_tokens, n_heads, head_dim = x.shape
    half = head_dim // 2
    for idx in range(cuda.grid(1), n_tokens * n_heads * half, cuda.gridsize(1)):
        i = idx % half
        head = (idx // half) % n_heads
        t = idx // (half * n_heads)
        y1, y2 = rotate_pair(x[t, head, i], x[t, head, i + half], positions[t], inv_freq[i])
        out[t, head, i] = y1
        out[t, head, i + half] = y2


@jit(device=True)
def store_qkv_pair(x1, x2, t, head, i, slot, positions, inv_freq, q, k, v, k_pool, v_pool):
    """Put one pair (x[i], x[i + head_dim / 2]) of token t's q|k|v head `head` (q heads, then k, then v)
    where rope_qkv puts it: q and k pairs rotated, k and v pairs also at pool slot `slot` (-1: not stored), as
    the pool stores them (float32, or bf16 rounded to nearest even: kv_dtype.kv_from_f32).
    rope_qkv's kernel and matmul's RoPE-fused GEMV share it, so both store the same bits."""
    n_heads, n_kv_heads, half = q.shape[1], k.shape[1], q.shape[2] // 2
    block_size = k_pool.shape[1]
    if head < n_heads + n_kv_heads:
        x1, x2 = rotate_pair(x1, x2, positions[t], inv_freq[i])
    if head < n_heads:
        q[t, head, i] = x1
        q[t, head, i + half] = x2
    elif head < n_heads + n_kv_heads:
        kv_head = head - n_heads
        k[t, kv_head, i] = x1
        k[t, kv_head, i + half] = x2
        if slot >= 0:
            k_pool[slot // block_size, slot % block_size, kv_head, i] = kv_from_f32(x1, k_pool)
            k_pool[slot // block_size, slot % block_size, kv_head, i + half] = kv_from_f32(x2, k_pool)
    else:
        kv_head = head - n_heads - n_kv_heads
        v[t, kv_head, i] = x1
        v[t, kv_head, i + half] = x2
        if slot >= 0:
            v_pool[slot // block_size, slot % block_size, kv_head, i] = kv_from_f32(x1, v_pool)
            v_pool[slot // block_size, slot % block_size, kv_head, i + half] = kv_from_f32(x2, v_pool)


def _rope_qkv_kernel(write_pool: bool):
    """rope_qkv's kernel; with `write_pool` (a closure constant: the other branch is compiled out) it also
    stores each token's rotated k and its v at the token's slot of the paged KV pools (slot -1: padding,
    skipped), the job of paged_attention.write_kv_paged, so a step launches one kernel fewer."""

    @jit
    def kernel(qkv, positions, inv_freq, q, k, v, k_pool, v_pool, slot_mapping):
        # tokens over the grid's y, a token's pairs over its x, in while loops: one division a pair (a flat index
        # over all tokens takes three, and a range() with a runtime step one more for its trip count)
        n_tokens = qkv.shape[0]
        head_dim = q.shape[2]
        n_all_heads = q.shape[1] + 2 * k.shape[1]
        half = head_dim // 2
        t = cuda.blockIdx.y
        while t < n_tokens:
            slot = slot_mapping[t] if write_pool else -1
            pair = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            while pair < n_all_heads * half:
                head = pair // half  # q heads, then k heads, then v heads
                i = pair - head * half
                x1 = qkv[t, head * head_dim + i]
                x2 = qkv[t, head * head_dim + i + half]
                store_qkv_pair(x1, x2, t, head, i, slot, positions, inv_freq, q, k, v, k_pool, v_pool)
                pair += cuda.gridDim.x * cuda.blockDim.x
            t += cuda.gridDim.y

    return kernel


rope_qkv_kernel = _rope_qkv_kernel(False)
rope_qkv_write_kv_kernel = _rope_qkv_kernel(True)


def rope(x, positions, inv_freq, out=None):
    """x float32 [T, n_heads, hd], positions int32 [T], inv_freq float32 [hd/2] -> float32 like x.

    All device arrays; pass out=x to rotate in place.
    """
    n_tokens, n_heads, head_dim = x.shape
    assert head_dim % 2 == 0 and inv_freq.shape == (head_dim // 2,), (x.shape, inv_freq.shape)
    assert positions.shape == (n_tokens,), (positions.shape, n_tokens)
    out = device_empty(x.shape, np.float32) if out is None else out
    assert out.shape == x.shape, (out.shape, x.shape)
    n_pairs = n_tokens * n_heads * (head_dim // 2)
    if n_pairs:
        blocks, threads = grid_stride_launch(n_pairs, THREADS)
        rope_kernel[blocks, threads, launch_stream()](x, positions, inv_freq, out)
    return out


def rope_qkv(qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim, q_out=None, k_out=None, v_out=None,
             kv_pools=None, slot_mapping=None):
    """qkv float32 [T, (n_heads + 2 n_kv_heads) * hd] (columns: q heads | k heads | v heads), positions int32
    [T], inv_freq float32 [hd/2] -> (q [T, n_heads, hd], k [T, n_kv_heads, hd], v [T, n_kv_heads, hd]), float32
    device arrays: q and k rotated exactly as rope() rotates them, v a copy. With kv_pools = (k_pool, v_pool)
    ([num_blocks, block_size, n_kv_heads, hd]) and slot_mapping int32 [T]: k and v are also stored at each
    token's slot, as paged_attention.write_kv_paged stores them (-1 skips; a uint16 pool gets bf16 bits).
    """
    n_tokens, width = qkv.shape
    assert head_dim % 2 == 0 and inv_freq.shape == (head_dim // 2,), (head_dim, inv_freq.shape)
    assert width == (n_heads + 2 * n_kv_heads) * head_dim, (qkv.shape, n_heads, n_kv_heads, head_dim)
    assert positions.shape == (n_tokens,), (positions.shape, n_tokens)
    q_shape, kv_shape = (n_tokens, n_heads, head_dim), (n_tokens, n_kv_heads, head_dim)
    q = device_empty(q_shape, np.float32) if q_out is None else q_out
    k = device_empty(kv_shape, np.float32) if k_out is None else k_out
    v = device_empty(kv_shape, np.float32) if v_out is None else v_out
    assert q.shape == q_shape and k.shape == kv_shape and v.shape == kv_shape, (q.shape, k.shape, v.shape)
    if kv_pools is None:
        kernel, k_pool, v_pool, slot_mapping = rope_qkv_kernel, k.reshape((1,) + kv_shape), v.reshape(
            (1,) + kv_shape), positions  # stand-ins of the right types, never touched
    else:
        kernel, (k_pool, v_pool) = rope_qkv_write_kv_kernel, kv_pools
        assert k_pool.shape == v_pool.shape and k_pool.shape[2:] == kv_shape[1:], (k_pool.shape, kv_shape)
        check_kv_pool_dtype(k_pool, v_pool)
        assert slot_mapping is not None and slot_mapping.shape == (n_tokens,), "slot_mapping: one slot per token"
    pairs_per_token = (n_heads + 2 * n_kv_heads) * (head_dim // 2)
    if n_tokens * pairs_per_token:
        blocks, threads = rows_launch(n_tokens, pairs_per_token, THREADS)
        kernel[blocks, threads, launch_stream()](qkv, positions, inv_freq, q, k, v, k_pool, v_pool, slot_mapping)
    return q, k, v


def rope_ref(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    angle = positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]  # [T, h]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    x1, x2 = x[..., :half].astype(np.float32), x[..., half:].astype(np.float32)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_qkv_ref(qkv: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, n_heads: int, n_kv_heads: int,
                 head_dim: int):
    n_tokens = qkv.shape[0]
    q, k, v = np.split(qkv.astype(np.float32), [n_heads * head_dim, (n_heads + n_kv_heads) * head_dim], axis=1)
    return (rope_ref(q.reshape(n_tokens, n_heads, head_dim), positions, inv_freq),
            rope_ref(k.reshape(n_tokens, n_kv_heads, head_dim), positions, inv_freq),
            v.reshape(n_tokens, n_kv_heads, head_dim))
