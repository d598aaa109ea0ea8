"""What running one scheduled step gives back (StepResult), and a decode step still in flight (InFlight).

The pipelined decode: an all-greedy decode step replayed from its CUDA graph needs only its rows' argmax,
which the graph computes itself. While the GPU runs it, the engine does the host work of the next step: when
that step is the same sequences decoding again (LLMEngine._can_follow), the scheduler appends a FED_BACK
placeholder for each sequence's token and schedules, and the runner launches the next step, whose graph
embeds the real tokens from the device (cuda_graphs.py); only then does the runner read the earlier step's
tokens, which replace the placeholders before the stop checks. A sequence that stopped (a stop token) had one
token too many computed in the step behind it: that token is dropped. Outputs are the same as without
pipelining, one step later.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernels_numba.embedding import FED_BACK

from tinyvllm.engine.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from tinyvllm.runner.cuda_graphs import PendingTokens

__all__ = ["FED_BACK", "InFlight", "StepResult"]


@dataclass
class StepResult:
    schedule: SchedulerOutput   # the step these tokens belong to
    sampled: dict[int, int]     # seq_id -> new token, for each scheduled sequence that samples


@dataclass
class InFlight:
    """A decode step replayed from a CUDA graph whose tokens the host has not read yet (every row samples)."""
    schedule: SchedulerOutput
    pending: PendingTokens

    def result(self) -> StepResult:
        """Wait for the step and return its tokens."""
        tokens = self.pending.tokens()
        return StepResult(self.schedule, {s.seq.seq_id: t for s, t in zip(self.schedule.scheduled, tokens)})
