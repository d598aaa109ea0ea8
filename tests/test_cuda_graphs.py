"""Decode steps replayed from captured graphs give exactly the eager engine's results.

In the simulator a replay re-runs the recorded forward pass over the same static buffers (there are no
real graphs), so this checks everything the GPU capture relies on: inputs refilled in place, batches
padded to a bucket with dummy rows that change nothing, every buffer handed back in order, and the
engine falling back to the eager path for steps with prefill chunks.
"""
import numpy as np
import pytest

from kernels_numba.common import BufferArena, device_empty, launching_into
from kernels_numba.embedding import FED_BACK
from kernels_numba.sampling import argmax_ref
from tinyvllm.runner.cuda_graphs import CapturedDecode, buckets_up_to
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.model.loader import load_model
from tinyvllm.runner.inputs import ForwardBatch
from tinyvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow  # engine-level: the demo model's graph recordings

PROMPTS = ["The sun rose", "A small dog ran along the river", "Water"]


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def engine(model, **options) -> LLMEngine:
    """An engine whose steps with prefill chunks run eagerly unless asked (test_prefill_graphs tests those)."""
    options = {"prefill_graphs": False, **options}
    return LLMEngine(model, EngineConfig(num_blocks=64, block_size=4, **options), log=lambda message: None)


def test_buckets_end_at_the_batch_limit():
    assert buckets_up_to(1) == (1,)
    assert buckets_up_to(6) == (1, 2, 4, 6)
    assert buckets_up_to(64)[-3:] == (32, 48, 64)


def test_graph_engine_matches_eager_engine_greedy_and_seeded(model):
    params = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, seed=7, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)]
    eager = engine(model, cuda_graphs=False).generate(PROMPTS, params)
    graphed_engine = engine(model, cuda_graphs=True, max_num_seqs=4)
    graphed = graphed_engine.generate(PROMPTS, params)
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    # 3 decodes ran padded to bucket 4, then 2 decodes in bucket 2 after the short request ended
    assert graphed_engine.runner.decode_graphs.captured_buckets == [2, 4]


def test_graph_engine_suppresses_stop_tokens_before_min_tokens(model):
    # The graph computes each row's argmax before any suppression; a step with a suppressed token must not
    # use it. Stop on the token greedy decoding picks third (a decode step), but only after 5 tokens.
    free = engine(model, cuda_graphs=False).generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=6,
                                                                                 ignore_eos=True))[0]
    stop = free.token_ids[2]
    assert stop not in free.token_ids[:2], "pick a prompt whose third greedy token is new"
    params = SamplingParams(temperature=0.0, max_tokens=6, min_tokens=5, stop_token_ids=[stop], ignore_eos=True)
    eager = engine(model, cuda_graphs=False).generate(PROMPTS[:1], params)[0]
    graphed = engine(model, cuda_graphs=True, max_num_seqs=1).generate(PROMPTS[:1], params)[0]
    assert graphed.token_ids == eager.token_ids
    assert stop not in eager.token_ids[:5]


def _count_pipelined_launches(engine_: LLMEngine) -> list:
    """Wrap the engine's pipelined graph launches; returns a list that gets each launched batch's token ids."""
    launched, launch = [], engine_.runner.decode_graphs.launch

    def counting(batch):
        launched.append(batch.token_ids.tolist())
        return launch(batch)
    engine_.runner.decode_graphs.launch = counting
    return launched


def test_pipelined_decode_matches_eager_with_stops_and_finishing_rows(model):
    # Greedy rows decode pipelined: step n + 1 is launched with FED_BACK ids before step n's tokens are read.
    # Rows end at different steps (length limits, and a stop token the pipeline only sees one step late, so
    # the token computed behind it must be dropped); each end changes the batch and stops the pipeline.
    free = engine(model, cuda_graphs=False).generate(PROMPTS[1:2], SamplingParams(temperature=0.0, max_tokens=9,
                                                                                  ignore_eos=True))[0]
    stop = free.token_ids[5]
    assert stop not in free.token_ids[:5], "pick a prompt whose sixth greedy token is new"
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=9, stop_token_ids=[stop], ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)]
    eager = engine(model, cuda_graphs=False).generate(PROMPTS, params)
    pipelined_engine = engine(model, cuda_graphs=True, max_num_seqs=4)
    launched = _count_pipelined_launches(pipelined_engine)
    pipelined = pipelined_engine.generate(PROMPTS, params)
    assert [o.token_ids for o in pipelined] == [o.token_ids for o in eager]
    assert [o.finish_reason for o in pipelined] == [o.finish_reason for o in eager] == ["length", "stop", "length"]
    assert len(pipelined[1].token_ids) == 6
    assert any(FED_BACK in ids for ids in launched), "no step was launched before its tokens were known"
    bm = pipelined_engine.block_manager
    bm.check_invariants()
    assert bm.num_free_blocks == bm.num_blocks  # the dropped token's blocks were freed with its sequence


def test_pipelined_decode_can_be_turned_off_and_abort_drops_the_in_flight_row(model):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    off = engine(model, cuda_graphs=True, max_num_seqs=2, pipeline_decode=False)
    launched_off = _count_pipelined_launches(off)
    outputs_off = off.generate(PROMPTS[:2], params)
    assert launched_off == [], "pipeline_decode=False still launched a step before reading the previous one"
    e = engine(model, cuda_graphs=True, max_num_seqs=2)
    launched = _count_pipelined_launches(e)
    ids = [e.add_request(p, params) for p in PROMPTS[:2]]
    outputs = []
    while len(launched) < 2:  # prefill, then a pipelined decode in flight and a second one behind it
        outputs += e.step()
    e.abort_request(ids[0])
    while e.has_unfinished_requests():
        outputs += e.step()
    final = {o.request_id: o for o in outputs if o.finished}
    assert final[ids[0]].finish_reason == "abort" and final[ids[1]].finish_reason == "length"
    eager = engine(model, cuda_graphs=False).generate(PROMPTS[1:2], params)[0].token_ids
    assert final[ids[1]].token_ids == outputs_off[1].token_ids == eager and len(eager) == 6
    assert FED_BACK not in e.request(ids[0]).seq.token_ids
    e.block_manager.check_invariants()
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks


def _decode_batch(rng, rows, block_size=4, blocks_per_seq=3):
    """`rows` decode queries at random positions with disjoint, shuffled blocks (KV contents are
    whatever the pool holds: both paths read the same pool)."""
    blocks = rng.permutation(40)[: rows * blocks_per_seq].reshape(rows, blocks_per_seq).astype(np.int32)
    positions = rng.integers(0, blocks_per_seq * block_size, rows).astype(np.int32)
    slots = blocks[np.arange(rows), positions // block_size] * block_size + positions % block_size
    return ForwardBatch(rng.integers(0, 300, rows), positions, np.arange(rows), slots, blocks, np.arange(rows))


def test_a_replay_with_new_inputs_equals_the_eager_forward(model, rng):
    e = engine(model, cuda_graphs=False)
    for layer in range(model.config.num_hidden_layers):
        for array in e.kv_pool.layer(layer):
            array.copy_to_device(rng.standard_normal(array.shape).astype(np.float32))  # finite keys everywhere
    captured = CapturedDecode(e.runner.forward_pass, bucket=4, max_blocks_per_seq=5)
    for rows in (3, 4, 1):
        batch = _decode_batch(rng, rows)
        graphed_logits, graphed_ids = captured.run(batch)
        graphed, graphed_ids = graphed_logits.copy_to_host(), graphed_ids.copy_to_host()
        # the eager path writes the same K/V into the pool first, so both read identical caches
        eager = e.runner.forward(batch).copy_to_host()
        assert graphed.shape == eager.shape == (rows, model.config.vocab_size)
        np.testing.assert_array_equal(graphed, eager)
        np.testing.assert_array_equal(graphed_ids, argmax_ref(eager))


def test_the_arena_hands_back_the_recorded_buffers_in_order():
    arena = BufferArena()
    with launching_into(0, arena):
        first, second = device_empty((2, 3), np.float32), device_empty(5, np.int32)
    arena.rewind()
    with launching_into(0, arena):
        assert device_empty((2, 3), np.float32) is first
        assert device_empty(5, np.int32) is second
        with pytest.raises(AssertionError, match="more buffers"):
            device_empty(1, np.int32)
    arena.rewind()
    with launching_into(0, arena), pytest.raises(AssertionError, match="recorded"):
        device_empty((3, 2), np.float32)
