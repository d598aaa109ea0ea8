"""A stage of the forward pass: what ran and what it produced, and how the stage generators are run.

The forward pass (tinyvllm/runner/forward.py) is a generator of Stages: it launches one stage's kernels, yields its
Stage, and goes on when asked for the next; `drain` runs one to the end for its return value.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from kernels_numba.common import cuda

FUSED = "computed by"  # what a stage's kernel says when an earlier stage's fused kernel produced its output


@dataclass
class Stage:
    """One step of the forward pass: what ran and what it produced (a device array)."""
    name: str              # e.g. "layers.3.q", see docs/architecture.md
    kernel: str            # the launcher that produced it, e.g. "matmul.gemv + rope.rope"
    output: object         # device array
    layer: int | None = None
    seconds: float = 0.0   # host wall time of the launches (synchronised)

    def to_host(self) -> np.ndarray:
        return self.output.copy_to_host()

    @property
    def launched(self) -> bool:
        """False when a fused kernel of an earlier stage already produced this stage's output."""
        return not self.kernel.startswith(f"({FUSED}")


def computed_by(stage: str) -> str:
    """The kernel string of a stage that launches nothing: `stage`'s fused kernel produced its output."""
    return f"({FUSED} {stage})"


def drain(stages: Iterator):
    """Run a stage generator to the end; its return value."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value


def run_stage(name: str, kernel: str, launch: Callable[[], object], layer: int | None = None,
              synchronize: bool = True, show: int | str | None = None):
    """Run one stage's launches (and wait for them), yield the Stage, hand its output back to the caller.
    A launch that returns several arrays (a fused kernel) shows its `show`-th (a tuple's index, or a field of
    epilogues.FusedOutputs) as the stage's output."""
    start = time.perf_counter()
    output = launch()
    if synchronize:
        cuda.synchronize()
    shown = output if show is None else getattr(output, show) if isinstance(show, str) else output[show]
    yield Stage(name, kernel, shown, layer, time.perf_counter() - start)
    return output
