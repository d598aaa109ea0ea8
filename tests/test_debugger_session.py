"""The debugger's stepping logic (debugger/session.py) on the demo model, with short prompts and a tiny pool."""
import time

import numpy as np
import pytest

from debugger.session import Breakpoint, Session, StageRecord, StepRecord, TensorStats, stage_names
from kernels_numba.bf16 import bf16_to_f32_ref
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
from tinyvllm.model.loader import default_model_dir, load_model
from tinyvllm.model.weights import load_weights

PROMPT = [384, 341, 265, 84, 77, 220, 81]   # 7 tokens: two blocks of 4, the second partly filled


@pytest.fixture(scope="module")
def model():
    return load_model(None, log=lambda message: None)


@pytest.fixture(scope="module")
def embed_table(model):
    """The embedding table decoded by the numpy twin, straight from the checkpoint (not the kernel)."""
    host = load_weights(default_model_dir(), model.config)
    return bf16_to_f32_ref(host["model.embed_tokens.weight"])


def new_session(model, prompts, goldens=None):
    engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=4), log=lambda message: None)
    return Session(engine, goldens, prompts)


def embedding_goldens(ids, embedding):
    """A golden file holding only the embedding stage of one prompt: every other stage is absent."""
    return Goldens(DEFAULT_GOLDENS, {}, [{"input_ids": np.array(ids, np.int32), "embedding": embedding}])


def test_tensor_stats_count_nan_and_inf_and_skip_them():
    stats = TensorStats.of(np.array([[1.0, np.nan, np.inf], [-2.0, 3.0, -np.inf]], np.float32))
    assert (stats.shape, stats.dtype, stats.nan, stats.inf) == ((2, 3), "float32", 1, 2)
    assert (stats.min, stats.max) == (-2.0, 3.0)
    assert stats.mean == pytest.approx(2 / 3) and stats.std == pytest.approx(np.std([1.0, -2.0, 3.0]))
    assert TensorStats.of(np.array([np.nan])).mean is None


@pytest.mark.parametrize("spec, kind, value", [
    ("layer 1", "layer", 1), ("stage layers.*.mlp", "stage", "layers.*.mlp"), ("layers.0.q", "stage", "layers.0.q"),
    ("logits", "stage", "logits"), ("finished", "finished", None), ("finished 3", "finished", "3"),
    ("golden", "golden", None), ("golden 1e-3", "golden", 1e-3)])
def test_breakpoint_specs(spec, kind, value):
    assert Breakpoint.parse(spec) == Breakpoint(kind, value)


@pytest.mark.parametrize("spec", ["", "layer x", "golden big", "nonsense", "layer 1 2"])
def test_bad_breakpoint_specs_say_how_to_write_one(spec):
    with pytest.raises(ValueError, match="layer"):
        Breakpoint.parse(spec)


def test_a_stage_step_runs_the_embedding_and_its_golden_passes(model, embed_table):
    expected = embed_table[PROMPT]
    session = new_session(model, [PROMPT], embedding_goldens(PROMPT, expected))
    record = session.step_stage()
    assert isinstance(record, StageRecord) and (record.step, record.index, record.name) == (0, 0, "embedding")
    assert record.kernel == "embedding.embedding" and record.layer is None
    np.testing.assert_array_equal(record.values, expected)  # a row copy: exact
    assert record.stats.min == expected.min() and record.stats.max == expected.max()
    assert record.stats.mean == pytest.approx(expected.astype(np.float64).mean(), rel=1e-12)
    assert [(g.stage, g.status, g.max_abs) for g in record.golden] == [("embedding", "pass", 0.0)]
    view = session.view()
    assert view.in_step and view.stages_done == 1 and view.golden.absent_reason == ""
    assert [e.name for e in view.timeline] == ["schedule", "embedding"]
    assert view.timeline[0].kernel == "req 0 prefill 0..6"
    assert view.requests[0].state == "prefill" and view.requests[0].golden_prompt == 0
    # Two blocks of 4 for 7 tokens, both just allocated.
    assert view.blocks.tables == (("0", (0, 1)),) and view.blocks.just_allocated == {0, 1}


def test_layer_and_decode_steps_walk_every_stage_in_order_then_sample(model, embed_table):
    goldens = embedding_goldens(PROMPT, embed_table[PROMPT])
    session = new_session(model, [PROMPT], goldens)
    assert session.step_layer().event.name == "layers.0.output"
    assert session.step_layer().event.name == "layers.1.output"
    assert session.step_layer().event.name == "logits"
    done = session.step_stage()
    assert isinstance(done, StepRecord) and done.step == 0 and done.num_batched_tokens == len(PROMPT)
    assert len(done.new_tokens["0"]) == 1 and done.finished == ()
    stages = [e.name for e in session.timeline if e.step == 0 and e.name not in ("schedule", "step done")]
    assert stages == stage_names(model.config.num_hidden_layers)
    rows = session.view().golden.rows
    assert [r.status for r in rows] == ["pass"] + ["absent"] * 22, "only the embedding has a golden"
    # The decode step is past the golden prompt: absent, and not a pass.
    result = session.step_decode()
    assert result.reason == "stopped" and isinstance(result.event, StepRecord) and result.event.step == 1
    view = session.view()
    assert view.golden.rows == () and "past prefill" in view.golden.absent_reason
    assert view.requests[0].state == "decode" and len(view.requests[0].output_token_ids) == 2


def test_a_wrong_golden_is_the_first_failure_and_stops_a_golden_breakpoint(model, embed_table):
    wrong = embed_table[PROMPT] + np.float32(0.5)
    session = new_session(model, [PROMPT], embedding_goldens(PROMPT, wrong))
    result = session.run_until(Breakpoint.parse("golden 1e-3"))
    assert result.reason == "breakpoint" and result.event.name == "embedding" and result.num_events == 1
    first = session.view().golden.first_failure
    assert (first.stage, first.status, first.prompt) == ("embedding", "fail", 0)
    assert first.max_abs == pytest.approx(0.5)


def test_requests_without_a_golden_prompt_show_goldens_as_absent(model):
    session = new_session(model, [[5, 6, 7]], Goldens.load(DEFAULT_GOLDENS))
    session.step_stage()
    golden = session.view().golden
    assert golden.rows == () and golden.absent_reason == "no request's prompt is a golden prompt"
    assert new_session(model, [[5, 6, 7]]).view().golden.absent_reason == "no golden file"


def test_run_until_finished_then_idle_and_reset(model):
    session = new_session(model, [[5, 6, 7]])
    session.options.params = type(session.options.params)(temperature=0.0, max_tokens=2, ignore_eos=True)
    session.reset()
    result = session.run_until(Breakpoint.parse("finished"))
    assert result.reason == "breakpoint" and result.event.finished == ("0",) and result.event.step == 1
    view = session.view()
    assert view.idle and view.requests[0].state == "finished" and len(view.requests[0].output_token_ids) == 2
    assert view.blocks.just_freed == {0} and view.blocks.tables == ()
    assert session.step_stage() is None and session.continue_to_end().reason == "idle"
    session.reset()
    view = session.view()
    assert not view.idle and view.timeline == () and view.step == 0 and view.requests[0].state == "waiting"


def test_a_cancelled_run_stops_before_the_next_stage(model):
    session = new_session(model, [[5, 6, 7]])
    seen = []
    result = session.continue_to_end(cancelled=lambda: len(seen) >= 3, progress=seen.append)
    assert result.reason == "cancelled" and result.num_events == 3 and result.event.name == "layers.0.q"


def test_a_shared_prefix_shares_physical_blocks(model):
    session = new_session(model, [PROMPT + [90]])          # 8 tokens: two full blocks, committed after prefill
    session.step_decode()
    second = session.add_request(PROMPT + [90, 91, 92])   # the same 8 tokens, then 2 more
    session.step_stage()
    blocks = session.view().blocks
    tables = dict(blocks.tables)
    assert tables[second][:2] == tables["0"][:2] and tables[second][2] not in tables["0"]
    assert [blocks.states[b] for b in tables["0"][:2]] == ["shared", "shared"]
    assert blocks.just_allocated == {tables[second][2], tables["0"][2]}
    assert session.timeline[-2].kernel == f"req 0 decode 8..8, req {second} prefill 8..9"
    # the mixed batch's rows say whose they are: request:position
    assert session.current.row_labels == ("0:8", f"{second}:8", f"{second}:9")
    assert session.step_layer().event.name == "layers.0.output"
    assert session.current.row_labels == ("0:8", f"{second}:8", f"{second}:9")
    session.step_layer(), session.step_layer()
    assert session.current.name == "logits" and session.current.values.shape[0] == 2
    assert session.current.row_labels == ("0:8", f"{second}:9")      # the rows that sample
    done = session.step_stage()
    sampled = {r: ids for r, ids in done.new_tokens.items()}
    assert done.describe() == ", ".join(f"req {r}: {ids[0]} {model.tokenizer.decode(ids)!r}"
                                        for r, ids in sampled.items()) and len(sampled) == 2


def test_latencies_leave_out_the_time_paused_between_commands(model):
    session = new_session(model, [[5, 6, 7]])
    pause = 0.3
    session.step_stage()
    time.sleep(pause)                                   # the user looks at the embedding
    first = session.step_decode().event                 # the rest of step 0: the first token
    time.sleep(pause)
    session.step_decode()                               # step 1: the second token
    request = session.view().requests[0]
    wall = session.engine.metrics.request_metrics("0")  # the engine's own clock counts the pauses
    assert isinstance(first, StepRecord) and len(wall.itls) == 1
    # what the view leaves out is the time outside the session's commands: the pause, plus microseconds
    assert pause <= wall.ttft - request.ttft < pause + 0.1
    assert pause <= wall.itls[0] - request.itl_mean < pause + 0.1
    assert 0 < request.ttft and 0 < request.itl_mean


def test_the_timeline_times_a_step_without_the_pause_at_a_breakpoint(model, monkeypatch):
    import types
    import debugger.session as session_module
    paused = [0.0]   # the session's clock jumps by a long pause between two commands: no sleeping in the test
    monkeypatch.setattr(session_module, "time",
                        types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + paused[0]))
    session = new_session(model, [[5, 6, 7]])
    session.run_until(Breakpoint.parse("layer 1"))      # stopped in the middle of step 0
    paused[0] += 1000.0                                 # the user reads the panels for 1000 s
    record = session.step_decode().event
    done = session.timeline[-1]
    assert isinstance(record, StepRecord) and done.name == "step done" and done.step == 0
    ran = sum(e.seconds for e in session.timeline if e.step == 0 and e.seconds is not None and e.name != "step done")
    assert ran <= done.seconds < 1000.0                 # its stages' time, and nothing of the pause
    assert record.seconds == done.seconds


def test_a_refused_request_says_why_at_once(model):
    session = new_session(model, [])
    vocab = model.config.vocab_size
    refused = session.add_request([5, vocab + 7])
    assert session.rejection(refused) == f"token ids outside the vocabulary [0, {vocab}): [{vocab + 7}]"
    assert session.rejection(session.add_request([5, 6])) is None


def test_prompt_box_text(model):
    session = new_session(model, [], Goldens.load(DEFAULT_GOLDENS))
    assert session.prompt_from_text(" [1, 2,3] ") == [1, 2, 3]
    assert session.prompt_from_text("golden 1") == session.goldens.prompts[1]["input_ids"].tolist()
    assert session.prompt_from_text("hello there") == "hello there"
    with pytest.raises(ValueError, match="prompts 0..2"):
        session.prompt_from_text("golden 7")
