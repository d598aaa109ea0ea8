"""Whether a sequence's newest token ends it (vLLM v1's check_stop): a pure function of the sequence, its
sampling parameters and a detokenizer, run after every token.

In order: nothing stops it before params.min_tokens output tokens; then a stop token, then a stop string
(the only check that needs the text: the output is decoded only when params.stop is set); then the length
limit (seq.max_tokens: max_tokens, capped by what the context has left).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.engine.sequence import Sequence


@dataclass(frozen=True)
class Stop:
    reason: str               # "stop" (a stop token or string) or "length"
    text: str | None = None   # with a stop string: the output text up to it (the string itself cut)


def check_stop(seq: Sequence, params: SamplingParams, stop_token_ids: frozenset[int],
               detokenize: Callable[[list[int]], str]) -> Stop | None:
    """How the sequence ends with its newest token, or None while it goes on."""
    num_output = seq.num_output_tokens
    if num_output >= params.min_tokens:
        if seq.token_ids[-1] in stop_token_ids:
            return Stop("stop")
        if params.stop:
            text = detokenize(seq.output_token_ids)
            cut = first_stop_string(text, params.stop)
            if cut is not None:
                return Stop("stop", text[:cut])
    if num_output >= seq.max_tokens:
        return Stop("length")
    return None


def first_stop_string(text: str, stop: tuple[str, ...] | list[str]) -> int | None:
    """Where the earliest of the stop strings starts in text, or None when none occurs."""
    return min((i for i in (text.find(s) for s in stop) if i >= 0), default=None)
