"""`LLM`: the offline API. `LLM(model_dir).generate(prompts, SamplingParams(...))` -> one output per prompt.

A prompt is text, a list of token ids, or a chat conversation (a list of {"role", "content"} dicts,
rendered with the model's chat template); `generate` takes one prompt or a list of them.
"""
from __future__ import annotations

from pathlib import Path

from tinyvllm.engine.engine import EngineConfig, LLMEngine, RequestOutput
from tinyvllm.engine.metrics import MetricsSummary
from tinyvllm.log import log_to_stderr
from tinyvllm.engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | Path | None = None, log=log_to_stderr, **engine_options):
        """`model`: a HF Llama model directory or a .gguf file (default: the demo model). `engine_options`: EngineConfig
        fields (max_num_seqs, max_num_batched_tokens, block_size, num_blocks, max_model_len, ...)."""
        self.engine = LLMEngine(model, EngineConfig(**engine_options), log=log)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 on_output=None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; a prompt that cannot run has `error` set."""
        return self.engine.generate(_as_prompt_list(prompts), sampling_params, on_output=on_output)

    def chat(self, conversations, sampling_params=None, on_output=None) -> list[RequestOutput]:
        """`conversations`: one conversation (list of messages) or a list of them."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        return self.engine.generate(list(conversations), sampling_params, on_output=on_output)

    def metrics(self) -> MetricsSummary:
        return self.engine.metrics.summary()


def _as_prompt_list(prompts) -> list:
    """A single prompt (text, token ids, a conversation) becomes a list of one."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts:
        first = prompts[0]
        if isinstance(first, dict) or isinstance(first, int) or hasattr(first, "__index__"):
            return [list(prompts)]
    return list(prompts)
