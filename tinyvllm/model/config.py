"""Model and generation settings, read from a Hugging Face model directory.

`ModelConfig` comes from config.json and is validated up front: tinyvllm runs Llama-architecture models
only (RMSNorm, rotate-half RoPE, GQA attention, SiLU-gated MLP, no biases), so anything else is refused
with a ModelLoadError naming the file and the offending key. Both transformers layouts are read: 4.x
(`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters` = {"rope_type", "rope_theta", ...}).
`GenerationDefaults` comes from the optional generation_config.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyvllm.errors import ModelLoadError

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

_REQUIRED = object()
# Optional keys default as in transformers' LlamaConfig, so a sparse config.json means here what it means to HF.
_HF_DEFAULT_RMS_NORM_EPS = 1e-6
_HF_DEFAULT_ROPE_THETA = 10000.0
_HF_DEFAULT_MAX_POSITIONS = 2048


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; any problem is a ModelLoadError naming the file (and line, for bad JSON)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise ModelLoadError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(d: dict, key: str, source: str, default: Any = _REQUIRED) -> int:
    value = d.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ModelLoadError(f"{source}: missing required key {key!r}")
        return default
    if not _is_int(value) or value <= 0:
        raise ModelLoadError(f"{source}: {key} must be a positive integer, got {value!r}")
    return value


def _positive_float(d: dict, key: str, source: str, default: float) -> float:
    value = d.get(key, default)
    if not _is_number(value) or value <= 0:
        raise ModelLoadError(f"{source}: {key} must be a positive number, got {value!r}")
    return float(value)


def _token_ids(value: Any, key: str, source: str) -> tuple[int, ...]:
    """config.json's eos_token_id may be an int, a list of ints or null."""
    if value is None:
        return ()
    ids = [value] if _is_int(value) else value
    if not isinstance(ids, list) or not all(_is_int(i) and i >= 0 for i in ids):
        raise ModelLoadError(f"{source}: {key} must be a token id, a list of token ids or null, got {value!r}")
    return tuple(ids)


def _check_is_llama(d: dict, source: str) -> None:
    model_type = d.get("model_type")
    architectures = d.get("architectures") or []
    if model_type != "llama" and "LlamaForCausalLM" not in architectures:
        raise ModelLoadError(f"{source}: not a Llama model (model_type {model_type!r}, architectures "
                             f"{architectures!r}); tinyvllm runs LlamaForCausalLM only")
    if d.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{source}: hidden_act {d['hidden_act']!r} is not supported (expected 'silu')")
    for key in ("attention_bias", "mlp_bias"):
        if d.get(key, False):
            raise ModelLoadError(f"{source}: {key} is true; tinyvllm supports Llama without biases only")


def _rope_theta_and_scaling(d: dict, source: str) -> tuple[float, dict | None]:
    """(theta, scaling); scaling is None for plain RoPE, else a dict with at least "rope_type"."""
    if d.get("rope_parameters") is not None:  # transformers 5.x
        key = "rope_parameters"
        params = d[key]
        if not isinstance(params, dict):
            raise ModelLoadError(f"{source}: rope_parameters must be an object, got {params!r}")
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        theta = _positive_float(params if "rope_theta" in params else d, "rope_theta", source,
                                _HF_DEFAULT_ROPE_THETA)
    else:  # transformers 4.x
        key = "rope_scaling"
        scaling = d.get(key)
        if scaling is not None and not isinstance(scaling, dict):
            raise ModelLoadError(f"{source}: rope_scaling must be an object or null, got {scaling!r}")
        scaling = dict(scaling or {})
        theta = _positive_float(d, "rope_theta", source, _HF_DEFAULT_ROPE_THETA)
    if "type" in scaling and "rope_type" not in scaling:  # the name before transformers 4.43
        scaling["rope_type"] = scaling.pop("type")
    if not scaling or scaling.get("rope_type") == "default":
        return theta, None
    if "rope_type" not in scaling:
        raise ModelLoadError(f"{source}: {key} has no rope_type: {d[key]!r}")
    return theta, scaling


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None: plain RoPE; else transformers' dict, e.g. {"rope_type": "llama3", ...}
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = CONFIG_FILE) -> ModelConfig:
        """Validate a parsed config.json; `source` names the file in error messages."""
        _check_is_llama(d, source)
        hidden = _positive_int(d, "hidden_size", source)
        heads = _positive_int(d, "num_attention_heads", source)
        kv_heads = _positive_int(d, "num_key_value_heads", source, default=heads)
        if heads % kv_heads:
            raise ModelLoadError(f"{source}: num_attention_heads {heads} is not a multiple of "
                                 f"num_key_value_heads {kv_heads}")
        if d.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(f"{source}: no head_dim and hidden_size {hidden} is not a multiple of "
                                 f"num_attention_heads {heads}")
        head_dim = _positive_int(d, "head_dim", source, default=hidden // heads)
        if head_dim % 2:
            raise ModelLoadError(f"{source}: head_dim {head_dim} is odd; rotate-half RoPE needs it even")
        tie = d.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise ModelLoadError(f"{source}: tie_word_embeddings must be true or false, got {tie!r}")
        bos = d.get("bos_token_id")
        if bos is not None and not (_is_int(bos) and bos >= 0):
            raise ModelLoadError(f"{source}: bos_token_id must be a token id or null, got {bos!r}")
        rope_theta, rope_scaling = _rope_theta_and_scaling(d, source)
        return cls(
            vocab_size=_positive_int(d, "vocab_size", source),
            hidden_size=hidden,
            intermediate_size=_positive_int(d, "intermediate_size", source),
            num_hidden_layers=_positive_int(d, "num_hidden_layers", source),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_positive_float(d, "rms_norm_eps", source, _HF_DEFAULT_RMS_NORM_EPS),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_positive_int(d, "max_position_embeddings", source,
                                                  default=_HF_DEFAULT_MAX_POSITIONS),
            tie_word_embeddings=tie,
            bos_token_id=bos,
            eos_token_ids=_token_ids(d.get("eos_token_id"), "eos_token_id", source),
        )

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ModelConfig:
        config_path = Path(path) / CONFIG_FILE
        return cls.from_dict(read_json_object(config_path), source=str(config_path))


@dataclass
class GenerationDefaults:
    """The model's suggested sampling settings; None where generation_config.json says nothing."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    do_sample: bool | None = None
    max_new_tokens: int | None = None
    eos_token_ids: tuple[int, ...] | None = None  # when set, overrides ModelConfig.eos_token_ids

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = GENERATION_CONFIG_FILE) -> GenerationDefaults:
        def get(key: str, is_valid, expected: str):
            value = d.get(key)
            if value is not None and not is_valid(value):
                raise ModelLoadError(f"{source}: {key} must be {expected}, got {value!r}")
            return value

        temperature = get("temperature", lambda v: _is_number(v) and v >= 0, "a number >= 0")
        top_p = get("top_p", lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]")
        return cls(
            temperature=None if temperature is None else float(temperature),
            top_p=None if top_p is None else float(top_p),
            top_k=get("top_k", lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
            do_sample=get("do_sample", lambda v: isinstance(v, bool), "true or false"),
            max_new_tokens=get("max_new_tokens", lambda v: _is_int(v) and v > 0, "a positive integer"),
            eos_token_ids=(_token_ids(d["eos_token_id"], "eos_token_id", source)
                           if d.get("eos_token_id") is not None else None),
        )

    @classmethod
    def from_model_dir(cls, path: str | Path) -> GenerationDefaults:
        """All None when the directory has no generation_config.json."""
        gen_path = Path(path) / GENERATION_CONFIG_FILE
        if not gen_path.exists():
            return cls()
        return cls.from_dict(read_json_object(gen_path), source=str(gen_path))
