"""Small GGUF files for the tests, written the way llama.cpp's convert_hf_to_gguf.py writes a Llama.

`write_llama_gguf` takes a Hugging Face config dict, HF-named float32 weights and a tokenizer description,
and writes a .gguf with gguf's GGUFWriter: `llama.*` metadata, q/k rows permuted for llama.cpp's RoPE,
tensors stored in the type asked for, Llama 3's RoPE factors as rope_freqs.weight, and the tokenizer as
`tokenizer.ggml.*`. `quantize` returns the stored bytes and, per element, the largest error the type's
rounding can make, so a test can hold the loader's output to it. gguf's numpy quantizers cover F16 to
Q5_1; the K-quants (Q4_K, Q5_K, Q6_K), which gguf only dequantizes, are packed here from their block
layouts (llama.cpp's ggml-quants.c): plain round-to-nearest, no search for the best scales.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from tinyvllm.model.gguf.checkpoint import gguf_tensor_name, permute_rope_rows

QK_K = 256
F16_ROUNDING = 2.0**-11  # relative error of rounding to float16 (10 stored mantissa bits, nearest)


def _f16_up(x: np.ndarray) -> np.ndarray:
    """A float16 scale at least as large as x: x grown past one float16 rounding before it is rounded."""
    return (np.asarray(x, np.float64) * (1 + 4 * F16_ROUNDING)).astype(np.float16)


def _split_blocks(values: np.ndarray, block: int) -> np.ndarray:
    assert values.shape[-1] % block == 0, (values.shape, block)
    return values.astype(np.float32).reshape(-1, block)


def _affine_k(values: np.ndarray, levels: int):
    """Q4_K / Q5_K rounding: per 32-value sub-block x ~ d*sc*q - dmin*m with 6-bit sc, m and q in 0..levels.
    Returns (d, dmin, sc, m, q, step): step = d*sc, so |x - value| <= step / 2."""
    x = _split_blocks(values, QK_K).reshape(-1, 8, 32)
    lowest = np.minimum(x.min(axis=-1), 0.0)                                    # [n, 8], <= 0
    dmin = _f16_up(-lowest.min(axis=-1) / 63)                                   # [n]
    dmin32 = dmin.astype(np.float32)[:, None]
    m = np.where(dmin32 > 0, np.ceil(-lowest / np.where(dmin32 > 0, dmin32, 1)), 0).clip(0, 63)
    offset = -dmin32 * m                                                        # <= lowest
    need = (x.max(axis=-1) - offset) / levels                                   # the step each sub-block needs
    d = _f16_up(need.max(axis=-1) / 63)
    d32 = d.astype(np.float32)[:, None]
    sc = np.where(d32 > 0, np.ceil(need / np.where(d32 > 0, d32, 1)), 0).clip(0, 63)
    step = (d32 * sc)[..., None]
    q = np.where(step > 0, np.rint((x - offset[..., None]) / np.where(step > 0, step, 1)), 0).clip(0, levels)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8), np.broadcast_to(step, x.shape)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 bytes holding 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4 layout)."""
    low, high = slice(0, 4), slice(4, 8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, low] | ((sc[:, high] >> 4) << 6)
    out[:, 4:8] = m[:, low] | ((m[:, high] >> 4) << 6)
    out[:, 8:12] = (sc[:, high] & 0x0F) | ((m[:, high] & 0x0F) << 4)
    return out


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(values):
    d, dmin, sc, m, q, step = _affine_k(values, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)       # byte l of chunk i: sub-blocks 2i (low), 2i+1
    return np.hstack([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qs]), step


def quantize_q5_k(values):
    d, dmin, sc, m, q, step = _affine_k(values, 31)
    low = q & 0x0F
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for j in range(8):                                            # bit j of qh[l]: the fifth bit of sub-block j
        qh |= ((q[:, j] >> 4) & 1) << j
    return np.hstack([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qh, qs]), step


def quantize_q6_k(values):
    """Symmetric: x ~ d * scale * q per 16-value sub-block, int8 scales, q in -32..31 (kept to -31..31)."""
    x = _split_blocks(values, QK_K).reshape(-1, 16, 16)
    need = np.abs(x).max(axis=-1) / 31
    d = _f16_up(need.max(axis=-1) / 127)
    d32 = d.astype(np.float32)[:, None]
    scales = np.where(d32 > 0, np.ceil(need / np.where(d32 > 0, d32, 1)), 0).clip(0, 127)
    step = (d32 * scales)[..., None]
    q = np.where(step > 0, np.rint(x / np.where(step > 0, step, 1)), 0).clip(-32, 31)
    u = (q + 32).astype(np.uint8).reshape(-1, 2, 128)            # two halves of 128 values
    low, high = u & 0x0F, u >> 4
    low = low.reshape(-1, 2, 2, 64)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    high = high.reshape(-1, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    raw = np.hstack([ql, qh, scales.astype(np.int8).view(np.uint8), _f16_bytes(d)])
    return raw, np.broadcast_to(step, x.shape)


# For gguf's own quantizers: the error bound as a fraction of each block's largest |x| (round to nearest
# plus the float16 rounding of the block's scale, and of its minimum for the _1 types).
_BLOCK_BOUNDS = {"Q8_0": (32, 1 / 254 + F16_ROUNDING), "Q4_0": (32, 1 / 8 + 8 * F16_ROUNDING),
                 "Q5_0": (32, 1 / 16 + 16 * F16_ROUNDING), "Q4_1": (32, 1 / 15 + 32 * F16_ROUNDING),
                 "Q5_1": (32, 1 / 31 + 64 * F16_ROUNDING)}
_K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantize(values: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes / array to store, per-element bound on |dequantized - values|)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return values, np.zeros_like(values)
    if type_name == "F16":
        return values.astype(np.float16), np.abs(values) * F16_ROUNDING + 2.0**-25  # + half a subnormal step
    if type_name == "BF16":
        return gguf.quants.quantize(values, qtype), np.abs(values) * 2.0**-8
    if type_name in _K_QUANTIZERS:
        raw, step = _K_QUANTIZERS[type_name](values)
        return raw.reshape(values.shape[0], -1), (step / 2).reshape(values.shape) * (1 + 1e-6)
    block, fraction = _BLOCK_BOUNDS[type_name]
    amax = np.abs(_split_blocks(values, block)).max(axis=-1, keepdims=True)
    bound = np.broadcast_to(amax * fraction, (amax.shape[0], block)).reshape(values.shape)
    return gguf.quants.quantize(values, qtype), bound


@dataclass
class GGUFTokenizer:
    """What goes under tokenizer.ggml.*: model "gpt2" (merges) or "llama" (scores)."""
    model: str
    tokens: list[str]
    token_types: list[int]
    bos_id: int | None = None
    eos_id: int | None = None
    pre: str | None = None
    merges: list[str] | None = None
    scores: list[float] | None = None
    add_bos: bool | None = None
    unknown_id: int | None = None
    extra_ids: dict[str, int] = field(default_factory=dict)  # e.g. {"eot": 7}
    chat_template: str | None = None


def llama3_rope_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """The float32 factors llama.cpp's converter stores as rope_freqs.weight for llama3 scaling."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama_gguf(path: Path, config: dict, weights: dict[str, np.ndarray], tok: GGUFTokenizer,
                     types: dict[str, str] | str = "F32", arch: str = "llama",
                     extra_tensors: dict | None = None) -> dict[str, np.ndarray]:
    """Write the model; returns {HF name: error bound of its stored values} (in HF row order).

    `types`: one type for every 2-D weight, or {HF name: type} (norms are always F32, as llama.cpp keeps them).
    """
    writer = gguf.GGUFWriter(str(path), arch)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_name("tinyvllm test model")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != config["hidden_size"] // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])

    writer.add_tokenizer_model(tok.model)
    if tok.pre is not None:
        writer.add_tokenizer_pre(tok.pre)
    writer.add_token_list(tok.tokens)
    writer.add_token_types(tok.token_types)
    if tok.merges is not None:
        writer.add_token_merges(tok.merges)
    if tok.scores is not None:
        writer.add_token_scores(tok.scores)
    for name, token_id in (("bos", tok.bos_id), ("eos", tok.eos_id), ("unknown", tok.unknown_id),
                           *tok.extra_ids.items()):
        if token_id is not None:
            writer.add_uint32(f"tokenizer.ggml.{name}_token_id", token_id)
    if tok.add_bos is not None:
        writer.add_add_bos_token(tok.add_bos)
    if tok.chat_template is not None:
        writer.add_chat_template(tok.chat_template)

    bounds = {}
    for hf_name, values in weights.items():
        type_name = "F32" if values.ndim == 1 else (types if isinstance(types, str) else types[hf_name])
        stored = values
        if hf_name.endswith("q_proj.weight"):
            stored = permute_rope_rows(values, heads)
        elif hf_name.endswith("k_proj.weight"):
            stored = permute_rope_rows(values, kv_heads)
        raw, bound = quantize(stored, type_name)
        writer.add_tensor(gguf_tensor_name(hf_name), raw, raw_dtype=gguf.GGMLQuantizationType[type_name]
                          if raw.dtype == np.uint8 else None)
        bounds[hf_name] = bound
    if scaling and scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config["rope_theta"], head_dim, scaling))
    for name, array in (extra_tensors or {}).items():  # an array as is, or (bytes, type name)
        array, raw_type = array if isinstance(array, tuple) else (array, None)
        writer.add_tensor(name, array, raw_dtype=gguf.GGMLQuantizationType[raw_type] if raw_type else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # bounds were computed on the stored (permuted) rows: put them in HF row order too
    from tinyvllm.model.gguf.checkpoint import unpermute_rope_rows
    for hf_name in bounds:
        if hf_name.endswith("q_proj.weight"):
            bounds[hf_name] = unpermute_rope_rows(np.asarray(bounds[hf_name]), heads)
        elif hf_name.endswith("k_proj.weight"):
            bounds[hf_name] = unpermute_rope_rows(np.asarray(bounds[hf_name]), kv_heads)
    return bounds


def byte_level_gguf_tokenizer(tokenizer_json: dict, pre: str, bos: str | None, eos: str | None,
                              add_bos: bool | None, chat_template: str | None = None) -> GGUFTokenizer:
    """A byte-level BPE tokenizer.json as llama.cpp's converter stores it: every token by id (added tokens
    as written), control type for special added tokens, user-defined for other added tokens, merges as "a b"."""
    model = tokenizer_json["model"]
    by_id = {i: t for t, i in model["vocab"].items()}
    kinds = {i: 1 for i in by_id}
    for added in tokenizer_json["added_tokens"]:
        by_id[added["id"]] = added["content"]
        kinds[added["id"]] = 3 if added["special"] else 4
    assert sorted(by_id) == list(range(len(by_id))), "token ids must be 0..n-1"
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    return GGUFTokenizer("gpt2", tokens, [kinds[i] for i in range(len(tokens))], pre=pre, merges=merges,
                         bos_id=ids.get(bos), eos_id=ids.get(eos), add_bos=add_bos, chat_template=chat_template)
