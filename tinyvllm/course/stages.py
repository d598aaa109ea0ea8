"""The stages a lesson may stop at: the forward pass's (tinyvllm/runner/forward.py's LAYER_STAGES, layer by layer,
for the demo model the tour runs), plus `start` (the engine loaded, before the first step) and `step-end` (after a
whole step: the scheduler's decisions, the block tables)."""
from __future__ import annotations

from functools import lru_cache

BEFORE = ("start",)
AFTER = ("step-end",)


@lru_cache(maxsize=1)
def demo_layers() -> int:
    from tinyvllm.model.config import ModelConfig
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    return ModelConfig.from_model_dir(DEMO_MODEL_DIR).num_hidden_layers


def tour_stages() -> list[str]:
    """Every stage a lesson may name, in the order the tour reaches them in a step."""
    from tinyvllm.runner.forward import stage_names
    return list(BEFORE) + stage_names(demo_layers()) + list(AFTER)
