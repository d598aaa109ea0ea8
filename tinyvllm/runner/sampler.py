"""The sampler: one new token for each sequence a step samples, from its logits row, and the logprobs asked for.

Per sampling sequence, in batch order: while it has fewer than min_tokens output tokens its stop tokens are
suppressed (their logits set to -inf, kernels_numba.sampling.suppress_tokens); then greedy rows (temperature 0)
take the argmax, the others a draw with temperature, top-k and top-p from the request's seed and its output
length (kernels_numba.sampling.sample: reproducible per request, whatever else runs in the batch).
Logprobs come from the raw logits, before suppression or temperature (logprobs.record_logprobs).
"""
from __future__ import annotations

import numpy as np

from kernels_numba.common import cuda
from kernels_numba.sampling import argmax, sample, suppress_tokens

from tinyvllm.engine.scheduler_output import SchedulerOutput
from tinyvllm.engine.sequence import Sequence
from tinyvllm.runner.logprobs import LogitsPlan, record_logprobs


def sample_step(logits, plan: LogitsPlan, schedule: SchedulerOutput, greedy_ids=None) -> dict[int, int]:
    """seq_id -> new token for each sequence of the step that samples, its logprobs (if asked for) recorded on
    its request. `logits`: the step's logits rows (plan.rows); `greedy_ids`: their argmax if the step computed
    it already (a decode or prefill graph does), used where the sampler reads those same rows."""
    sampling = schedule.sampling_seqs
    wants_logprobs = any(s.seq.data.params.wants_logprobs for s in schedule.scheduled)
    tokens = []
    if sampling:
        sampler_logits = plan.sampler_logits(logits, wants_logprobs)
        tokens = next_tokens(sampler_logits, sampling, greedy_ids if sampler_logits is logits else None)
    if wants_logprobs:
        record_logprobs(logits, plan, [(seq.data, t) for seq, t in zip(sampling, tokens)])
    return {seq.seq_id: t for seq, t in zip(sampling, tokens)}


def next_tokens(logits, seqs: list[Sequence], greedy_ids=None) -> list[int]:
    """The next token of each row; `greedy_ids`: the rows' argmax if already computed (valid only while no
    token is suppressed)."""
    params = [seq.data.params for seq in seqs]
    suppressed_rows, suppressed_ids = [], []
    for row, (seq, p) in enumerate(zip(seqs, params)):
        if seq.num_output_tokens < p.min_tokens:  # stop tokens may not end it yet
            stop_ids = seq.data.stop_token_ids
            suppressed_rows += [row] * len(stop_ids)
            suppressed_ids += sorted(stop_ids)
    if suppressed_rows:
        suppress_tokens(logits, cuda.to_device(np.array(suppressed_rows, np.int32)),
                        cuda.to_device(np.array(suppressed_ids, np.int32)))
        greedy_ids = None  # computed before the suppression
    if all(p.temperature == 0 for p in params):  # sample's T = 0 rows are argmax's answer: skip its inputs
        return (argmax(logits) if greedy_ids is None else greedy_ids).copy_to_host().tolist()
    ids = sample(logits,
                 cuda.to_device(np.array([p.temperature for p in params], np.float32)),
                 cuda.to_device(np.array([p.top_k for p in params], np.int32)),
                 cuda.to_device(np.array([p.top_p for p in params], np.float32)),
                 cuda.to_device(np.array([seq.data.seed for seq in seqs], np.uint64)),
                 cuda.to_device(np.array([seq.num_output_tokens for seq in seqs], np.int32)))
    return ids.copy_to_host().tolist()


def always_argmax(schedule: SchedulerOutput) -> bool:
    """Whether every row of the step samples and is sure to take its argmax: greedy, no logprobs, min_tokens
    reached (no stop token suppressed). Such a step needs nothing but the argmax a decode graph computes."""
    return all(s.samples and s.seq.data.params.temperature == 0 and not s.seq.data.params.wants_logprobs
               and s.seq.num_output_tokens >= s.seq.data.params.min_tokens for s in schedule.scheduled)
