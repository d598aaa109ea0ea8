"""Loading a model directory: config, tokenizer, generation defaults, and the weights on the device."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from kernels_numba.rope import rope_inv_freq

from .config import GenerationDefaults, ModelConfig
from .errors import ModelLoadError, TinyVLLMError
from .model_runner import DeviceWeights
from .tokenizer import Tokenizer
from .weights import load_weights


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class LoadedModel:
    model_dir: Path
    config: ModelConfig
    generation_defaults: GenerationDefaults
    tokenizer: Tokenizer
    weights: DeviceWeights
    inv_freq: np.ndarray  # RoPE frequencies, float32 [head_dim / 2]


def default_model_dir() -> Path:
    from .demo import DEMO_MODEL_DIR
    return DEMO_MODEL_DIR


def load_model(model_dir: str | Path | None = None, *, log: Callable[[str], None] = log_to_stderr) -> LoadedModel:
    """Read, validate and upload a Llama-architecture HF model directory (the demo model by default)."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    if not model_dir.is_dir():
        raise TinyVLLMError(f"model directory not found: {model_dir}")
    start = time.perf_counter()
    config = ModelConfig.from_model_dir(model_dir)
    tokenizer = Tokenizer.from_model_dir(model_dir)
    log(f"loading {model_dir}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}")
    notices: list[str] = []
    host_weights = load_weights(model_dir, config, progress=_progress(log, "reading weights"), notices=notices)
    for notice in notices:
        log(f"note: {notice}")
    try:
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    except ValueError as e:
        raise ModelLoadError(f"{model_dir / 'config.json'}: {e}") from e
    weights = DeviceWeights.upload(config, host_weights, progress=_progress(log, "uploading weights"))
    log(f"loaded in {time.perf_counter() - start:.1f} s")
    return LoadedModel(model_dir, config, GenerationDefaults.from_model_dir(model_dir), tokenizer, weights, inv_freq)


def _progress(log: Callable[[str], None], what: str, every_seconds: float = 2.0):
    """A progress callback that logs at most every few seconds, and once at the end."""
    last = [time.perf_counter()]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] >= every_seconds:
            last[0] = now
            log(f"  {what}: {done}/{total}")
    return report
