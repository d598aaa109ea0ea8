"""Without chunked prefill, a prompt exactly as long as the step's token budget is scheduled (issue 26's
mutation audit, survivor 8): it fits, so it must run whole, not wait for a budget that is never larger.

Each loop is bounded by a step count, so a scheduler that never admits the prompt fails instead of hanging.
"""
from tinyvllm.engine.block_manager import BlockManager
from tinyvllm.engine.scheduler import Scheduler, SchedulerConfig
from tinyvllm.engine.sequence import Sequence

BUDGET = 8
SAMPLED = 1


def _scheduler(**config) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=BUDGET, chunked_prefill=False, **config),
                     BlockManager(num_blocks=32, block_size=4))


def _run(scheduler: Scheduler, max_steps: int) -> list[list[tuple[int, int]]]:
    """Schedule and finish at max_tokens, at most max_steps steps; per step [(seq_id, num_new_tokens)]."""
    steps = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished:
            break
        out = scheduler.schedule()
        steps.append([(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled])
        scheduler.update(out, {s.seq.seq_id: SAMPLED for s in out.scheduled if s.samples})
        for s in out.scheduled:
            if s.seq.num_output_tokens >= s.seq.max_tokens:
                scheduler.finish(s.seq)
    return steps


def test_a_prompt_exactly_the_budget_runs_whole_in_the_first_step():
    scheduler = _scheduler()
    seq = Sequence(0, list(range(100, 100 + BUDGET)), max_tokens=3)
    scheduler.add(seq)
    steps = _run(scheduler, max_steps=10)
    # step 1: the whole 8-token prompt (it fits the 8-token budget exactly), then one decode per token left
    assert steps == [[(0, BUDGET)], [(0, 1)], [(0, 1)]]
    assert not scheduler.has_unfinished and seq.output_token_ids == [SAMPLED] * 3


def test_a_prompt_exactly_the_budget_left_joins_the_running_decode():
    """One sequence decoding (1 token) leaves BUDGET - 1; a prompt of exactly that many is admitted in the
    same step."""
    scheduler = _scheduler()
    first = Sequence(0, list(range(100, 102)), max_tokens=4)
    scheduler.add(first)
    steps = _run(scheduler, max_steps=1)                 # the 2-token prompt: first now decodes
    second = Sequence(1, list(range(200, 200 + BUDGET - 1)), max_tokens=1)
    scheduler.add(second)
    steps += _run(scheduler, max_steps=10)
    assert steps == [[(0, 2)], [(0, 1), (1, BUDGET - 1)], [(0, 1)], [(0, 1)]]
    assert not scheduler.has_unfinished


def test_engine_without_chunking_finishes_a_prompt_exactly_the_budget():
    """The same through LLMEngine on the demo model, in a bounded number of steps (the loop the server
    runs would otherwise spin forever on an empty step)."""
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams
    from tinyvllm.model.loader import load_model

    model = load_model(log=lambda message: None)
    prompt = model.tokenizer.encode("A small dog ran along the river")
    engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=4, chunked_prefill=False,
                                           max_num_batched_tokens=len(prompt)), log=lambda message: None)
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    finished = []
    for _ in range(5):   # one prefill step, one decode step; five is generous
        if not engine.has_unfinished_requests():
            break
        finished += [o for o in engine.step() if o.finished]
    assert not engine.has_unfinished_requests(), "the prompt was never scheduled"
    (output,) = finished
    assert (len(output.token_ids), output.finish_reason) == (2, "length")
