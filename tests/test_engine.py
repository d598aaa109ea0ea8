"""The serving engine's invariants on the demo model, in the simulator.

Whatever the batching, the pool size, the prefix cache or the chunking, greedy outputs are the same as
running each request alone: the scheduler may only change *when* tokens are computed, never *what*.
"""
import numpy as np
import pytest

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import InvalidSamplingParams, SamplingParams
from tinyvllm.runner.inputs import build_inputs

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
PROMPTS = ["The sun rose", "A small dog ran along the river", "Water", "The old library had"]


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def engine(model, **options) -> LLMEngine:
    options.setdefault("num_blocks", 64)
    options.setdefault("block_size", 4)
    return LLMEngine(model, EngineConfig(**options), log=lambda message: None)


@pytest.fixture(scope="module")
def alone(model):
    """Each prompt's greedy tokens when it runs by itself: the reference for every invariant."""
    return [engine(model).generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.slow  # engine-level: many demo-model generations
def test_batched_equals_alone_and_streams_add_up(model, alone):
    e = engine(model)
    streamed = {}
    outputs = e.generate(PROMPTS, GREEDY, on_output=lambda o: streamed.setdefault(o.request_id, []).extend(o.new_token_ids))
    assert [o.token_ids for o in outputs] == alone
    assert all(len(o.token_ids) == 3 and o.finish_reason == "length" for o in outputs)
    assert [streamed[o.request_id] for o in outputs] == alone
    assert all(o.text == model.tokenizer.decode(o.token_ids) for o in outputs)
    assert e.block_manager.num_free_blocks == 64


@pytest.mark.slow  # engine-level: many demo-model generations
def test_a_pool_too_small_for_all_forces_preemption_with_identical_outputs(model, alone):
    # 4 prompts of up to 10 tokens + 3 new need 2-4 blocks of 4 each; 6 blocks cannot hold them all.
    e = engine(model, num_blocks=6, enable_prefix_caching=False)
    outputs = e.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outputs] == alone
    assert sum(r.seq.num_preemptions for r in map(e.request, (o.request_id for o in outputs))) > 0


@pytest.mark.slow  # engine-level: many demo-model generations
def test_static_batching_and_no_chunking_give_identical_outputs(model, alone):
    e = engine(model, batching="static", max_num_seqs=2, chunked_prefill=False)
    assert [o.token_ids for o in e.generate(PROMPTS, GREEDY)] == alone


@pytest.mark.slow  # engine-level: many demo-model generations
def test_a_shared_prefix_hits_the_cache_with_identical_outputs(model):
    e = engine(model)
    prefix = model.tokenizer.encode("The old library had thousands of books, but")  # > 2 blocks of 4
    first = e.generate([prefix + [300]], GREEDY)[0]
    second = e.generate([prefix + [301]], GREEDY)[0]
    assert e.request(second.request_id).seq.num_cached_tokens >= 8
    assert e.block_manager.prefix_hit_rate > 0 and e.metrics.summary().prefix_hit_rate > 0
    assert second.token_ids == engine(model, enable_prefix_caching=False).generate([prefix + [301]], GREEDY)[0].token_ids
    assert first.token_ids == engine(model).generate([prefix + [300]], GREEDY)[0].token_ids


@pytest.mark.slow  # engine-level: many demo-model generations
def test_chunked_prefill_gives_the_same_logits_as_whole_prompt_prefill(model):
    prompt = model.tokenizer.encode("A small dog ran along the river, chasing birds")

    def last_logits(**options):
        e = engine(model, **options)
        e.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
        steps = 0
        while e.has_unfinished_requests():
            logits = [s for s in e.step_stages() if s.name == "logits"]
            steps += 1
            if logits and logits[0].output.shape[0] == 1:
                last = logits[0].to_host()
        return last, steps

    whole, whole_steps = last_logits()
    chunked, chunked_steps = last_logits(max_num_batched_tokens=4)
    assert whole_steps == 1 and chunked_steps == -(-len(prompt) // 4)
    # Same float32 operations per token in the same order; only the step they run in differs.
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)


def test_bad_requests_get_their_own_errors_and_the_others_finish(model, alone):
    e = engine(model, max_model_len=16)
    outputs = e.generate(["", PROMPTS[0], [model.config.vocab_size + 1], [5] * 16, PROMPTS[2]], GREEDY)
    assert [o.finish_reason for o in outputs] == ["error", "length", "error", "error", "length"]
    assert outputs[0].error == "empty prompt"
    assert "outside the vocabulary" in outputs[2].error
    assert "context holds 16" in outputs[3].error
    assert outputs[1].token_ids == alone[0] and outputs[4].token_ids == alone[2]


def test_a_request_that_can_never_fit_the_pool_is_rejected_alone(model, alone):
    e = engine(model, num_blocks=2)  # 8 tokens in all
    outputs = e.generate(["The old library had thousands of books", PROMPTS[2]], GREEDY)
    assert outputs[0].finish_reason == "error" and "KV cache" in outputs[0].error
    assert outputs[1].token_ids == alone[2]


def test_invalid_sampling_parameters_are_rejected_before_any_work():
    with pytest.raises(InvalidSamplingParams, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(InvalidSamplingParams, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(TinyVLLMError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)


@pytest.mark.slow  # engine-level: many demo-model generations
def test_seeded_sampling_repeats_and_stop_rules_apply(model):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=4, ignore_eos=True)
    a = engine(model).generate([PROMPTS[0], PROMPTS[2]], params)
    b = engine(model).generate([PROMPTS[2], PROMPTS[0]], params)  # other order, other batch rows
    assert a[0].token_ids == b[1].token_ids and a[1].token_ids == b[0].token_ids
    # A stop token id ends the request at that token; min_tokens holds it off.
    stop_at = a[0].token_ids[1]
    stopped = engine(model).generate([PROMPTS[0]], SamplingParams(
        temperature=1.0, top_p=0.9, seed=1234, max_tokens=4, ignore_eos=True, stop_token_ids=[stop_at]))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop_at
    assert len(stopped.token_ids) == a[0].token_ids.index(stop_at) + 1


def test_stop_strings_cut_the_text(model, alone):
    text = model.tokenizer.decode(alone[1])
    stop = text[len(text) // 2:][:2] or text
    out = engine(model).generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=3, stop=[stop],
                                                               ignore_eos=True))[0]
    assert out.finish_reason == "stop" and stop not in out.text and text.startswith(out.text)


@pytest.mark.slow  # engine-level: many demo-model generations
def test_llm_api_and_metrics(model):
    from tinyvllm.llm import LLM
    llm = LLM.__new__(LLM)
    llm.engine = engine(model)
    outputs = llm.generate(PROMPTS[:2], GREEDY)
    assert len(outputs) == 2 and all(o.finished for o in outputs)
    chat = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0, max_tokens=1))
    assert len(chat) == 1 and len(chat[0].token_ids) == 1
    summary = llm.metrics()
    assert summary.num_completed == 3 and summary.ttft.count == 3 and summary.output_throughput > 0
    assert all(m.ttft is not None and m.e2e >= m.ttft for m in summary.requests)


def test_requests_and_sequences_count_their_ids_apart(model):
    e = engine(model)
    ids = [e.add_request(p, GREEDY) for p in PROMPTS[:3]]
    assert ids == ["0", "1", "2"]
    assert [e.request(i).seq.seq_id for i in ids] == [0, 1, 2]
    assert e.add_request(PROMPTS[3], GREEDY, request_id="4") == "4"
    assert e.add_request(PROMPTS[3], GREEDY) == "3" and e.add_request(PROMPTS[3], GREEDY) == "5"  # 4 is taken


def test_batch_layout_is_each_chunk_at_its_positions_and_slots(model):
    """build_inputs lays out every scheduled chunk (prefill chunks, prefix-cache hits, decodes, mixed) as the
    per-sequence definition says: its tokens, positions start..end-1, its row, slot = table[p // bs] * bs +
    p % bs (BlockManager.slots); driven without kernels, the scheduler fed made-up tokens."""
    e = engine(model, max_num_batched_tokens=13, max_num_seqs=3, num_blocks=40)
    rng = np.random.default_rng(7)
    shared = rng.integers(3, 300, 9).tolist()
    for n in (11, 2, 17, 5):
        e.add_request(rng.integers(3, 300, n).tolist(), GREEDY)
    e.add_request(shared + [7, 8], GREEDY)
    e.add_request(shared + [9], GREEDY)  # the first one's full blocks: a prefix-cache hit once committed
    kinds = set()
    for _ in range(40):
        schedule = e.scheduler.schedule()
        if schedule.is_empty:
            break
        batch, plan = build_inputs(schedule, e.block_manager.block_size)
        tokens, positions, rows, slots = [], [], [], []
        for row, s in enumerate(schedule.scheduled):
            tokens += s.token_ids
            positions += range(s.start, s.end)
            rows += [row] * s.num_new_tokens
            slots += e.block_manager.slots(s.seq, s.start, s.end)
            kinds.add("decode" if s.num_new_tokens == 1 and s.start >= s.seq.num_prompt_tokens else
                      "cached start" if s.start > 0 and s.start == s.seq.num_cached_tokens else "prefill")
        assert batch.token_ids.tolist() == tokens and batch.positions.tolist() == positions
        assert batch.query_seq.tolist() == rows and batch.slot_mapping.tolist() == slots
        assert batch.logits_rows.tolist() == plan.rows
        sampled = {s.seq.seq_id: 5 for s in schedule.scheduled if s.samples}
        e.scheduler.update(schedule, sampled)
        for s in schedule.scheduled:
            if s.samples and s.seq.num_output_tokens >= 2:
                e.scheduler.finish(s.seq)
    assert kinds == {"decode", "cached start", "prefill"} and not e.scheduler.has_unfinished


def test_token_id_prompts_of_any_int_type_are_checked_alike(model):
    e = engine(model)
    vocab = model.config.vocab_size
    for prompt in ([1, -2, 3], np.array([1, -2, 3]), [np.int32(1), -2, 3]):
        e.add_request(prompt, GREEDY)
    e.add_request([5, vocab], GREEDY)
    outputs = [o for o in e.step() if o.finished]
    assert [o.error for o in outputs[:3]] == ["token ids outside the vocabulary [0, 640): [-2]"] * 3
    assert outputs[3].error == f"token ids outside the vocabulary [0, 640): [{vocab}]"
    assert e.prepare_prompt([4, 5, 6])[1] == [4, 5, 6] == e.prepare_prompt(np.array([4, 5, 6]))[1]
