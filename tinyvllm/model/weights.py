"""Checkpoint loading: a Hugging Face Llama safetensors checkpoint -> {tensor name: weights as the kernels read them}.

The safetensors format, parsed here directly: an 8-byte little-endian header length N; N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}; then the data region,
offsets relative to its start, little-endian, row-major. The data region is np.memmap'ed, so tensors load
without a copy where they can (read-only views of the file).

The model computes with exactly the values the checkpoint holds: an all-BF16 checkpoint loads as bf16 bit
patterns (uint16), one with F32 or F16 tensors as float32 (F16 and any BF16 tensors widened, which is exact),
so every tensor of a model has one dtype (kernels_numba.weight_dtype). A float32 load is reported once:
appended to `notices` when the caller passes a list, otherwise issued with warnings.warn. Tensors the model
does not use (a tied checkpoint's lm_head.weight, rotary_emb.inv_freq, ...) are ignored.
"""
from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tinyvllm.errors import ModelLoadError
from tinyvllm.model.config import ModelConfig, read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
STORAGE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by its Hugging Face name; linear weights are [out_features, in_features]."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        shapes |= {
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (q_width, hidden),
            prefix + "self_attn.k_proj.weight": (kv_width, hidden),
            prefix + "self_attn.v_proj.weight": (kv_width, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, q_width),
            prefix + "post_attention_layernorm.weight": (hidden,),
            prefix + "mlp.gate_proj.weight": (inter, hidden),
            prefix + "mlp.up_proj.weight": (inter, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inter),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


class SafetensorsFile:
    """One .safetensors file: its parsed header, and its data region memory-mapped on first read."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name
        try:
            file_size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                prefix = f.read(8)
                if len(prefix) < 8:
                    raise ModelLoadError(f"{self.name}: {file_size} bytes, too short for a safetensors header")
                header_len = int.from_bytes(prefix, "little")
                if 8 + header_len > file_size:
                    raise ModelLoadError(f"{self.name}: header length {header_len} is beyond the file size "
                                         f"({file_size} bytes)")
                raw_header = f.read(header_len)
        except OSError as e:
            raise ModelLoadError(f"{self.name}: cannot read ({e.strerror})") from None
        try:
            header = json.loads(raw_header)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError both
            raise ModelLoadError(f"{self.name}: header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise ModelLoadError(f"{self.name}: header is not a JSON object")
        header.pop("__metadata__", None)
        self.entries: dict = header
        self.data_start = 8 + header_len
        self.data_size = file_size - self.data_start
        self._data: np.ndarray | None = None

    def read(self, name: str, expected_shape: tuple[int, ...]) -> tuple[np.ndarray, str]:
        """(tensor as stored, its dtype name), after checking shape, dtype and offsets against the header."""
        entry = self.entries.get(name)
        if entry is None:
            raise ModelLoadError(f"{name}: missing from {self.name} (expected shape {expected_shape})")
        malformed = ModelLoadError(f"{name}: malformed header entry in {self.name}: {entry!r}")
        try:
            dtype_name, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise malformed from None
        if not all(type(n) is int and n >= 0 for n in (*shape, begin, end)):
            raise malformed
        if shape != expected_shape:
            raise ModelLoadError(f"{name}: expected shape {expected_shape}, got {shape} in {self.name}")
        dtype = STORAGE_DTYPES.get(dtype_name)
        if dtype is None:
            raise ModelLoadError(f"{name}: unsupported dtype {dtype_name!r} in {self.name} "
                                 f"(expected BF16, F16 or F32)")
        if end > self.data_size:
            raise ModelLoadError(f"{name}: data_offsets [{begin}, {end}] are beyond the end of {self.name} "
                                 f"(data region {self.data_size} bytes); is the file truncated?")
        needed = math.prod(shape) * dtype.itemsize
        if end - begin != needed:
            raise ModelLoadError(f"{name}: data_offsets [{begin}, {end}] in {self.name} hold {end - begin} "
                                 f"bytes, but shape {shape} in {dtype_name} needs {needed}")
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.data_start,
                                   shape=(self.data_size,))
        return np.asarray(self._data[begin:end]).view(dtype).reshape(shape), dtype_name


def _tensor_files(model_dir: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, Path]:
    """Which file holds each tensor: model.safetensors, else the shards a sharded index names."""
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return {name: single for name in shapes}
    index = model_dir / INDEX_FILE
    if not index.is_file():
        raise ModelLoadError(f"{model_dir}: no {SINGLE_FILE} nor {INDEX_FILE}")
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ModelLoadError(f"{index}: no weight_map object mapping tensor names to shard files")
    files = {}
    for name, shape in shapes.items():
        if name not in weight_map:
            raise ModelLoadError(f"{name}: missing from {INDEX_FILE} weight_map (expected shape {shape})")
        shard = model_dir / weight_map[name]
        if not shard.is_file():
            raise ModelLoadError(f"{INDEX_FILE}: shard {weight_map[name]!r}, which holds {name}, "
                                 f"is not in {model_dir}")
        files[name] = shard
    return files


def load_weights(model_dir: str | Path, config: ModelConfig,
                 progress: Callable[[int, int], None] | None = None,
                 notices: list[str] | None = None) -> dict[str, np.ndarray]:
    """{name: uint16 bf16 bit patterns, or float32 when the checkpoint holds any F32 or F16 tensor} for every
    tensor in expected_tensor_shapes(config).

    progress(done, total) is called after each tensor. Any problem raises a ModelLoadError naming the
    file, the tensor and what was expected.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: not a directory")
    shapes = expected_tensor_shapes(config)
    files = _tensor_files(model_dir, shapes)
    opened: dict[Path, SafetensorsFile] = {}
    weights: dict[str, np.ndarray] = {}
    stored: Counter[str] = Counter()
    for done, (name, shape) in enumerate(shapes.items(), start=1):
        path = files[name]
        if path not in opened:
            opened[path] = SafetensorsFile(path)
        array, dtype_name = opened[path].read(name, shape)
        weights[name] = array
        stored[dtype_name] += 1
        if progress is not None:
            progress(done, len(shapes))
    if set(stored) != {"BF16"}:
        weights = {name: _as_float32(array) for name, array in weights.items()}
        counts = ", ".join(f"{n} {dtype}" for dtype, n in sorted(stored.items()))
        widened = " and ".join(sorted(set(stored) - {"F32"}))
        widened = f" ({widened} widened exactly)" if widened else ""
        _notify(f"{model_dir}: {counts} tensors: computing with float32 weights{widened}", notices)
    return weights


def _as_float32(array: np.ndarray) -> np.ndarray:
    """A stored tensor's values as float32: bf16 bits (uint16) become the top half of a float32, F16 widens;
    both exact. F32 stays as it is (the memory-mapped view)."""
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32, copy=False)


def _notify(message: str, notices: list[str] | None) -> None:
    if notices is None:
        warnings.warn(message, stacklevel=3)
    else:
        notices.append(message)
