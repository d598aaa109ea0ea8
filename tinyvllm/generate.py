"""Greedy generation for a list of prompts, in static batches over the contiguous KV cache.

Each batch: one prefill forward over all its prompts (tokens flattened), then one decode forward per
step with one token per unfinished sequence. A sequence stops at an EOS id or at its token limit.
A prompt that cannot run (empty, unknown token ids, longer than the context) gets an error in its
result; the others run normally.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from kernels_numba.sampling import argmax

from .model import LoadedModel
from .model_runner import ForwardBatch


@dataclass
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None   # "stop" (EOS), "length" (token limit) or "error"
    error: str | None = None


@dataclass
class _Running:
    index: int
    slot: int
    completion: Completion
    max_new_tokens: int

    @property
    def length(self) -> int:
        return len(self.completion.prompt_token_ids) + len(self.completion.token_ids)


def validate_prompt(prompt_ids: Sequence[int], vocab_size: int, max_seq_len: int) -> str | None:
    """Why this prompt cannot run, or None."""
    if len(prompt_ids) == 0:
        return "empty prompt"
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        return f"token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
    if len(prompt_ids) >= max_seq_len:
        return (f"prompt has {len(prompt_ids)} tokens but the context holds {max_seq_len} "
                f"(prompt + at least one new token); raise --max-model-len or shorten it")
    return None


def generate_greedy(model: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    stop_on_eos: bool = True,
                    on_token: Callable[[int, int], None] | None = None) -> list[Completion]:
    """Greedy continuations of token-id prompts. `on_token(prompt_index, token_id)` streams tokens."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    completions = [Completion(list(map(int, p))) for p in prompts]
    runnable = []
    for i, c in enumerate(completions):
        c.error = validate_prompt(c.prompt_token_ids, model.config.vocab_size, model.max_seq_len)
        if c.error:
            c.finish_reason = "error"
        else:
            runnable.append(i)
    eos = set(model.config.eos_token_ids) if stop_on_eos else set()
    batch_size = model.runner.kv_cache.max_seqs
    for start in range(0, len(runnable), batch_size):
        _run_static_batch(model, completions, runnable[start:start + batch_size], max_new_tokens, eos, on_token)
    for c in completions:
        c.text = model.tokenizer.decode(c.token_ids) if c.token_ids else ""
    return completions


def _run_static_batch(model, completions, indices, max_new_tokens, eos, on_token):
    kv = model.runner.kv_cache
    running = [_Running(i, kv.allocate_slot(), completions[i],
                        min(max_new_tokens, model.max_seq_len - len(completions[i].prompt_token_ids)))
               for i in indices]
    try:
        batch = _prefill_batch(running)
        while running:
            logits = model.runner.forward(batch)
            next_ids = argmax(logits).copy_to_host()
            still_running = []
            for seq, token in zip(running, next_ids.tolist()):
                seq.completion.token_ids.append(token)
                if on_token:
                    on_token(seq.index, token)
                if token in eos:
                    seq.completion.finish_reason = "stop"
                elif len(seq.completion.token_ids) >= seq.max_new_tokens:
                    seq.completion.finish_reason = "length"
                else:
                    still_running.append(seq)
                    continue
                kv.free_slot(seq.slot)
            running = still_running
            batch = _decode_batch(running) if running else None
    finally:  # on an exception, give back the slots of the sequences still holding one
        for seq in running:
            if seq.completion.finish_reason is None:
                kv.free_slot(seq.slot)


def _prefill_batch(running: list[_Running]) -> ForwardBatch:
    prompts = [s.completion.prompt_token_ids for s in running]
    lengths = np.array([len(p) for p in prompts])
    return ForwardBatch(
        token_ids=np.concatenate(prompts),
        positions=np.concatenate([np.arange(n) for n in lengths]),
        seq_slots=np.repeat([s.slot for s in running], lengths),
        logits_rows=np.cumsum(lengths) - 1,
    )


def _decode_batch(running: list[_Running]) -> ForwardBatch:
    return ForwardBatch(
        token_ids=np.array([s.completion.token_ids[-1] for s in running]),
        positions=np.array([s.length - 1 for s in running]),
        seq_slots=np.array([s.slot for s in running]),
        logits_rows=np.arange(len(running)),
    )
