"""A request as the engine keeps it: its prompt, sampling parameters, the scheduler's Sequence for it, and
what has been reported and recorded so far (finish reason, logprobs)."""
from __future__ import annotations

from dataclasses import dataclass

from tinyvllm.engine.outputs import TokenLogprobs
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.engine.sequence import Sequence


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    stop_token_ids: frozenset[int]        # the ids that end it: params.stop_token_ids, and the model's EOS
    #                                       ids unless params.ignore_eos (min_tokens keeps them from being sampled)
    seq: Sequence | None = None
    text: str | None = None               # set once stop strings cut it; else decoded on demand
    reported_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprobs] | None = None          # see RequestOutput.logprobs
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    def __post_init__(self):
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)


def stop_token_ids(params: SamplingParams, eos_token_ids: frozenset[int]) -> frozenset[int]:
    """The token ids that end a request of these params on a model whose EOS ids are `eos_token_ids`."""
    return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)
