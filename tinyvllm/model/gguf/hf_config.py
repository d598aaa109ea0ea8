"""A GGUF file's `llama.*` metadata as a Hugging Face config.json (and generation_config.json) dict.

The dict then goes through the same `ModelConfig.from_dict` validation as a config.json on disk, and
`tinyvllm convert` writes it out as is. RoPE scaling comes from `llama.rope.scaling.type` (linear), or, for
Llama 3.x, from the `rope_freqs.weight` tensor: llama.cpp stores the llama3 frequency factors rather than
their parameters, so the parameters are recovered and checked against every factor.
"""
from __future__ import annotations

import math

import numpy as np

from tinyvllm.errors import ModelLoadError
from tinyvllm.model.gguf.checkpoint import ROPE_FREQS, GGUFCheckpoint

# Meta's Llama 3.1 / 3.2 llama3 RoPE parameters besides the factor (every released checkpoint uses them).
LLAMA3_ROPE_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def hf_config_dict(ckpt: GGUFCheckpoint) -> dict:
    """config.json for the model in `ckpt` (LlamaForCausalLM)."""
    heads = ckpt.get("llama.attention.head_count", int)
    hidden = ckpt.get("llama.embedding_length", int)
    head_dim = ckpt.get("llama.attention.key_length", int, default=hidden // heads if heads else 0)
    value_dim = ckpt.get("llama.attention.value_length", int, default=head_dim)
    if value_dim != head_dim:
        raise ModelLoadError(f"{ckpt.path}: llama.attention.value_length {value_dim} differs from key_length "
                             f"{head_dim}; tinyvllm needs one head_dim")
    rotary = ckpt.get("llama.rope.dimension_count", int, default=head_dim)
    if rotary != head_dim:
        raise ModelLoadError(f"{ckpt.path}: llama.rope.dimension_count {rotary} differs from head_dim {head_dim}; "
                             f"partial rotary embeddings are not supported")
    if "token_embd.weight" not in ckpt.tensors:
        raise ModelLoadError(f"{ckpt.path}: missing tensor token_embd.weight")
    vocab_size = len(ckpt.get("tokenizer.ggml.tokens", list))
    embedding_rows = ckpt.tensor_shape("token_embd.weight")[0]
    if embedding_rows != vocab_size:
        raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.tokens has {vocab_size} tokens but token_embd.weight "
                             f"has {embedding_rows} rows")
    bos = ckpt.get("tokenizer.ggml.bos_token_id", int, default=None)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": ckpt.get("llama.feed_forward_length", int),
        "num_hidden_layers": ckpt.get("llama.block_count", int),
        "num_attention_heads": heads,
        "num_key_value_heads": ckpt.get("llama.attention.head_count_kv", int, default=heads),
        "head_dim": head_dim,
        "rms_norm_eps": ckpt.get("llama.attention.layer_norm_rms_epsilon", float),
        "rope_theta": ckpt.get("llama.rope.freq_base", float, default=10000.0),
        "rope_scaling": rope_scaling(ckpt, head_dim),
        "max_position_embeddings": ckpt.get("llama.context_length", int),
        "tie_word_embeddings": "output.weight" not in ckpt.tensors,
        "bos_token_id": bos,
        "eos_token_id": ckpt.get("tokenizer.ggml.eos_token_id", int, default=None),
        "torch_dtype": "bfloat16",
    }
    return config


def generation_config_dict(ckpt: GGUFCheckpoint) -> dict:
    """generation_config.json: bos, every end-of-generation id the file names, and its sampling defaults."""
    eos_ids = [ckpt.get(f"tokenizer.ggml.{key}_token_id", int, default=None) for key in ("eos", "eot", "eom")]
    config = {"bos_token_id": ckpt.get("tokenizer.ggml.bos_token_id", int, default=None),
              "eos_token_id": list(dict.fromkeys(i for i in eos_ids if i is not None))}
    sampling = {"temperature": ("general.sampling.temp", float), "top_p": ("general.sampling.top_p", float),
                "top_k": ("general.sampling.top_k", int)}
    for name, (key, kind) in sampling.items():
        if ckpt.has(key):
            config[name] = ckpt.get(key, kind)
            config["do_sample"] = True
    return config


def rope_scaling(ckpt: GGUFCheckpoint, head_dim: int) -> dict | None:
    """transformers' rope_scaling dict for the file (None: plain RoPE)."""
    kind = ckpt.get("llama.rope.scaling.type", str, default="none")
    if ROPE_FREQS in ckpt.tensors:
        if kind not in ("none", "llama3"):
            raise ModelLoadError(f"{ckpt.path}: both {ROPE_FREQS} and llama.rope.scaling.type {kind!r}; "
                                 f"not supported")
        theta = ckpt.get("llama.rope.freq_base", float, default=10000.0)
        return llama3_scaling_from_factors(ckpt.read_float32(ROPE_FREQS), theta, head_dim, str(ckpt.path))
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": ckpt.get("llama.rope.scaling.factor", float)}
    raise ModelLoadError(f"{ckpt.path}: llama.rope.scaling.type {kind!r} is not supported (supported: none, "
                         f"linear, and llama3 via {ROPE_FREQS})")


def llama3_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """The per-frequency divisors llama3 RoPE scaling applies to inv_freq (what llama.cpp stores)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    old_len = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    smooth = (old_len / wavelen - low) / (high - low)
    middle = 1.0 / ((1.0 - smooth) / factor + smooth)
    return np.where(wavelen < old_len / high, 1.0, np.where(wavelen > old_len / low, factor, middle))


def llama3_scaling_from_factors(factors: np.ndarray, theta: float, head_dim: int, where: str) -> dict:
    """The llama3 rope_scaling whose factors are `factors` (Meta's band parameters, factor = the largest)."""
    factors = np.asarray(factors, dtype=np.float64).reshape(-1)
    if factors.shape != (head_dim // 2,):
        raise ModelLoadError(f"{where}: {ROPE_FREQS} has {factors.size} values, expected head_dim / 2 = "
                             f"{head_dim // 2}")
    scaling = {"rope_type": "llama3", "factor": float(factors.max()), **LLAMA3_ROPE_DEFAULTS}
    expected = llama3_factors(theta, head_dim, scaling)
    worst = float(np.abs(factors - expected).max() / scaling["factor"])
    if worst > 1e-5:  # the file stores float32 factors: agreement to ~1e-7 when the parameters are right
        raise ModelLoadError(f"{where}: {ROPE_FREQS} does not match llama3 RoPE scaling with factor "
                             f"{scaling['factor']:g} and {LLAMA3_ROPE_DEFAULTS} (off by {worst:.2e}); not supported")
    return scaling
