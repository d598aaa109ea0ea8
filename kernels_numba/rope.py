"""Rotary position embedding, HF "rotate-half" layout (the first and second half of a head pair up):

    h = hd/2, a = float32(pos) * inv_freq[i]:  out[i] = x[i] cos a - x[i+h] sin a,  out[i+h] = x[i+h] cos a + x[i] sin a

Launch layout: one thread per (token, head, i < h) on the GPU, grid-stride so the simulator can run a
small grid; a thread reads both halves of its pair before writing them, so `out` may be `x` itself (in place).
`rope_inv_freq` (host) builds inv_freq in float32 with the same operations, in the same order, as
transformers' modeling_rope_utils, so the angles match HF's bit for bit.
For the supported rope types HF's attention_scaling is 1.0, so cos and sin are not scaled.
"""
import math

import numpy as np

from .common import cuda, jit, grid_stride_launch, launch_stream, device_empty

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


@jit
def rope_kernel(x, positions, inv_freq, out):
    n_tokens, n_heads, head_dim = x.shape
    half = head_dim // 2
    for idx in range(cuda.grid(1), n_tokens * n_heads * half, cuda.gridsize(1)):
        i = idx % half
        head = (idx // half) % n_heads
        t = idx // (half * n_heads)
        angle = np.float32(positions[t]) * inv_freq[i]
        c = np.float32(math.cos(angle))  # math.cos(float32) is float64 in the simulator: cast back
        s = np.float32(math.sin(angle))
        x1 = x[t, head, i]
        x2 = x[t, head, i + half]
        out[t, head, i] = x1 * c - x2 * s
        out[t, head, i + half] = x2 * c + x1 * s


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


def rope_ref(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    angle = positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]  # [T, h]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    x1, x2 = x[..., :half].astype(np.float32), x[..., half:].astype(np.float32)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
