"""A request's fields -> the engine's inputs (token ids, SamplingParams), checked: ApiError 400 names the field.

Shared by the HTTP routes and the JSONL loop, so both accept and reject the same things.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyvllm.engine.engine import InvalidPrompt, LLMEngine
from tinyvllm.engine.sampling_params import InvalidSamplingParams, SamplingParams
from tinyvllm.serving.protocol import ApiError, SamplingFields


@dataclass(frozen=True)
class RequestInputs:
    engine: LLMEngine

    @property
    def context_limit(self) -> int:
        """Most tokens one request (prompt + output) may hold: the model's context, or the whole KV pool
        (+1: the last sampled token is never written to the cache) if that is smaller."""
        bm = self.engine.block_manager
        return min(self.engine.max_model_len, bm.num_blocks * bm.block_size + 1)

    def prepare_prompt(self, prompt, param: str) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt (text, ids or chat messages); ApiError 400 naming `param`."""
        try:
            text, ids = self.engine.prepare_prompt(prompt)
        except InvalidPrompt as e:
            raise ApiError(400, f"{param}: {e}", param=param) from e
        if len(ids) >= self.context_limit:
            raise ApiError(400, f"{param}: the prompt has {len(ids)} tokens but at most {self.context_limit - 1} fit "
                                f"(context of {self.context_limit} tokens, prompt + at least one new token)",
                           param=param)
        return text, ids

    def sampling_params(self, body: SamplingFields, num_prompt_tokens: int, max_tokens: int | None,
                        max_tokens_param: str = "max_tokens", **extra) -> SamplingParams:
        """The request's SamplingParams: its own fields, the model's generation_config.json for those it
        leaves out (as vLLM does), and max_tokens defaulting to the room left in the context."""
        room = self.context_limit - num_prompt_tokens
        if max_tokens is None:
            suggested = self.engine.model.generation_defaults.max_new_tokens
            max_tokens = room if suggested is None else min(room, suggested)
        elif max_tokens > room:
            raise ApiError(400, f"{max_tokens_param} is {max_tokens} but the prompt's {num_prompt_tokens} tokens leave "
                                f"room for {room} in the context of {self.context_limit} tokens",
                           param=max_tokens_param)
        defaults = self.engine.default_params
        pick = lambda value, default: default if value is None else value
        stop = body.stop if body.stop is not None else ()
        fields = dict(temperature=pick(body.temperature, defaults.temperature), top_p=pick(body.top_p, defaults.top_p),
                      top_k=pick(body.top_k, defaults.top_k), seed=body.seed, max_tokens=max_tokens,
                      min_tokens=body.min_tokens, stop=(stop,) if isinstance(stop, str) else tuple(stop),
                      stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos, **extra)
        try:
            return SamplingParams(**fields)
        except InvalidSamplingParams as e:
            name = str(e).split(" ", 1)[0]
            param = max_tokens_param if name == "max_tokens" else name if name in fields else None
            raise ApiError(400, str(e).replace("max_tokens", max_tokens_param, 1) if param == max_tokens_param
                           else str(e), param=param) from e
