"""Small helpers the lessons' pycon blocks call, so the numbers a lesson shows come from the project itself (the
demo model's files, the engine's kernels, scheduler and block manager) and are checked like any doctest."""
from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def demo_config():
    """The demo model's ModelConfig (tinyvllm/model/demo_model/config.json)."""
    from tinyvllm.model.loader import read_model_config
    return read_model_config()


@lru_cache(maxsize=1)
def demo_weights() -> dict[str, np.ndarray]:
    """The demo model's host weights, as the loader reads them (bf16 bit patterns as uint16)."""
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    from tinyvllm.model.weights import load_weights
    return load_weights(DEMO_MODEL_DIR, demo_config())


@lru_cache(maxsize=1)
def demo_tokenizer():
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    from tinyvllm.model.tokenizer import Tokenizer
    return Tokenizer.from_model_dir(DEMO_MODEL_DIR)


def rows(values: np.ndarray, columns: int = 4, digits: int = 4) -> None:
    """Print the first `columns` values of each row of a 2-D array, one row a line."""
    for i, row in enumerate(np.asarray(values)):
        print(f"{i:3d}: " + " ".join(f"{v:{digits + 4}.{digits}f}" for v in row[:columns]))
