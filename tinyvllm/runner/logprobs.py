"""Log-probabilities for the requests that ask for them (SamplingParams.logprobs / prompt_logprobs /
logprob_token_ids): which logits rows a step computes, and the per-token {token id: logprob} dicts.

A step's logits rows are, for each scheduled sequence in order: with prompt_logprobs, one row per prompt
position p of its chunk below the last prompt token (the row at p predicts prompt token p + 1); then, if
it samples, its last token's row (what the sampler reads). Log-probabilities come from the raw logits
(before temperature, top-k / top-p or min_tokens' suppression) through two kernels: each row's log-sum-exp
and a gather of logits[row, token] - lse[row]; the top-n candidates are picked on the host from a copy of
just the rows that ask for them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels_numba.common import cuda
from kernels_numba.embedding import take_rows
from kernels_numba.logprobs import gather_logprobs, logsumexp

from tinyvllm.engine.outputs import TokenLogprobs


@dataclass
class PromptTarget:
    row: int          # logits row
    request: object   # the engine's Request (tinyvllm/engine/request.py)
    position: int     # the prompt position whose token this row predicts


@dataclass
class LogitsPlan:
    rows: list[int] = field(default_factory=list)          # token index of each logits row
    sample_rows: list[int] = field(default_factory=list)   # logits row of each sampling sequence, in order
    prompt_targets: list[PromptTarget] = field(default_factory=list)

    def add_chunk(self, request, first_token: int, start: int, end: int, num_prompt_tokens: int, samples: bool):
        """One scheduled sequence whose chunk [start, end) sits at token index first_token of the step."""
        if request.params.prompt_logprobs is not None:
            for position in range(max(start, 0), min(end, num_prompt_tokens - 1)):
                self.prompt_targets.append(PromptTarget(len(self.rows), request, position + 1))
                self.rows.append(first_token + position - start)
        if samples:
            self.sample_rows.append(len(self.rows))
            self.rows.append(first_token + end - start - 1)

    def sampler_logits(self, logits, wants_logprobs: bool):
        """The rows the sampler reads; a copy whenever logprobs will be read from `logits` afterwards
        (min_tokens suppresses stop tokens in place)."""
        if not wants_logprobs and len(self.sample_rows) == len(self.rows):
            return logits
        return take_rows(logits, cuda.to_device(np.array(self.sample_rows, np.int32)))


def record_logprobs(logits, plan: LogitsPlan, sampled: list[tuple[object, int]]) -> None:
    """Append each sampling request's new token's logprobs and fill the prompt logprobs this step computed.
    `sampled`: (request, new token) per sampling sequence, aligned with plan.sample_rows."""
    wanted = []  # (request, row, own token, top-n, extra ids, where the dict goes)
    for (request, token), row in zip(sampled, plan.sample_rows):
        p = request.params
        if p.logprobs is not None:
            wanted.append((row, token, p.logprobs, p.logprob_token_ids, request.logprobs.append))
    for t in plan.prompt_targets:
        ids = t.request.prompt_token_ids
        wanted.append((t.row, ids[t.position], t.request.params.prompt_logprobs, (),
                       _setter(t.request.prompt_logprobs, t.position)))
    if not wanted:
        return
    lse = logsumexp(logits)
    top_ids = _top_ids(logits, {row: n for row, _, n, _, _ in wanted if n > 0})
    token_lists = [[token, *top_ids.get(row, []), *extra] for row, token, n, extra, _ in wanted]
    rows = np.repeat(np.array([w[0] for w in wanted], np.int32), [len(t) for t in token_lists])
    tokens = np.array([t for ts in token_lists for t in ts], np.int32)
    values = gather_logprobs(logits, lse, cuda.to_device(rows), cuda.to_device(tokens)).copy_to_host()
    offset = 0
    for (_, _, _, _, put), ts in zip(wanted, token_lists):
        entry: TokenLogprobs = {}
        for token, value in zip(ts, values[offset:offset + len(ts)].tolist()):
            entry.setdefault(int(token), value)
        offset += len(ts)
        put(entry)


def _top_ids(logits, top_n: dict[int, int], rows_per_copy: int = 256) -> dict[int, list[int]]:
    """{logits row: its top-n ids}, from host copies of those rows only, a bounded number at a time (a long
    prompt's rows of a 128k vocabulary would otherwise be gigabytes)."""
    rows = sorted(top_n)
    found = {}
    for i in range(0, len(rows), rows_per_copy):
        part = rows[i:i + rows_per_copy]
        host = take_rows(logits, cuda.to_device(np.array(part, np.int32))).copy_to_host()
        found.update({row: _top_n(values, top_n[row]) for row, values in zip(part, host)})
    return found


def _top_n(row: np.ndarray, n: int) -> list[int]:
    """The n largest entries' ids, largest first, ties to the lower id (NaN ranks last)."""
    n = min(n, len(row))
    keys = np.where(np.isnan(row), -np.inf, row)
    candidates = np.argpartition(-keys, n - 1)[:n]
    return sorted(candidates.tolist(), key=lambda i: (-keys[i], i))


def _setter(values: list, index: int):
    def put(entry):
        values[index] = entry
    return put
