"""What the scheduler hands the runner each step: which sequences run, and which tokens of each.

The one object between the host-side scheduler and the device-side runner (vLLM v1's SchedulerOutput):
the runner builds the step's inputs from it (tinyvllm/runner/inputs.py) and samples a token for each
entry whose `samples` is True; the scheduler's `update` then advances exactly these entries.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from tinyvllm.engine.sequence import Sequence


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: its tokens [start, end) go through the forward pass."""
    seq: Sequence                                # the sequence (its block table already holds [0, end))
    num_new_tokens: int                          # tokens computed this step, from position `start`
    start: int = field(init=False)               # seq.num_computed_tokens when scheduled: the first position
    num_known_tokens: int = field(init=False)    # seq.num_tokens when scheduled (prompt + sampled so far)

    def __post_init__(self):
        self.start = self.seq.num_computed_tokens
        self.num_known_tokens = self.seq.num_tokens
        assert 0 < self.num_new_tokens and self.end <= self.num_known_tokens

    @property
    def end(self) -> int:
        """One past the last position computed this step."""
        return self.start + self.num_new_tokens

    @property
    def samples(self) -> bool:
        """This step reaches the end of the known tokens, so the runner samples the next one (a prefill
        chunk that ends mid-prompt samples nothing)."""
        return self.end == self.num_known_tokens

    @property
    def token_ids(self) -> list[int]:
        """The token ids this step feeds in, positions start..end - 1."""
        return self.seq.token_ids[self.start:self.end]


@dataclass
class SchedulerOutput:
    """One step's decision, in batch order: running sequences first (decodes and unfinished prefill
    chunks), then newly admitted ones."""
    scheduled: list[ScheduledSeq]    # what runs this step; row r of the step's batch is scheduled[r]
    preempted: list[Sequence]        # sent back to waiting this step, their KV blocks freed (recomputed later)
    num_batched_tokens: int          # sum of num_new_tokens: the step's share of the token budget

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @cached_property
    def sampling_seqs(self) -> list[Sequence]:
        """The sequences that get a new token this step, in batch order (computed once: the engine, the runner
        and the sampler each ask, for every row of a large batch)."""
        return [s.seq for s in self.scheduled if s.samples]
