"""How one request chooses its tokens and when it stops, as vLLM's SamplingParams.

Every field is checked when the object is made: a bad value raises InvalidSamplingParams naming the field
and its allowed range. Lists are normalised to tuples (a single stop string to a 1-tuple), so the object is
immutable and hashable.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from tinyvllm.errors import TinyVLLMError

if TYPE_CHECKING:
    from tinyvllm.model.config import GenerationDefaults

SEED_LIMIT = 2**63  # seeds are uint64 on the device; keeping them below 2^63 lets int64 hold them too
MAX_LOGPROBS = 20  # top alternatives reported per position (vLLM's default limit)
MAX_LOGPROB_TOKEN_IDS = 1024


class InvalidSamplingParams(TinyVLLMError, ValueError):
    """A SamplingParams field outside its allowed range; the message names the field."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0          # 0 = greedy (argmax)
    top_p: float = 1.0                # in (0, 1]; 1 = off
    top_k: int = -1                   # -1 or 0 = off
    seed: int | None = None           # None: the engine picks one; same seed -> same tokens
    max_tokens: int = 16              # new tokens at most
    min_tokens: int = 0               # EOS and stop ids/strings are ignored until this many tokens
    stop: tuple[str, ...] = ()        # strings that end generation; not included in the returned text
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Log-probabilities under the model's raw distribution (log_softmax of the logits, before temperature,
    # top-k / top-p and min_tokens), as vLLM reports them. None: off; n: the token's own plus the n likeliest.
    logprobs: int | None = None       # for each generated token
    prompt_logprobs: int | None = None  # for each prompt token after the first (no prefix-cache reuse)
    logprob_token_ids: tuple[int, ...] = ()  # also these ids' logprobs at each generated position (scoring
    #                                          multiple choice: the answer letters); implies logprobs

    def __post_init__(self):
        _check(_is_number(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0,
               "temperature", "a finite number >= 0 (0 = greedy)", self.temperature)
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", "-1 or 0 (off) or an integer >= 1", self.top_k)
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT),
               "seed", "None or an integer in [0, 2**63)", self.seed)
        _check(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an integer >= 1", self.max_tokens)
        _check(_is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
               "min_tokens", f"an integer in [0, max_tokens={self.max_tokens}]", self.min_tokens)
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "True or False", self.ignore_eos)
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        _check(_is_sequence(stop) and all(isinstance(s, str) and s for s in stop),
               "stop", "a non-empty string or a sequence of non-empty strings", self.stop)
        _check(_is_sequence(self.stop_token_ids) and all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids", "a sequence of integers >= 0", self.stop_token_ids)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or (_is_int(value) and 0 <= value <= MAX_LOGPROBS),
                   name, f"None or an integer in [0, {MAX_LOGPROBS}]", value)
        _check(_is_sequence(self.logprob_token_ids) and len(self.logprob_token_ids) <= MAX_LOGPROB_TOKEN_IDS
               and all(_is_int(t) and t >= 0 for t in self.logprob_token_ids),
               "logprob_token_ids", f"a sequence of at most {MAX_LOGPROB_TOKEN_IDS} integers >= 0",
               self.logprob_token_ids)
        for name, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("max_tokens", int),
                           ("min_tokens", int)):
            object.__setattr__(self, name, kind(getattr(self, name)))  # numpy scalars -> plain Python
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logprob_token_ids", tuple(int(t) for t in self.logprob_token_ids))
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        if self.logprob_token_ids and self.logprobs is None:
            object.__setattr__(self, "logprobs", 0)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None or self.prompt_logprobs is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_generation_defaults(cls, defaults: GenerationDefaults, **overrides: Any) -> SamplingParams:
        """The model's suggested settings (generation_config.json), with `overrides` taking precedence.

        do_sample False means greedy (temperature 0), as in transformers; an unset do_sample does not (as
        in vLLM, which reads only temperature, top_p, top_k and max_new_tokens). eos_token_ids is not a
        sampling setting: the engine stops on the model's EOS ids unless ignore_eos.
        """
        suggested = {"temperature": defaults.temperature, "top_p": defaults.top_p, "top_k": defaults.top_k,
                     "max_tokens": defaults.max_new_tokens}
        if defaults.do_sample is False:
            suggested["temperature"] = 0.0
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise InvalidSamplingParams(f"unknown sampling parameter(s): {', '.join(unknown)}")
        settings = {name: value for name, value in suggested.items() if value is not None}
        return cls(**{**settings, **overrides})


def _check(ok: bool, name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise InvalidSamplingParams(f"{name} must be {allowed}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple))
