"""Scheduler: token budget, chunked prefill, mixed decode + prefill, preemption, static batching.

`run_engine` is a fake engine: the "model" writes each computed token into a fake paged KV pool at the
slot the block table gives, checks that every token it attends to is in the pool where the block table
says (so a wrong block table or a bad prefix-cache hit shows up), and samples token 1.
"""
import numpy as np
import pytest

from tinyvllm.engine.block_manager import BlockManager
from tinyvllm.engine.scheduler import Scheduler, SchedulerConfig
from tinyvllm.engine.sequence import Sequence, SequenceStatus

SAMPLED = 1


def make_scheduler(num_blocks, block_size=4, **config):
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size))


def fake_step(scheduler, out, pool):
    """Write the new tokens' 'K/V' (the token id itself) to the pool, check the context, sample."""
    bm = scheduler.block_manager
    for s in out.scheduled:
        for p in range(s.start, s.end):
            pool[bm.slot(s.seq, p)] = s.seq.token_ids[p]
        context = [pool[bm.slot(s.seq, p)] for p in range(s.end)]
        assert context == s.seq.token_ids[:s.end], f"seq {s.seq.seq_id} reads the wrong KV"
    return {s.seq.seq_id: SAMPLED for s in out.scheduled if s.samples}


def run_engine(scheduler, seqs, max_steps=500):
    """Schedule -> fake model -> update -> finish at max_tokens, until every sequence is done."""
    bm = scheduler.block_manager
    pool = np.full(bm.num_blocks * bm.block_size, -1, dtype=np.int64)
    for seq in seqs:
        scheduler.add(seq)
    outputs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished:
            break
        running_before = list(scheduler.running)
        out = scheduler.schedule()
        if out.preempted:  # no admissions in a step that preempted (the victim would come right back)
            assert all(s.seq in running_before for s in out.scheduled)
        assert not out.is_empty or out.preempted, "a step with nothing to do and nothing preempted stalls"
        assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled)
        assert len(scheduler.running) <= scheduler.config.max_num_seqs
        scheduler.update(out, fake_step(scheduler, out, pool))
        for s in out.scheduled:
            if s.seq.num_output_tokens >= s.seq.max_tokens:
                scheduler.finish(s.seq)
        bm.check_invariants()
        outputs.append(out)
    assert not scheduler.has_unfinished, "did not finish within max_steps"
    for seq in seqs:
        assert seq.is_finished and seq.output_token_ids == [SAMPLED] * seq.max_tokens
        assert seq.num_tokens == seq.num_prompt_tokens + seq.max_tokens
    assert bm.num_free_blocks == bm.num_blocks
    return outputs


def test_token_budget_is_respected(rng):
    sched = make_scheduler(num_blocks=64, max_num_seqs=5, max_num_batched_tokens=13)
    seqs = [Sequence(i, list(rng.integers(0, 1000, size=int(rng.integers(3, 30)))), 4) for i in range(9)]
    outputs = run_engine(sched, seqs)
    assert max(o.num_batched_tokens for o in outputs) == 13  # the budget is reached, never passed
    assert all(o.num_batched_tokens <= 13 for o in outputs)


def test_chunked_prefill_splits_a_long_prompt():
    sched = make_scheduler(num_blocks=16, max_num_batched_tokens=8)
    seq = Sequence(0, list(range(100, 120)), max_tokens=2)  # 20 prompt tokens
    sched.add(seq)
    steps = []
    while sched.has_unfinished:
        out = sched.schedule()
        (s,) = out.scheduled
        steps.append((s.start, s.num_new_tokens, s.samples, seq.state))
        sched.update(out, {0: SAMPLED} if s.samples else {})
        if seq.num_output_tokens == seq.max_tokens:
            sched.finish(seq)
    assert steps == [(0, 8, False, "prefill"), (8, 8, False, "chunked"), (16, 4, True, "chunked"),
                     (20, 1, True, "decode")]


def test_decode_and_prefill_share_a_step():
    sched = make_scheduler(num_blocks=16, max_num_batched_tokens=16)
    a, b = Sequence(0, [1, 2, 3, 4, 5], 4), Sequence(1, list(range(10, 40)), 4)
    sched.add(a)
    out = sched.schedule()
    sched.update(out, {0: 7})
    sched.add(b)
    out = sched.schedule()
    assert [(s.seq.seq_id, s.start, s.num_new_tokens, s.samples) for s in out.scheduled] == \
        [(0, 5, 1, True), (1, 0, 15, False)]  # a's decode first, b's prefill gets the rest of the budget
    assert out.num_batched_tokens == 16


def test_preemption_by_recompute_when_blocks_run_out():
    # 5 blocks of 4: a and b take 2 each, a's decode takes the last free one, b's decode finds none.
    sched = make_scheduler(num_blocks=5, max_num_batched_tokens=64)
    a, b = Sequence(0, list(range(8)), 6), Sequence(1, list(range(50, 58)), 6)
    c = Sequence(2, list(range(90, 96)), 2)            # 6 tokens: needs 2 blocks, only 1 is free
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()                              # a, b prefill; c waits for blocks
    assert [s.seq.seq_id for s in out.scheduled] == [0, 1] and list(sched.waiting) == [c]
    sched.update(out, {0: SAMPLED, 1: SAMPLED})
    out = sched.schedule()
    assert [s.seq.seq_id for s in out.scheduled] == [0]
    assert out.preempted == [b]                         # b needed a block and is the last: it preempts itself
    assert list(sched.waiting) == [b, c] and sched.running == [a]
    assert b.status is SequenceStatus.WAITING and b.num_preemptions == 1 and b.block_table == []
    assert b.num_computed_tokens == 0 and b.state == "preempted" and b.output_token_ids == [SAMPLED]


def test_preemption_picks_the_most_recent_running_sequence():
    sched = make_scheduler(num_blocks=6, max_num_batched_tokens=64)
    a, b, c = (Sequence(i, list(range(100 * i, 100 * i + 8)), 4) for i in range(3))
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()                              # all three prefill 2 blocks each: pool full
    assert len(out.scheduled) == 3 and sched.block_manager.num_free_blocks == 0
    sched.update(out, {0: SAMPLED, 1: SAMPLED, 2: SAMPLED})
    out = sched.schedule()                              # a's decode needs a block: c (the last) goes
    assert out.preempted == [c] and [s.seq for s in out.scheduled] == [a, b]  # c's 2 blocks serve a, b
    assert list(sched.waiting) == [c] and sched.running == [a, b]
    assert c.num_preemptions == 1 and a.num_preemptions == b.num_preemptions == 0


def test_no_admission_in_a_step_that_preempted():
    # Without prefix caching b's 3 freed blocks leave 2 free after a's decode takes one; b's next chunk
    # (3 tokens) would fit them, but readmitting the victim at once would only thrash.
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=4),
                      BlockManager(5, block_size=4, enable_prefix_caching=False))
    a, b = Sequence(0, [1, 2, 3, 4], 8), Sequence(1, list(range(10, 22)), 4)
    outputs = run_engine(sched, [a, b])
    (step,) = [o for o in outputs if o.preempted]
    assert step.preempted == [b] and [s.seq for s in step.scheduled] == [a]


def test_all_sequences_finish_under_a_tiny_pool(rng):
    sched = make_scheduler(num_blocks=7, max_num_seqs=4, max_num_batched_tokens=10)
    shared = list(rng.integers(0, 1000, size=8))
    seqs = []
    for i in range(7):
        prompt = shared + list(rng.integers(0, 1000, size=int(rng.integers(1, 9))))
        seqs.append(Sequence(i, prompt, max_tokens=int(rng.integers(1, 12))))
    outputs = run_engine(sched, seqs)
    assert any(o.preempted for o in outputs), "the pool was meant to be too small for all at once"
    assert sched.block_manager.prefix_hit_rate > 0


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_simulated_engine_finishes_every_configuration(rng, chunked, batching):
    sched = make_scheduler(num_blocks=9, block_size=3, max_num_seqs=3, max_num_batched_tokens=11,
                           chunked_prefill=chunked, batching=batching)
    seqs = [Sequence(i, list(rng.integers(0, 50, size=int(rng.integers(1, 16)))), int(rng.integers(1, 9)))
            for i in range(8)]
    outputs = run_engine(sched, seqs)
    if not chunked:
        for o in outputs:  # a prompt runs whole: in one step, or alone when it exceeds the budget
            for s in o.scheduled:
                if s.start == 0:
                    assert s.samples
            assert o.num_batched_tokens <= 11 or len(o.scheduled) == 1


def test_static_batching_admits_only_when_nothing_runs():
    sched = make_scheduler(num_blocks=32, max_num_seqs=2, batching="static")
    a, b, c = Sequence(0, [1, 2, 3], 1), Sequence(1, [4, 5, 6], 3), Sequence(2, [7, 8], 1)
    outputs = run_engine(sched, [a, b, c])
    admitted_c = next(i for i, o in enumerate(outputs) if any(s.seq is c for s in o.scheduled))
    last_b = max(i for i, o in enumerate(outputs) if any(s.seq is b for s in o.scheduled))
    assert last_b == 2 and admitted_c == 3  # c waited for b although a's seat freed after step 0

    cont = make_scheduler(num_blocks=32, max_num_seqs=2)
    a, b, c = Sequence(0, [1, 2, 3], 1), Sequence(1, [4, 5, 6], 3), Sequence(2, [7, 8], 1)
    outputs = run_engine(cont, [a, b, c])
    assert any(s.seq is c for s in outputs[1].scheduled)  # continuous: c takes a's seat at once


def test_a_static_batch_fills_to_max_num_seqs_over_several_budget_limited_steps():
    # a budget of 8 tokens holds one and a bit 6-token prompts per step: the batch of 3 forms over two
    # steps (its first member already decoding), then closes; the 4th prompt waits until all 3 finish
    sched = make_scheduler(num_blocks=64, max_num_seqs=3, max_num_batched_tokens=8, batching="static")
    seqs = [Sequence(i, [i + 1] * 6, 4) for i in range(4)]
    outputs = run_engine(sched, seqs)
    first_step = {seq.seq_id: next(i for i, o in enumerate(outputs) if any(s.seq is seq for s in o.scheduled))
                  for seq in seqs}
    last_step = {seq.seq_id: max(i for i, o in enumerate(outputs) if any(s.seq is seq for s in o.scheduled))
                 for seq in seqs}
    assert sorted(first_step[i] for i in range(3)) == [0, 0, 1] and first_step[2] < last_step[0]
    assert first_step[3] > max(last_step[i] for i in range(3))
    assert all(seq.num_output_tokens == 4 for seq in seqs)


def test_without_chunked_prefill_a_prompt_waits_for_budget():
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=8, chunked_prefill=False)
    a, b = Sequence(0, [1, 2, 3, 4, 5], 3), Sequence(1, [6, 7, 8, 9], 3)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == [a]        # b (4 tokens) does not fit the 3 left
    sched.update(out, {0: SAMPLED})
    out = sched.schedule()
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 4)]


def test_without_chunked_prefill_an_oversized_prompt_runs_alone():
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=8, chunked_prefill=False)
    small, big, after = Sequence(0, [1, 2], 2), Sequence(1, list(range(20)), 1), Sequence(2, [3, 4], 1)
    outputs = run_engine(sched, [small, big, after])
    assert [[(s.seq.seq_id, s.num_new_tokens) for s in o.scheduled] for o in outputs] == [
        [(0, 2)],     # big (20 > budget 8) cannot share a step ...
        [(0, 1)],     # ... not even with a decode
        [(1, 20)],    # so it runs alone once nothing else is scheduled
        [(2, 2)]]


def test_requests_that_can_never_fit_raise():
    sched = make_scheduler(num_blocks=4, block_size=4)      # 16 tokens of KV cache
    with pytest.raises(ValueError, match="prompt of 17 tokens"):
        sched.add(Sequence(0, list(range(17)), 1))
    with pytest.raises(ValueError, match="max_tokens"):
        sched.add(Sequence(1, list(range(10)), 8))          # 10 + 8 - 1 = 17 tokens to cache
    sched.add(Sequence(2, list(range(10)), 7))               # 16: fits exactly
    assert sched.num_waiting == 1
    run_engine(sched, [])


def test_finish_of_a_waiting_request_aborts_it():
    sched = make_scheduler(num_blocks=8)
    a = Sequence(0, [1, 2, 3], 2)
    sched.add(a)
    sched.finish(a)
    assert a.is_finished and not sched.has_unfinished
