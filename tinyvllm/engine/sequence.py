"""A request as the scheduler sees it: its token ids, its KV block table and its progress counters.

`token_ids` holds every known token (prompt, then sampled output). `num_computed_tokens` counts the
leading tokens whose K/V are already in the cache; the next forward step starts there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)  # identity: two requests with equal fields are still two requests
class Sequence:
    seq_id: int
    prompt_token_ids: list[int]
    max_tokens: int                    # limit on the number of output tokens
    token_ids: list[int] = None        # prompt + output; defaults to a copy of the prompt
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0       # tokens whose K/V are in the cache
    num_cached_tokens: int = 0         # of those, tokens that came from a prefix-cache hit (stats)
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0         # leading blocks of block_table registered for prefix caching
    num_preemptions: int = 0
    skip_prefix_cache: bool = False    # compute every token itself (its prompt logprobs need their logits)
    data: object = None                # whatever the engine attaches (sampling params, timings)

    def __post_init__(self):
        self.prompt_token_ids = list(self.prompt_token_ids)
        if self.token_ids is None:
            self.token_ids = list(self.prompt_token_ids)
        assert self.prompt_token_ids, "a sequence needs at least one prompt token"
        assert self.token_ids[:len(self.prompt_token_ids)] == self.prompt_token_ids
        assert self.max_tokens >= 1

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def state(self) -> str:
        """For the debugger: waiting | preempted | prefill | chunked | decode | finished."""
        if self.status is SequenceStatus.FINISHED:
            return "finished"
        if self.status is SequenceStatus.WAITING:
            return "preempted" if self.num_preemptions > 0 else "waiting"
        # Decoding: only the last sampled token is left to compute.
        if self.num_output_tokens > 0 and self.num_computed_tokens >= self.num_tokens - 1:
            return "decode"
        # Prefill has started once the engine computed anything beyond what the prefix cache gave.
        return "chunked" if self.num_computed_tokens > self.num_cached_tokens else "prefill"
