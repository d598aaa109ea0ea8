"""Decides, each step, which sequences run and how many tokens each computes.

Running sequences go first (a decode is one token; an unfinished chunked prefill takes what is left of
the token budget). When the KV pool runs out, the most recently added running sequence is preempted by
recompute: its blocks are freed and it goes back to the front of the waiting queue. Then, if nothing was
preempted, waiting sequences are admitted in order while seats and budget remain.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tinyvllm.engine.block_manager import BlockManager
from tinyvllm.engine.scheduler_output import ScheduledSeq, SchedulerOutput
from tinyvllm.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512   # token budget per step
    chunked_prefill: bool = True
    batching: str = "continuous"        # "continuous" | "static" (a batch of up to max_num_seqs runs to
    #                                     completion before the next is admitted)

    def __post_init__(self):
        assert self.max_num_seqs > 0 and self.max_num_batched_tokens > 0
        assert self.batching in ("continuous", "static"), self.batching


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # static batching: a batch takes in sequences (over as many steps as the token budget needs for
        # their prompts) until it holds max_num_seqs, the queue is empty or KV blocks run out; then it is
        # closed and runs to completion before the next one forms
        self._static_batch_open = True

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        bm = self.block_manager
        capacity = bm.num_blocks * bm.block_size
        if seq.num_prompt_tokens > capacity:
            raise ValueError(f"prompt of {seq.num_prompt_tokens} tokens exceeds the KV cache "
                             f"({capacity} tokens)")
        # The last sampled token is never fed back, so the cache holds at most prompt + max_tokens - 1.
        if seq.num_prompt_tokens + seq.max_tokens - 1 > capacity:
            raise ValueError(f"prompt of {seq.num_prompt_tokens} tokens + max_tokens {seq.max_tokens} "
                             f"can never fit the KV cache ({capacity} tokens); lower max_tokens")
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Sequence] = []
        batch_in_flight = bool(self.running)

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            remaining = seq.num_tokens - seq.num_computed_tokens
            assert remaining > 0, "update() must append the sampled token before the next step"
            num_new = min(remaining, budget)
            while not self.block_manager.allocate(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            i += 1

        static = self.config.batching == "static"
        if static and not batch_in_flight:
            self._static_batch_open = True
        may_admit = not preempted and (not static or self._static_batch_open)
        while may_admit and self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not seq.skip_prefix_cache:
                self.block_manager.lookup_prefix(seq)
            num_new = self._admission_tokens(seq, budget, batch_empty=not scheduled)
            if num_new == 0 or not self.block_manager.allocate(seq, num_new):
                self._undo_lookup(seq)
                if num_new > 0:  # out of KV blocks, not of this step's budget
                    self._static_batch_open = False
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget = max(0, budget - num_new)

        if static and (preempted or not self.waiting or len(self.running) >= self.config.max_num_seqs):
            self._static_batch_open = False
        return SchedulerOutput(scheduled, preempted, sum(s.num_new_tokens for s in scheduled))

    def _admission_tokens(self, seq: Sequence, budget: int, batch_empty: bool) -> int:
        """Tokens a waiting sequence computes in its first step, 0 if it must wait."""
        remaining = seq.num_tokens - seq.num_computed_tokens  # a preempted one recomputes its output too
        if self.config.chunked_prefill or remaining <= budget:
            return min(remaining, budget)
        # Without chunking a prompt must fit the budget left, unless no budget could ever hold it.
        if batch_empty and remaining > self.config.max_num_batched_tokens:
            return remaining
        return 0

    def _undo_lookup(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_cached_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        """Preempt by recompute: drop its KV blocks; it reruns prompt + generated tokens later."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_cached_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, output: SchedulerOutput, sampled: dict[int, int]) -> None:
        """After a step: advance each scheduled seq, append its sampled token, commit full blocks.

        `sampled` maps seq_id -> token id for exactly the scheduled seqs whose `samples` is True."""
        for s in output.scheduled:
            seq = s.seq
            assert seq.status is SequenceStatus.RUNNING and seq.num_computed_tokens == s.start
            assert (seq.seq_id in sampled) == s.samples, seq.seq_id
            seq.num_computed_tokens = s.end
            if s.samples:
                seq.token_ids.append(sampled[seq.seq_id])
            self.block_manager.commit(seq)

    def finish(self, seq: Sequence) -> None:
        """Mark seq finished (or aborted, if still waiting) and release its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)

    def fill_placeholders(self, output: SchedulerOutput, sampled: dict[int, int], placeholder: int) -> None:
        """Write each sequence's sampled token over the `placeholder` an earlier `update` appended for it: a
        pipelined decode step is scheduled before the tokens of the step in flight are read."""
        for s in output.scheduled:
            assert s.seq.token_ids[-1] == placeholder, s.seq.seq_id
            s.seq.token_ids[-1] = sampled[s.seq.seq_id]
