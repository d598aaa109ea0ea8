"""Steps with prefill chunks replayed from captured graphs (tinyvllm/runner/prefill_graphs.py) give exactly the eager
path's logits and KV writes.

In the simulator a replay re-runs the recorded forward pass over the same static buffers (there are no real
graphs), so this checks everything the GPU capture relies on: inputs and query tiles refilled in place and padded
to a bucket (padding rows write no KV and sit in no tile), buffers reused across layers (LayerArena) and shared
by buckets (SharedStorage), and the LM head run after the replay on the step's own rows. Both precisions: fp32
(gemv, per_query attention: no tiles in the simulator) and fast (gemm_tc, prefill_tc over padded tiles). The
kernels' per-row math does not depend on the other rows, so graph and eager agree bit for bit.
"""
import numpy as np
import pytest

from kernels_numba.common import SIMULATOR, LayerArena, SharedStorage, begin_layer, device_empty, launching_into
from kernels_numba.kv_dtype import kv_encode_ref
from kernels_numba.matmul import MAX_COALESCED_TOKENS
from kernels_numba.sampling import argmax_ref
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.runner.kv_pool import KVPool
from tinyvllm.model.loader import load_model
from tinyvllm.runner.inputs import ForwardBatch
from tinyvllm.runner import prefill_graphs
from tinyvllm.runner.model_runner import ModelRunner
from tinyvllm.runner.prefill_graphs import PrefillGraphs, activation_bytes_per_token, prefill_buckets_up_to
from tinyvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow  # engine-level: the demo model's graph recordings

BLOCK_SIZE, NUM_BLOCKS, MAX_SEQS, WIDTH = 4, 24, 4, 6
BUCKETS = (12, 16)
POISON = {np.dtype(np.float32): np.float32(np.nan), np.dtype(np.uint16): np.uint16(0xFFFF)}


@pytest.fixture(scope="module")
def model():
    return load_model(log=lambda message: None)


def _runner(model, precision: str) -> ModelRunner:
    pool = KVPool(model.config, NUM_BLOCKS, BLOCK_SIZE, "bfloat16" if precision == "fast" else "float32")
    for k, v in map(pool.layer, range(model.config.num_hidden_layers)):
        for p in (k, v):  # no test step writes a poisoned entry, so any difference shows
            p.copy_to_device(np.full(p.shape, POISON[p.dtype], p.dtype))
    return ModelRunner(model.config, model.weights, pool, model.inv_freq, precision=precision)


def _batch(rng, seqs, vocab: int) -> ForwardBatch:
    """seqs: (block table, first position, number of tokens, samples) per sequence, in the step's order."""
    token_ids, positions, query_seq, slots, rows = [], [], [], [], []
    for row, (table, start, count, samples) in enumerate(seqs):
        for p in range(start, start + count):
            positions.append(p)
            query_seq.append(row)
            slots.append(table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE)
        token_ids += rng.integers(0, vocab, count).tolist()
        if samples:
            rows.append(len(token_ids) - 1)
    tables = np.full((len(seqs), max(len(t) for t, *_ in seqs)), -1, np.int32)
    for row, (table, *_) in enumerate(seqs):
        tables[row, :len(table)] = table
    i32 = lambda a: np.array(a, np.int32)  # noqa: E731
    return ForwardBatch(token_ids, i32(positions), i32(query_seq), i32(slots), tables, i32(rows))


def _pools(runner):
    return [a.copy_to_host() for i in range(runner.config.num_hidden_layers) for a in runner.kv_pool.layer(i)]


def _set_pools(runner, pools):
    arrays = [a for i in range(runner.config.num_hidden_layers) for a in runner.kv_pool.layer(i)]
    for device, host in zip(arrays, pools):
        device.copy_to_device(host)


def _write_prefix(runner, rng, table, length):
    """K/V of positions 0..length-1 of a sequence with block table `table`, as if an earlier step wrote them."""
    for i in range(runner.config.num_hidden_layers):
        for pool in runner.kv_pool.layer(i):
            host = pool.copy_to_host()
            for p in range(length):
                values = rng.standard_normal(host.shape[2:]).astype(np.float32)
                host[table[p // BLOCK_SIZE], p % BLOCK_SIZE] = kv_encode_ref(values, pool.dtype)
            pool.copy_to_device(host)


def _steps(rng, vocab):
    """(name, batch); every batch also runs in its bucket with padding rows."""
    return {
        "one": ("one prompt (7 tokens: bucket 12)", _batch(rng, [([1, 2], 0, 7, True)], vocab)),
        "several": ("several prompts (13 tokens: bucket 16)",
                    _batch(rng, [([3, 4], 0, 5, True), ([5, 6], 0, 6, True), ([7], 0, 2, True)], vocab)),
        "mixed": ("a chunk against a cached prefix, a decode and a prompt (5 + 1 + 4 tokens: bucket 12)",
                  _batch(rng, [([9, 10, 11, 12], 8, 5, True), ([18, 19], 6, 1, True), ([13], 0, 4, True)], vocab)),
        "mid": ("a chunk ending mid-prompt: no logits (bucket 12)", _batch(rng, [([15, 16, 17], 0, 10, False)], vocab)),
    }


# fp32 (no tiles in the simulator): three different steps one after another in bucket 12, so each replay must
# see none of the last one's data. fast (prefill_tc over padded tiles; ~5 s a forward in the simulator): one.
STEPS = {"fp32": ["several", "one", "mixed", "mid"], "fast": ["mixed"]}


@pytest.mark.parametrize("precision", ["fast", "fp32"])
def test_replayed_steps_match_eager_logits_and_kv_writes(model, precision):
    rng = np.random.default_rng(4)
    runner = _runner(model, precision)
    _write_prefix(runner, rng, [9, 10, 11, 12], 8)
    _write_prefix(runner, rng, [18, 19], 6)
    graphs = PrefillGraphs(runner.forward_pass, BUCKETS[-1], MAX_SEQS, WIDTH, buckets=BUCKETS)
    steps = _steps(rng, model.config.vocab_size)
    for name, batch in map(steps.get, STEPS[precision]):
        assert graphs.can_run(batch), name
        before = _pools(runner)
        eager = runner.forward(batch)
        eager = None if eager is None else eager.copy_to_host()
        eager_pools = _pools(runner)
        _set_pools(runner, before)
        graphed, greedy = graphs.run(batch)
        assert (graphed is None) == (eager is None) == (greedy is None), name
        if eager is not None:
            assert np.isfinite(eager).all()
            np.testing.assert_array_equal(graphed.copy_to_host(), eager, err_msg=name)
            np.testing.assert_array_equal(greedy.copy_to_host(), argmax_ref(eager), err_msg=name)
        for got, want in zip(_pools(runner), eager_pools):  # the same slots written, nothing else (NaN == NaN)
            np.testing.assert_array_equal(got, want, err_msg=name)
        assert any((p != b).any() for p, b in zip(eager_pools, before)), "the step wrote no KV: proves nothing"
    assert graphs.captured_buckets == (list(BUCKETS) if precision == "fp32" else [12])
    if precision == "fast":
        step = graphs._captured[12]  # the attention's grid is the bucket's worst case, padded with empty tiles
        assert step.num_tiles == 12 // step.tile_queries + MAX_SEQS == step._batch.prefill_tiles.num_tiles
        # what the bucket holds: within the estimate the engine reserves, and close to it (on a GPU a 12-token
        # bucket runs the fused-GEMV layer, which holds less); the estimate counts the float32 gate|up [T, 2 I] of
        # both buffer sets, which the fast plan's gate fused into gate|up's GEMM never writes (fuses_swiglu)
        estimate = activation_bytes_per_token(model.config) * 12
        assert runner.plan.fuses_swiglu(12, model.config.hidden_size, model.config.intermediate_size)
        fused_gate_up = 2 * 4 * 2 * model.config.intermediate_size * 12
        assert (0.8 * (estimate - fused_gate_up) if SIMULATOR else 0) <= graphs.storage.bytes <= estimate, (
            graphs.storage.bytes, estimate)


def test_steps_with_more_logits_rows_than_the_logits_graphs_take_run_the_lm_head_eagerly(model, monkeypatch):
    """Past LOGITS_GRAPH_ROWS rows the LM head runs eagerly after the replay (no argmax); up to it from the bucket's
    logits graph of that many rows: the same logits either way."""
    monkeypatch.setattr(prefill_graphs, "LOGITS_GRAPH_ROWS", 2)
    rng = np.random.default_rng(5)
    runner = _runner(model, "fp32")
    graphs = PrefillGraphs(runner.forward_pass, BUCKETS[-1], MAX_SEQS, WIDTH, buckets=BUCKETS)
    steps = _steps(rng, model.config.vocab_size)
    for name, rows, graphed_rows in (("several", 3, False), ("one", 1, True)):
        batch = steps[name][1]
        assert len(batch.logits_rows) == rows
        before = _pools(runner)
        eager = runner.forward(batch).copy_to_host()
        _set_pools(runner, before)
        logits, greedy = graphs.run(batch)
        assert (greedy is not None) == graphed_rows, name
        np.testing.assert_array_equal(logits.copy_to_host(), eager, err_msg=name)
    assert sorted(graphs._captured[graphs.bucket_for(steps["one"][1].num_tokens)]._logits) == [1]


def test_layer_arena_alternates_two_sets_and_buckets_share_storage():
    # Layer i writes set i % 2: its buffers are distinct from layer i - 1's (read by layer i) and are the same
    # storage as layer i - 2's. Before layer 0 (the embedding, layer 0's norm): set 1.
    storage = SharedStorage()

    def record(rows):
        arena = LayerArena(storage)
        taken = []
        with launching_into(0, arena):
            taken.append([device_empty((rows, 8), np.float32)])
            for i in range(4):
                begin_layer(i)
                taken.append([device_empty((rows, 8), np.float32), device_empty((rows, 3), np.uint16),
                              device_empty((rows, 16), np.float32)])
        return taken

    taken = record(16)
    for i in range(5):  # fill each layer's buffers (0: before layer 0), then check the one before kept its values
        for n, b in enumerate(taken[i]):
            b.copy_to_device(np.full(b.shape, 10 * i + n, b.dtype))
        for n, b in enumerate(taken[i - 1] if i else []):
            assert (b.copy_to_host() == 10 * (i - 1) + n).all(), f"layer {i - 2}'s buffer {n} was overwritten"
    assert (taken[2][2].copy_to_host() == 42).all(), "layer 3 does not reuse layer 1's storage"
    full = storage.bytes
    assert full == 2 * 16 * (8 * 4 + 3 * 2 + 16 * 4)
    small = record(12)  # a smaller bucket: views of the same storage
    assert storage.bytes == full
    small[1][0].copy_to_device(np.full((12, 8), 7, np.float32))
    assert (taken[1][0].copy_to_host()[:12] == 7).all()


def test_buckets_end_at_the_step_budget():
    assert prefill_buckets_up_to(512)[:5] == (16, 32, 64, 128, 192) and prefill_buckets_up_to(512)[-1] == 512
    assert prefill_buckets_up_to(100) == (16, 32, 64, 100) and prefill_buckets_up_to(10) == (10,)
    # a short step's bucket runs the kernels its eager step runs: the fused-GEMV layer up to 32 tokens on a GPU
    assert all((b <= MAX_COALESCED_TOKENS) == (t <= MAX_COALESCED_TOKENS)
               for t in range(1, 513) for b in [next(b for b in prefill_buckets_up_to(512) if b >= t)])


def test_engine_with_prefill_graphs_matches_eager_tokens_and_logprobs(model):
    prompts = ["The sun rose over the quiet hills and the river", "A small dog ran", "Water is wet"]
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    # prompt logprobs: logits for many rows of a chunk (the LM head runs after the replay, on any number of rows)
    params = [SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2, prompt_logprobs=2),
              greedy, greedy]

    def run(graphs: bool):
        # a 10-token step budget: chunked prompts, prompts beside decodes; prefill_graphs follows cuda_graphs, so
        # with graphs every step replays one (decode-only ones: DecodeGraphs, pipelined)
        config = EngineConfig(num_blocks=32, block_size=4, max_num_seqs=4, max_num_batched_tokens=10,
                              cuda_graphs=graphs)
        engine = LLMEngine(model, config, log=lambda message: None)
        return engine, [(o.token_ids, o.logprobs, o.prompt_logprobs) for o in engine.generate(prompts, params)]

    eager_engine, eager = run(False)
    graphed_engine, graphed = run(True)
    assert eager_engine.runner.prefill_graphs is None and eager_engine.runner.decode_graphs is None
    assert graphed_engine.runner.prefill_graphs.captured_buckets == [10] and graphed_engine.runner.decode_graphs.captured_buckets
    assert graphed == eager


def test_capture_graphs_takes_every_bucket_up_front_and_generation_then_captures_nothing(model):
    """LLMEngine.capture_graphs (the bench and eval_bench call it before a timed run): every decode and prefill
    bucket captured, each once; the outputs equal an engine that captured on first use."""
    prompts = ["The sun rose over the quiet hills", "A small dog ran"]
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    config = EngineConfig(num_blocks=32, block_size=4, max_num_seqs=2, max_num_batched_tokens=20, cuda_graphs=True)
    lazy = LLMEngine(model, config, log=lambda message: None)
    expected = [o.token_ids for o in lazy.generate(prompts, greedy)]
    logged = []
    eager_capture = LLMEngine(model, config, log=lambda message: None)
    eager_capture.capture_graphs(logged.append)
    assert eager_capture.runner.decode_graphs.captured_buckets == list(eager_capture.runner.decode_graphs.buckets)
    assert eager_capture.runner.prefill_graphs.captured_buckets == list(eager_capture.runner.prefill_graphs.buckets) == [16, 20]
    assert [line.split()[1] for line in logged] == ["decode", "prefill"]
    captured = {id(step) for graphs in (eager_capture.runner.decode_graphs, eager_capture.runner.prefill_graphs)
                for step in graphs._captured.values()}
    assert [o.token_ids for o in eager_capture.generate(prompts, greedy)] == expected
    assert captured == {id(step) for graphs in (eager_capture.runner.decode_graphs, eager_capture.runner.prefill_graphs)
                        for step in graphs._captured.values()}, "generation captured again"
