"""What the engine reports for a request after each step (vLLM's RequestOutput): its tokens so far, what the
step added, whether and why it finished; text, timings and logprobs computed only when read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tinyvllm.engine.metrics import RequestMetrics

TokenLogprobs = dict[int, float]  # the token's own logprob first, then the top-n, then any requested ids


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    _token_ids: list[int] | Callable[[], list[int]] = field(repr=False)  # every output token so far
    new_token_ids: list[int] = field(default_factory=list)   # what this step added (streaming)
    finished: bool = False
    finish_reason: str | None = None      # "stop" | "length" | "error" | "abort"
    error: str | None = None
    _text: str | None = field(default=None, repr=False)
    _detokenize: Callable[[list[int]], str] | None = field(default=None, repr=False, compare=False)
    _metrics: Callable[[], RequestMetrics] | RequestMetrics | None = field(default=None, repr=False, compare=False)
    _logprobs: Callable[[], list[TokenLogprobs]] | list[TokenLogprobs] | None = field(default=None, repr=False)
    _prompt_logprobs: Callable[[], list] | list | None = field(default=None, repr=False)

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        """With SamplingParams.logprobs: one {token id: logprob} per output token (aligned with token_ids):
        the token's own, then the top-n, then logprob_token_ids'. None when not asked for."""
        if callable(self._logprobs):
            self._logprobs = self._logprobs()
        return self._logprobs

    @property
    def prompt_logprobs(self) -> list[TokenLogprobs | None] | None:
        """With SamplingParams.prompt_logprobs: one entry per prompt token (None for the first, and for
        positions not computed yet), each the token's own logprob then the top-n."""
        if callable(self._prompt_logprobs):
            self._prompt_logprobs = self._prompt_logprobs()
        return self._prompt_logprobs

    @property
    def token_ids(self) -> list[int]:
        """Every output token as of this output's step; copied when first asked for (copying each growing
        output of a large batch at every step is O(output length) each)."""
        if callable(self._token_ids):
            self._token_ids = self._token_ids()
        return self._token_ids

    @property
    def metrics(self) -> RequestMetrics | None:
        """Timings as of this output's step; computed when first asked for (a step of a large batch would
        otherwise rebuild every request's inter-token latencies, O(output length) each)."""
        if callable(self._metrics):
            self._metrics = self._metrics()
        return self._metrics

    @property
    def text(self) -> str:
        """The decoded output, special tokens and stop strings removed; decoded when first asked for, so
        serving many requests does not re-decode every growing output at every step."""
        if self._text is None:
            self._text = self._detokenize(self.token_ids) if self._detokenize and self.token_ids else ""
        return self._text
