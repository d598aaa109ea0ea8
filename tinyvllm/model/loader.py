"""Loading a model: config, tokenizer, generation defaults, and the weights on the device.

A model is a Hugging Face directory (config.json, safetensors, tokenizer files) or a GGUF file (or a
directory holding one, tinyvllm/model/gguf); both end up as the same `LoadedModel`, so nothing above
`load_model` knows which format a model came from.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

import numpy as np

from kernels_numba.rope import rope_inv_freq

from tinyvllm.errors import ModelLoadError, TinyVLLMError
from tinyvllm.log import log_to_stderr
from tinyvllm.model.config import GenerationDefaults, ModelConfig
from tinyvllm.model.device_weights import DeviceWeights
from tinyvllm.model.gguf import GGUFModelFiles, find_gguf_file
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.model.weights import load_weights


@dataclass
class LoadedModel:
    model_dir: Path  # what was loaded: the HF directory or the .gguf file
    config: ModelConfig
    generation_defaults: GenerationDefaults
    tokenizer: Tokenizer
    weights: DeviceWeights
    inv_freq: np.ndarray  # RoPE frequencies, float32 [head_dim / 2]


def default_model_dir() -> Path:
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    return DEMO_MODEL_DIR


def load_model(model_dir: str | Path | None = None, *, log: Callable[[str], None] = log_to_stderr) -> LoadedModel:
    """Read, validate and upload a Llama-architecture model (the demo model by default): an HF model
    directory, a .gguf file, or a directory holding one .gguf."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    if not model_dir.exists():
        raise TinyVLLMError(f"model directory not found: {model_dir}")
    start = time.perf_counter()
    gguf_file = find_gguf_file(model_dir)
    if gguf_file is not None:
        model_dir = gguf_file
        gguf = _read_gguf(gguf_file)
        config, tokenizer, generation_defaults = gguf.model_config(), gguf.tokenizer(), gguf.generation_defaults()
        read_weights = gguf.weights
    else:
        config = ModelConfig.from_model_dir(model_dir)
        tokenizer = Tokenizer.from_model_dir(model_dir)
        generation_defaults = GenerationDefaults.from_model_dir(model_dir)
        read_weights = partial(load_weights, model_dir)
    log(f"loading {model_dir}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}")
    notices: list[str] = []
    host_weights = read_weights(config, progress=_progress(log, "reading weights"), notices=notices)
    for notice in notices:
        log(f"note: {notice}")
    try:
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    except ValueError as e:
        raise ModelLoadError(f"{model_dir if gguf_file else model_dir / 'config.json'}: {e}") from e
    weights = DeviceWeights.upload(config, host_weights, progress=_progress(log, "uploading weights"))
    log(f"loaded in {time.perf_counter() - start:.1f} s")
    return LoadedModel(model_dir, config, generation_defaults, tokenizer, weights, inv_freq)


def read_model_config(model_dir: str | Path | None = None) -> ModelConfig:
    """The model's config alone (no weights): from config.json or the GGUF metadata."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    gguf_file = find_gguf_file(model_dir) if model_dir.exists() else None
    return _read_gguf(gguf_file).model_config() if gguf_file else ModelConfig.from_model_dir(model_dir)


def read_generation_defaults(model_dir: str | Path | None = None) -> GenerationDefaults:
    """The model's suggested sampling settings: generation_config.json or the GGUF metadata."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    gguf_file = find_gguf_file(model_dir) if model_dir.exists() else None
    return (_read_gguf(gguf_file).generation_defaults() if gguf_file
            else GenerationDefaults.from_model_dir(model_dir))


def _read_gguf(path: Path) -> GGUFModelFiles:
    """GGUFModelFiles.read, remembered for the last file (by path, size and mtime): the CLI reads a GGUF's
    generation defaults before it loads the model, and parsing the metadata takes seconds."""
    stat = path.stat()
    return _read_gguf_cached(path.resolve(), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=1)
def _read_gguf_cached(path: Path, size: int, mtime_ns: int) -> GGUFModelFiles:
    return GGUFModelFiles.read(path)


def _progress(log: Callable[[str], None], what: str, every_seconds: float = 2.0):
    """A progress callback that logs at most every few seconds, and once at the end."""
    last = [time.perf_counter()]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] >= every_seconds:
            last[0] = now
            log(f"  {what}: {done}/{total}")
    return report
