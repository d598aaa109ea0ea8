"""One GGUF file: its typed metadata, and its Llama tensors as Hugging Face-named bf16 arrays.

GGUF (llama.cpp's format): a header of typed key/value metadata (`llama.block_count`, `tokenizer.ggml.tokens`,
...), then tensor infos (name, type, dims innermost first) and the data. The `gguf` package's GGUFReader
memory-maps the file and parses both; `gguf.quants.dequantize` turns each quantized tensor into float32.
A tensor with dims [ne0, ne1] is a row-major [ne1, ne0] array, so a linear weight is already
[out_features, in_features] as in Hugging Face; quantization blocks run along a row.

llama.cpp's converter permutes the rows of attn_q / attn_k within each head for its RoPE, which rotates
adjacent pairs (x[2i], x[2i+1]); Hugging Face's rotates halves (x[i], x[i + head_dim/2]). Row 2i + j of a
head in the file is row j * head_dim/2 + i of the Hugging Face head: `unpermute_rope_rows` puts them back,
so the engine's rotate-half kernels run the model unchanged.
"""
from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from tinyvllm.errors import ModelLoadError

# The tensor types tinyvllm dequantizes (tests/test_gguf.py writes each one and checks it).
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

_LAYER_TENSORS = {  # GGUF name inside blk.{i}. -> Hugging Face name inside model.layers.{i}.
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_MODEL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's Llama 3 frequency factors; read into the config, not a weight


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, None if it is not a plain Llama weight."""
    if gguf_name in _MODEL_TENSORS:
        return _MODEL_TENSORS[gguf_name]
    block, _, rest = gguf_name.partition(".")
    layer, _, suffix = rest.partition(".")
    if block == "blk" and layer.isdigit() and suffix in _LAYER_TENSORS:
        return f"model.layers.{int(layer)}.{_LAYER_TENSORS[suffix]}"
    return None


def gguf_tensor_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face Llama weight (the inverse of hf_tensor_name)."""
    for gguf_name, name in _MODEL_TENSORS.items():
        if name == hf_name:
            return gguf_name
    layer, suffix = hf_name.removeprefix("model.layers.").split(".", 1)
    return f"blk.{layer}." + next(g for g, h in _LAYER_TENSORS.items() if h == suffix)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: per head, file row 2i + j -> row j * head_dim/2 + i."""
    rows = w.shape[0]
    assert rows % (2 * n_heads) == 0, (w.shape, n_heads)
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order from Hugging Face's (the inverse of unpermute_rope_rows); for writing test files."""
    rows = w.shape[0]
    assert rows % (2 * n_heads) == 0, (w.shape, n_heads)
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFCheckpoint:
    """A GGUF file opened for reading; every problem is a ModelLoadError naming the file and the key or tensor."""

    def __init__(self, path: str | Path):
        import gguf  # imported here: only GGUF models need the package at run time
        self._gguf = gguf
        self.path = Path(path)
        try:
            self.reader = gguf.GGUFReader(self.path)
        except FileNotFoundError:
            raise ModelLoadError(f"{self.path}: file not found") from None
        except Exception as e:  # the reader raises ValueError, struct.error, ... on a bad or truncated file
            raise ModelLoadError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
        self.fields = self.reader.fields
        self.tensors = {t.name: t for t in self.reader.tensors}
        architecture = self.get("general.architecture", str)
        if architecture != "llama":
            raise ModelLoadError(f"{self.path}: architecture {architecture!r} is not supported; "
                                 f"tinyvllm runs GGUF files of architecture 'llama' only")
        if self.get("split.count", int, default=1) > 1:
            raise ModelLoadError(f"{self.path}: a split GGUF ({self.get('split.count', int)} files) is not "
                                 f"supported; merge it first (llama-gguf-split --merge)")

    # ---- metadata ----
    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, kind: type, default=ModelLoadError):
        """The value of metadata `key` as `kind` (int, float, bool, str, or list for arrays)."""
        field = self.fields.get(key)
        if field is None:
            if default is ModelLoadError:
                raise ModelLoadError(f"{self.path}: missing metadata key {key!r}")
            return default
        vt = self._gguf.GGUFValueType
        main = field.types[0] if field.types else None
        expected = {int: {vt.UINT8, vt.INT8, vt.UINT16, vt.INT16, vt.UINT32, vt.INT32, vt.UINT64, vt.INT64},
                    float: {vt.FLOAT32, vt.FLOAT64, vt.UINT8, vt.INT8, vt.UINT16, vt.INT16, vt.UINT32, vt.INT32,
                            vt.UINT64, vt.INT64},
                    bool: {vt.BOOL}, str: {vt.STRING}, list: {vt.ARRAY}}[kind]
        if main not in expected:
            got = "none" if main is None else main.name.lower()
            raise ModelLoadError(f"{self.path}: metadata {key!r} is a {got}, expected {kind.__name__}")
        try:
            value = field.contents()
        except UnicodeDecodeError:
            raise ModelLoadError(f"{self.path}: metadata {key!r} holds a string that is not UTF-8") from None
        if kind is float and main == vt.FLOAT32:  # the shortest decimal of the float32: 1e-05, not 9.99999974e-06
            return float(str(np.float32(value)))
        return kind(value) if kind in (int, float, bool) else value

    # ---- tensors ----
    def tensor_type(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """[rows, cols] (or [n]) in numpy order: the file's dims reversed."""
        return tuple(int(n) for n in reversed(self.tensors[name].shape.tolist()))

    def read_float32(self, name: str) -> np.ndarray:
        """A tensor dequantized to float32, in numpy order."""
        tensor = self.tensors[name]
        type_name = tensor.tensor_type.name
        if type_name not in SUPPORTED_TYPES:
            raise ModelLoadError(f"{self.path}: tensor {name} has type {type_name}, which tinyvllm does not "
                                 f"dequantize (supported: {', '.join(SUPPORTED_TYPES)})")
        values = self._gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        return np.asarray(values, dtype=np.float32).reshape(self.tensor_shape(name))

    def read_bf16(self, name: str) -> np.ndarray:
        """A tensor as bf16 bit patterns (uint16): BF16 as stored, anything else dequantized and rounded
        to nearest even."""
        tensor = self.tensors[name]
        if tensor.tensor_type.name == "BF16":
            return np.asarray(tensor.data).view(np.uint16).reshape(self.tensor_shape(name))
        return self.read_float32(name).astype(ml_dtypes.bfloat16).view(np.uint16)

    @property
    def weight_dtype(self) -> np.dtype:
        """What the model computes with. Files without quantized tensors follow the safetensors loader
        (tinyvllm.model.weights): float32 when any tensor is F32 or F16 (F16 and BF16 widened exactly), bf16 bits when
        all are BF16. Files with quantized tensors are dequantized to bf16, their F32 / F16 tensors (norms)
        rounded to bf16 as well: one weight dtype per model, and half the bytes of float32 to read per step."""
        types = {t.tensor_type.name for name, t in self.tensors.items() if hf_tensor_name(name)}
        if types <= set(FLOAT_TYPES) and types & {"F32", "F16"}:
            return np.dtype(np.float32)
        return np.dtype(np.uint16)

    def load_weights(self, expected_shapes: dict[str, tuple[int, ...]], n_heads: int, n_kv_heads: int,
                     progress: Callable[[int, int], None] | None = None,
                     notices: list[str] | None = None) -> dict[str, np.ndarray]:
        """{Hugging Face name: weights in `weight_dtype`} for every name in expected_shapes, q/k rows in HF order."""
        by_hf_name = {}
        for name in self.tensors:
            hf_name = hf_tensor_name(name)
            if hf_name is None:
                if name == ROPE_FREQS:
                    continue
                raise ModelLoadError(f"{self.path}: unexpected tensor {name} ({self.tensor_type(name)}, shape "
                                     f"{list(self.tensor_shape(name))}); tinyvllm runs plain Llama models "
                                     f"(no biases, no extra norms)")
            if hf_name not in expected_shapes:  # e.g. blk.30.* in a 30-layer model
                raise ModelLoadError(f"{self.path}: unexpected tensor {name} for a model of this config")
            by_hf_name[hf_name] = name
        dtype = self.weight_dtype
        weights: dict[str, np.ndarray] = {}
        stored: Counter[str] = Counter()
        rounded_exactly = 0  # F32 / F16 tensors whose values were bf16 values already
        for done, (hf_name, shape) in enumerate(expected_shapes.items(), start=1):
            name = by_hf_name.get(hf_name)
            if name is None:
                raise ModelLoadError(f"{self.path}: missing tensor {gguf_tensor_name(hf_name)} (expected shape "
                                     f"{list(shape)})")
            if self.tensor_shape(name) != shape:
                raise ModelLoadError(f"{self.path}: tensor {name} has shape {list(self.tensor_shape(name))}, "
                                     f"expected {list(shape)} for {hf_name}")
            type_name = self.tensor_type(name)
            if dtype == np.float32:
                array = self.read_float32(name)
            else:
                array = self.read_bf16(name)
                if type_name in ("F32", "F16"):
                    rounded_exactly += np.array_equal((array.astype(np.uint32) << 16).view(np.float32),
                                                      self.read_float32(name))
            if hf_name.endswith("self_attn.q_proj.weight"):
                array = unpermute_rope_rows(array, n_heads)
            elif hf_name.endswith("self_attn.k_proj.weight"):
                array = unpermute_rope_rows(array, n_kv_heads)
            weights[hf_name] = array
            stored[type_name] += 1
            if progress is not None:
                progress(done, len(expected_shapes))
        counts = ", ".join(f"{n} {t}" for t, n in sorted(stored.items()))
        if dtype == np.float32:
            message = f"{self.path.name}: {counts} tensors: computing with float32 weights (exact)"
        elif set(stored) != {"BF16"}:
            floats = sum(n for t, n in stored.items() if t in ("F32", "F16"))
            message = (f"{self.path.name}: {counts} tensors dequantized to bf16 (round-to-nearest-even)"
                       + (f"; {rounded_exactly} of its {floats} F32/F16 tensors held bf16 values (exact)"
                          if floats else ""))
        else:
            message = None
        if message:
            if notices is not None:
                notices.append(message)
            else:
                warnings.warn(message, stacklevel=2)
        return weights
