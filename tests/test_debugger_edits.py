"""Value edits in the debugger on the demo model (fp32 unless said): an edit reaches the stages after it and the
tokens, the stages where it could not are refused with the reason, the `e` key's box applies one and the screen
lists it, and a recording keeps it so that debug --replay reproduces the edited tokens."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from debugger.app import DebuggerApp
from debugger.serve_debug import replay_session, serving_session
from debugger.session import Breakpoint, Session, SessionOptions, StepRecord
from debugger.value_edit import EditError
from debugger.widgets.edit_screen import EditScreen
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.model.loader import load_model

from .test_debugger_app import drive, press, screen_lines, shown, text

ROOT = Path(__file__).resolve().parents[1]

PROMPT = [384, 341, 265, 84, 77, 220, 81]
PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
FORCED = 5   # a token id the demo model does not pick here unprompted (checked below)


@pytest.fixture(scope="module")
def model():
    return load_model(None, log=lambda message: None)


def new_session(model, precision="fp32"):
    engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=4, precision=precision), log=lambda m: None)
    return Session(engine, None, [PROMPT], SessionOptions(params=PARAMS))


def tokens(session) -> list[int]:
    return list(session.engine.request(session.request_ids[0]).seq.output_token_ids)


def run_to(session, stage: str):
    result = session.run_until(Breakpoint("stage", stage))
    assert result.reason == "breakpoint" and result.event.name == stage
    return result.event


@pytest.fixture(scope="module")
def unedited(model):
    session = new_session(model)
    session.continue_to_end()
    assert FORCED not in tokens(session)
    return tokens(session)


def test_a_logits_edit_picks_the_token_and_x_times_1_changes_no_bit(model, unedited):
    session = new_session(model)
    before = run_to(session, "logits").values
    assert before.shape[0] == 1 and np.abs(before).max() < 50     # one sampling row; +100 makes FORCED its argmax
    edit = session.edit(f"row 0 channel {FORCED} = x + 100")
    assert session.current.values[0, FORCED] == np.float32(before[0, FORCED] + np.float32(100))
    assert session.current.edits == (edit,) and edit.step == 0
    step = session.step_stage()
    assert isinstance(step, StepRecord) and step.new_tokens[session.request_ids[0]] == [FORCED]
    assert step.edits == (edit,)
    session.continue_to_end()
    assert tokens(session)[0] == FORCED and tokens(session) != unedited

    same = new_session(model)
    run_to(same, "layers.0.q")
    same.edit("all = x * 1")
    run_to(same, "logits")
    logits_after_identity_edit = same.current.values
    same.continue_to_end()
    plain = new_session(model)
    assert run_to(plain, "logits").values.tobytes() == logits_after_identity_edit.tobytes()
    assert tokens(same) == unedited


def test_an_edit_reaches_the_next_kernel(model):
    """o_proj zeroed: attn_residual's add_rmsnorm computes h = embedding + 0, bit for bit the embedding."""
    session = new_session(model)
    embedding = run_to(session, "embedding").values
    run_to(session, "layers.0.o_proj")
    session.edit("all = x * 0")
    residual = run_to(session, "layers.0.attn_residual").values
    assert residual.tobytes() == embedding.tobytes()


def test_the_golden_panel_compares_the_edited_values(model):
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
    engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=4), log=lambda m: None)
    session = Session(engine, Goldens.load(DEFAULT_GOLDENS))          # the first golden prompt
    assert [g.status for g in run_to(session, "embedding").golden] == ["pass"]
    session.edit("row 0 channel 0 = x + 1")
    assert [g.status for g in session.current.golden] == ["fail"]
    golden = session.view().golden
    assert [(g.stage, g.status) for g in golden.rows] == [("embedding", "fail")]
    assert golden.first_failure.stage == "embedding"


def test_an_edit_of_q_changes_the_tokens(model, unedited):
    session = new_session(model)
    run_to(session, "layers.0.q")
    session.edit("row -1 = x * 0")
    session.continue_to_end()
    assert tokens(session) != unedited


@pytest.mark.parametrize("stage, message", [
    ("layers.0.k", "layers.0.k cannot be edited here: rope_qkv has written K into the paged KV cache"),
    ("layers.1.attn_residual", "its add_rmsnorm has normed this residual into post_norm"),
])
def test_an_edit_that_would_not_reach_the_next_stages_is_refused_with_why(model, stage, message):
    session = new_session(model)
    before = run_to(session, stage).values
    with pytest.raises(EditError, match=message):
        session.edit("all = x * 0")
    assert session.current.values is before and session.edits == []


def test_the_fused_gemv_layer_refuses_what_its_kernels_consumed_and_takes_the_residual(model):
    """The GPU's decode layer (forced here): o_proj's sum is already in the residual, but a residual edit reaches
    post_norm's gemv_fused, whose normed output of zeros is zeros."""
    session = new_session(model)
    session.engine.runner.forward_pass.fuse_norms = True
    run_to(session, "layers.0.o_proj")
    with pytest.raises(EditError, match="gemv_fused has added it into the residual"):
        session.edit("all = x * 0")
    run_to(session, "layers.0.attn_residual")
    session.edit("all = x * 0")
    normed = run_to(session, "layers.0.post_norm").values
    assert normed.shape == (len(PROMPT), model.config.hidden_size) and not normed.any()


def test_fast_refuses_a_norm_whose_bf16_copy_the_projections_read(model):
    session = new_session(model, precision="fast")
    run_to(session, "layers.0.input_norm")
    with pytest.raises(EditError, match="read the bf16 copy the norm wrote beside it"):
        session.edit("row 0 = x * 0")


def test_no_stage_to_edit_between_steps(model):
    session = new_session(model)
    with pytest.raises(EditError, match="no stage to edit: step to one first"):
        session.edit("all = x")


def test_e_opens_the_edit_box_and_the_edit_is_listed_on_screen(model, unedited):
    app = DebuggerApp(new_session(model))

    async def scenario(pilot):
        await pilot.press("e")
        assert text(app, "#status").startswith("e edits the output of the stage stepping stopped at")
        await press(pilot, "b", *"stage logits", "enter")
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, EditScreen)
        assert any("edit logits (step 0, shape (1, 640))" in line for line in screen_lines(app)), screen_lines(app)
        await pilot.press(*"row 0 = x / 0", "enter")                      # refused: the message, no edit
        assert not isinstance(app.screen, EditScreen)
        assert text(app, "#status") == "edit refused: 'x / 0' gives 640 value(s) that are not finite in float32 " \
                                       "(NaN, inf, or too large)"
        await pilot.press("e", *f"row 0 channel {FORCED} = x + 100", "enter")
        await pilot.pause()
        assert text(app, "#status") == (f"edited step 0 logits row 0 channel {FORCED} = x + 100; continue (s, c) "
                                        f"to see its effect on the tokens")
        assert shown(app, "#inspector-header").splitlines()[-1] == f"edited row 0 channel {FORCED} = x + 100"
        timeline = app.query_one("#timeline").lines
        assert timeline[-1].split()[:4] == ["0", "value", "edit", "logits"]
        await pilot.press("e")
        await pilot.pause()
        assert any(f"step 0 logits row 0 channel {FORCED} = x + 100" in line for line in screen_lines(app))
        await pilot.press("escape")
        await press(pilot, "c")
        assert app.session.view().requests[0].output_token_ids[0] == FORCED
    drive(app, scenario)


def test_a_recorded_edit_is_replayed_and_gives_the_edited_tokens(model, unedited, tmp_path):
    from tinyvllm.serving.recording import read_recording
    from tinyvllm.serving.replay import format_report, replay
    engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=4), log=lambda m: None)
    session, feed = serving_session(engine, None)
    feed.start()
    path = tmp_path / "edited.jsonl"
    feed.toggle_recording(path)
    feed.submit(list(PROMPT), PARAMS, lambda updates: None)
    run_to(session, "logits")                 # step 0
    session.step_stage()
    run_to(session, "layers.0.q")             # step 1: a decode step
    session.edit("all = x * 0")
    session.continue_to_end()
    edited = tokens(session)
    assert edited[0] == unedited[0] and edited != unedited
    feed.toggle_recording()
    recording = read_recording(path)
    assert [(e.step, e.stage, e.select, e.expr) for e in recording.edits] == [(1, "layers.0.q", "all", "x * 0")]

    replayed, replay_feed = replay_session(str(path))
    replayed.continue_to_end()
    assert tokens(replayed) == edited and not replay_feed.diverged
    assert [e.describe() for e in replayed.edits] == ["step 1 layers.0.q all = x * 0"]

    headless = replay(recording, LLMEngine(model, EngineConfig(num_blocks=32, block_size=4), log=lambda m: None))
    assert headless.diverged and headless.results[0].replayed == unedited   # the engine alone cannot apply it
    assert "1 value edit(s) recorded in the debugger are not applied here" in format_report(headless)


def test_debug_record_keeps_the_requests_answers_and_edits_and_debug_replay_steps_them_again(model, unedited,
                                                                                              tmp_path):
    from tinyvllm.serving.recording import read_recording
    path = tmp_path / "debug.jsonl"
    session = new_session(model)
    session.record_to(path)                   # as debug --record FILE does, before the first step
    run_to(session, "logits")
    session.step_stage()
    run_to(session, "logits")                 # step 1
    session.edit(f"row 0 channel {FORCED} = x + 100")
    with pytest.raises(ValueError, match="reset is off while recording"):
        session.reset()
    session.continue_to_end()
    session.close()
    edited = tokens(session)
    assert edited == [unedited[0], FORCED, edited[2]]
    recording = read_recording(path)
    [request] = recording.requests
    assert (request.step, request.prompt_token_ids, request.token_ids) == (0, PROMPT, edited)
    assert [(e.step, e.stage, e.select) for e in recording.edits] == [(1, "logits", f"row 0 channel {FORCED}")]

    replayed, feed = replay_session(str(path))
    replayed.continue_to_end()
    assert tokens(replayed) == edited and not feed.diverged
    assert "never applied" not in feed.report()

    with open(path, "a") as f:                # an edit of a step the run never reaches is reported, not lost
        f.write('{"type": "edit", "t": 1.0, "step": 99, "stage": "logits", "select": "all", "expr": "x"}\n')
    replayed, feed = replay_session(str(path))
    replayed.continue_to_end()
    assert feed.report().splitlines()[-1] == ("1 recorded value edit(s) never applied: their step and stage did not "
                                              "run in the replay")


@pytest.mark.parametrize("line, message", [
    ({"type": "edit", "step": -1, "stage": "logits", "select": "all", "expr": "x"}, "field 'step' must be >= 0, got -1"),
    ({"type": "edit", "step": 0, "select": "all", "expr": "x"}, "field 'stage' must be str, got None"),
    ({"type": "edit", "step": 0, "stage": "logits", "select": "all", "expr": 3}, "field 'expr' must be str, got 3"),
])
def test_a_bad_edit_line_names_its_file_line_and_field(tmp_path, line, message):
    import json
    from tinyvllm.serving.recording import BadRecording, read_recording
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "header", "format": "tinyvllm-recording", "version": 1}) + "\n"
                    + json.dumps(line) + "\n")
    with pytest.raises(BadRecording) as caught:
        read_recording(path)
    assert str(caught.value) == f"{path}:2: {message}"


def test_debug_record_does_not_combine_with_replay_or_the_tour(tmp_path, capsys):
    from tinyvllm.cli import main
    for extra, other in ((["--replay", str(tmp_path / "x.jsonl")], "--replay"), (["--tour"], "--tour")):
        assert main(["debug", "--record", str(tmp_path / "r.jsonl"), *extra]) == 1
        assert capsys.readouterr().err.strip().splitlines() == [
            f"error: --record records the debugger's own requests; it does not combine with {other}"]


def test_debug_record_from_the_command_line_records_the_initial_prompt(tmp_path, monkeypatch, capsys):
    from debugger import cli
    from tinyvllm.cli import parse_args
    from tinyvllm.serving.recording import read_recording
    apps = []
    monkeypatch.setattr(DebuggerApp, "run", lambda app: apps.append(app))     # quit at once
    path = tmp_path / "r.jsonl"
    assert cli.run(parse_args(["debug", "--record", str(path), "--prompt", "The sun", "--max-tokens", "2"])) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (f"tinyvllm debug: recorded to {path} "
                                                        f"(tinyvllm debug --replay {path})")
    [request] = read_recording(path).requests
    prompt = apps[0].session.engine.tokenizer.encode("The sun")
    assert (request.step, request.prompt_token_ids, request.params["max_tokens"]) == (0, prompt, 2)


def test_debug_record_into_a_missing_directory_is_refused_before_the_model_loads(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="1")
    path = tmp_path / "no-such-dir" / "r.jsonl"
    done = subprocess.run([sys.executable, "-m", "tinyvllm.cli", "debug", "--record", str(path)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 1
    # one line, and only it: no "loaded in" / "KV pool" lines before it
    assert done.stderr.splitlines() == [f"error: cannot write the recording {path}: its directory is missing or "
                                        "not writable"]
