"""Generation on the demo model: batching, stopping, per-prompt errors, all through the one forward path."""
import dataclasses

import numpy as np
import pytest

from tinyvllm.generate import generate_greedy
from tinyvllm.model import load_model


@pytest.fixture(scope="module")
def model():
    return load_model(max_seqs=4, max_seq_len=12, log=lambda message: None)


def test_batched_greedy_equals_each_prompt_alone(model):
    prompts = [model.tokenizer.encode(p) for p in ("The sun rose", "A small dog ran", "Water")]
    assert len({len(p) for p in prompts}) == 3, "prompts of different lengths exercise the flattening"
    batched = generate_greedy(model, prompts, max_new_tokens=3)
    alone = [generate_greedy(model, [p], max_new_tokens=3)[0] for p in prompts]
    for b, a in zip(batched, alone):
        assert b.token_ids == a.token_ids and len(b.token_ids) == 3
        assert b.finish_reason == "length" and b.text == model.tokenizer.decode(b.token_ids)
    assert model.runner.kv_cache.free_slot_count == 4, "every KV slot is given back"


def test_stops_at_an_eos_id(model):
    prompt = model.tokenizer.encode("The sun rose")
    free_run = generate_greedy(model, [prompt], max_new_tokens=3)[0].token_ids
    # Declare the second greedy token an EOS id: generation must stop right there, keeping the id.
    stopping = dataclasses.replace(model, config=dataclasses.replace(model.config, eos_token_ids=(free_run[1],)))
    c = generate_greedy(stopping, [prompt], max_new_tokens=3)[0]
    assert c.token_ids == free_run[:2] and c.finish_reason == "stop"
    assert generate_greedy(stopping, [prompt], max_new_tokens=3, stop_on_eos=False)[0].token_ids == free_run


def test_bad_prompts_get_errors_and_the_others_still_run(model):
    good = model.tokenizer.encode("Water")
    too_long = [5] * model.max_seq_len
    results = generate_greedy(model, [[], good, too_long, [model.config.vocab_size + 7]], max_new_tokens=2)
    assert results[0].error == "empty prompt"
    assert results[1].error is None and len(results[1].token_ids) == 2
    assert "context holds 12" in results[2].error
    assert "outside the vocabulary" in results[3].error
    assert [r.finish_reason for r in results] == ["error", "length", "error", "error"]


def test_generation_stops_at_the_context_limit(model):
    prompt = [7] * (model.max_seq_len - 2)
    c = generate_greedy(model, [np.array(prompt)], max_new_tokens=10)[0]
    assert len(c.token_ids) == 2 and c.finish_reason == "length"
