"""Where two runs of a request part (debugger/divergence.py, the D view): the request in its batch against itself
alone, the two precisions, two recordings; headless, and through Pilot."""
import asyncio
import json
import threading

import httpx
import numpy as np
import pytest

from debugger.app import DebuggerApp
from debugger.cli import debug_app
from debugger.divergence import AloneComparison, Margin, PrecisionComparison, Run, comparison_for
from debugger.serve_debug import replay_session
from debugger.session import Session, SessionOptions, StageRecord
from debugger.widgets.divergence_panel import DivergenceScreen
from tests.test_debugger_app import cells, drive, press, shown
from tests.test_precision import _roundings_upstream
from tests.test_serve_debug import record_two_requests, until
from tinyvllm.cli import main, parse_args
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.model.loader import load_model
from tinyvllm.runner.forward import stage_names
from tinyvllm.serving.recording import FORMAT, VERSION

TARGET = [1, *range(300, 306)]     # 7 tokens
OTHER = [1, *range(500, 509)]      # 10 tokens: TARGET's neighbour in the batch
STAGES = stage_names(2)            # the demo model has 2 layers


def quiet(message):
    pass


def batched_session(max_tokens: int, **config) -> Session:
    """TARGET (request "1") batched with OTHER, every stage's rows kept, run to the end."""
    engine = LLMEngine(None, EngineConfig(num_blocks=32, block_size=4, **config), log=quiet)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=2, ignore_eos=True)
    session = Session(engine, None, [OTHER, TARGET], SessionOptions(params=params, record_rows=True))
    assert session.continue_to_end().reason == "idle"
    return session


def test_margins_are_top1_minus_top2_of_each_tokens_logits():
    """Margin.of against np.sort, on the logits rows the session showed (its StageRecords), each at the output token
    they were sampled for: the top-1 is the token the engine chose (greedy)."""
    engine = LLMEngine(None, EngineConfig(num_blocks=32, block_size=4, precision="fp32"), log=quiet)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    session = Session(engine, None, [TARGET], SessionOptions(params=params, record_rows=True))
    logits = []
    while (event := session.step_stage()) is not None:
        if isinstance(event, StageRecord) and event.name == "logits":
            assert event.row_labels == (f"0:{len(TARGET) - 1 + len(logits)}",)
            logits.append(event.values[0].astype(np.float64))
    run = Run.of("batched", engine, session.rows, "0")
    tokens = engine.request("0").seq.output_token_ids
    assert len(logits) == len(tokens) == 3
    for k, row in enumerate(logits):
        top = np.sort(row)[::-1]
        margin = Margin.of(run.logits(k))
        assert margin.top1 == tokens[k] and row[margin.top2] == top[1]
        assert margin.margin == top[0] - top[1] > 0
    tie = Margin.of(np.array([0.5, 2.0, -1.0, 2.0], np.float32))
    assert (tie.top1, tie.top2, tie.margin, tie.near_tie) == (1, 3, 0.0, True)   # ties to the lower id, as argmax


def test_alone_and_batched_are_identical_with_batch_invariance_in_fp32():
    """Prefill in chunks of 8 beside OTHER, decode beside it: every row of TARGET's (7 + 3 - 1 positions x every
    stage but the logits, and the logits of its 3 tokens) the same bits alone."""
    session = batched_session(3, precision="fp32", batch_invariant=True, max_num_batched_tokens=8)
    comparison = AloneComparison()
    report = comparison.report(session, "1")
    assert comparison._runs["1"].engine.config == session.engine.config   # the same EngineConfig, all of it
    assert report.identical, report.lines()
    assert report.positions == len(TARGET) + 2 and report.tokens_compared == 3
    assert report.rows_compared == (len(TARGET) + 2) * (len(STAGES) - 1) + 3
    assert report.headline() == "request 1: batched vs alone: identical (201 rows at 9 positions and 3 tokens)"


@pytest.mark.slow   # the fast plan in the simulator: about 30 s
def test_without_batch_invariance_the_fast_plan_parts_at_the_logits_of_the_first_token():
    """Off, the simulator's fast plan sends a lone row to gemv and two or more to gemm_tc (docs/batch-invariance.md):
    TARGET's prefill rows (7 and OTHER's 10 in one step, both on gemm_tc) agree; its logits, one row of two in its
    batch and alone one row, do not. The engines' own logprobs say where: the report's first differing token is the
    first whose logprobs differ, and each run's margin there is its top-1 logprob less its top-2 (the engine's
    logprobs: the same log-sum-exp comes off both)."""
    session = batched_session(2, precision="fast", batch_invariant=False)
    comparison = AloneComparison()
    report = comparison.report(session, "1")
    alone = comparison._runs["1"].engine
    ours, theirs = session.engine.request("1").logprobs, alone.request("1").logprobs
    differ = [k for k in range(2) if not np.array_equal(np.float32(list(ours[k].values())),
                                                         np.float32(list(theirs[k].values())))]
    assert differ, "the demo model's logprobs differ alone vs batched with invariance off"
    assert not report.identical and report.logits_token == differ[0]
    position, stage = report.first
    assert position <= len(TARGET) - 1 + differ[0] and stage in STAGES
    at = {d.stage: d for d in report.table}
    assert not at[stage].identical and at[stage].max_abs > 0
    assert all(d.identical for d in report.table[:[d.stage for d in report.table].index(stage)])
    assert at[stage].kernels[0] != at[stage].kernels[1], "a batch-dependent kernel choice made the difference"
    for margin, logprobs in zip(report.margins, (ours, theirs)):   # top-2 logprobs differ as the logits do
        (top1, lp1), (top2, lp2) = sorted(logprobs[report.margin_token].items(), key=lambda kv: -kv[1])[:2]
        assert (margin.top1, margin.top2) == (top1, top2)
        assert margin.margin == pytest.approx(lp1 - lp2, rel=1e-4, abs=1e-6)


@pytest.mark.slow   # a fast shadow in lockstep
def test_the_precision_comparison_parts_at_the_first_bf16_rounding():
    """fp32 against the fast shadow: identical until the first stage with a bf16 rounding upstream
    (test_precision.py counts them), at the first position."""
    engine = LLMEngine(None, EngineConfig(num_blocks=32, block_size=4, precision="fp32"), log=quiet)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    session = Session(engine, None, [TARGET], SessionOptions(params=params, compare_precision=True))
    session.continue_to_end()
    report = PrecisionComparison().report(session, "0")
    assert report.labels == ("fp32", "fast") and not report.identical
    assert report.first == (0, next(s for s in STAGES if _roundings_upstream(s) > 0))
    assert report.positions == len(TARGET)


def recording(path, requests):
    """A recording file: one header, then per (id, prompt ids, answer): its request and finished lines."""
    lines = [{"type": "header", "format": FORMAT, "version": VERSION, "model": None,
              "engine_config": {"num_blocks": 32, "block_size": 4, "precision": "fp32"}}]
    for step, (request_id, prompt, answer) in enumerate(requests):
        lines.append({"type": "request", "id": request_id, "t": 0.0, "step": step, "prompt_token_ids": prompt,
                      "params": {"temperature": 0, "max_tokens": len(answer), "ignore_eos": True, "seed": 1}})
        lines.append({"type": "finished", "id": request_id, "t": 0.1, "step": step + 1, "token_ids": answer,
                      "finish_reason": "length"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_two_recordings_compare_tokens_by_prompt_and_say_so(tmp_path):
    """Requests matched by prompt across two recordings with other ids; tokens only, and the note says why."""
    first = recording(tmp_path / "a.jsonl", [("cmpl-a-0", OTHER, [5, 6, 7]), ("cmpl-b-0", TARGET, [9, 8, 7, 6])])
    second = recording(tmp_path / "b.jsonl", [("cmpl-x-0", TARGET, [9, 8, 3, 6]), ("cmpl-y-0", OTHER, [5, 6, 7])])
    args = parse_args(["debug", "--replay", first, "--against", second])
    session, feed = replay_session(first, options=SessionOptions(record_rows=True))
    comparison = comparison_for(args, session)
    report = comparison.report(session, "cmpl-b-0")
    assert (report.first_token, report.tokens_there) == (2, (7, 3)) and report.first is None
    assert "recordings hold no stage tensors and no logprobs: tokens compared" in report.note
    assert comparison.report(session, "cmpl-a-0").identical


def test_the_key_opens_the_view_on_the_picked_request():
    """debug --compare-alone: after the run, the cursor on request 1 and D: the view names it, identical in fp32."""
    args = parse_args(["debug", "--compare-alone", "--no-goldens", "--prompt", "Hello there", "--prompt", "Hi",
                       "--max-tokens", "2"])

    async def scenario(pilot):
        await press(pilot, "D")   # before anything ran: nothing to compare yet, said so
        assert "nothing to compare yet" in shown(pilot.app.screen, "#divergence-summary")
        await press(pilot, "escape", "c")
        pilot.app.query_one("#scheduler-table").move_cursor(row=1)
        await press(pilot, "D")
        assert isinstance(pilot.app.screen, DivergenceScreen)
        summary = shown(pilot.app.screen, "#divergence-summary")
        assert summary.startswith("request 1: batched vs alone: identical ("), summary
        assert "tokens: the same over 2" in summary
    drive(debug_app(args), scenario)


@pytest.mark.slow   # a fast shadow in lockstep
def test_the_view_marks_the_first_differing_stage_in_its_table():
    """debug --compare-precision, one step, D: the summary and the table's cursor row name the first stage with a
    bf16 rounding upstream (test_precision.py counts them); every stage before it reads "same"."""
    args = parse_args(["debug", "--compare-precision", "--no-goldens", "--prompt", "Hello there", "--max-tokens", "1"])
    first = next(s for s in STAGES if _roundings_upstream(s) > 0)

    async def scenario(pilot):
        await press(pilot, "d")
        await press(pilot, "D")
        summary = shown(pilot.app.screen, "#divergence-summary")
        assert f"request 0: fp32 vs fast first differ at position 0 (prompt), {first}: max |diff| " in summary, summary
        table = pilot.app.screen.query_one("#divergence-table")
        rows = [cells(table, i) for i in range(table.row_count)]
        assert [r[0] for r in rows] == STAGES[:-1]   # position 0 samples nothing: it has no logits row
        assert rows[table.cursor_row][0] == first
        assert rows[table.cursor_row][3] == "differ ◀ first"
        assert all(r[3] == "same" for r in rows[:STAGES.index(first)])
    drive(debug_app(args), scenario)


def test_the_view_shows_where_two_recordings_part(tmp_path):
    first = recording(tmp_path / "a.jsonl", [("cmpl-b-0", TARGET, [9, 8, 7, 6])])
    second = recording(tmp_path / "b.jsonl", [("cmpl-x-0", TARGET, [9, 8, 3, 6])])
    args = parse_args(["debug", "--replay", first, "--against", second])
    session, feed = replay_session(first, options=SessionOptions(record_rows=True))
    session.divergence = comparison_for(args, session)

    async def scenario(pilot):
        await press(pilot, "d")   # the request enters and prefills
        await press(pilot, "D")
        summary = shown(pilot.app.screen, "#divergence-summary")
        assert "request cmpl-b-0: a.jsonl vs b.jsonl first differ at output token 2" in summary, summary
        assert "tokens: first differ at output token 2: a.jsonl 7, b.jsonl 3" in summary
    drive(DebuggerApp(session), scenario)


def test_without_a_comparison_the_key_says_which_flags_give_one():
    args = parse_args(["debug", "--no-goldens", "--prompt", "Hi", "--max-tokens", "1"])

    async def scenario(pilot):
        await press(pilot, "D")
        assert "start with --compare-alone" in shown(pilot.app, "#status")
    drive(debug_app(args), scenario)


@pytest.mark.parametrize("argv, message", [
    (["debug", "--compare-alone", "--compare-precision"],
     "compare one thing at a time: --compare-alone and --compare-precision do not combine"),
    (["debug", "--against", "b.jsonl"], "--against FILE2 compares with a replayed recording"),
    (["serve", "--compare-alone"], "--compare-alone is the debugger's: tinyvllm serve --debug --compare-alone"),
])
def test_flags_that_do_not_fit_get_one_line(capsys, argv, message):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_serve_debug_with_compare_alone_reaches_the_view(monkeypatch):
    """tinyvllm serve --debug --compare-alone, its app driven by Pilot: an HTTP client's request stepped to its end,
    then D on it: the same bits alone."""

    seen = {}

    def run_with_pilot(app):
        async def scenario(pilot):
            url, reply = app.session.feed.url, {}
            body = {"prompt": "The sun rose", "max_tokens": 2, "temperature": 0}
            client = threading.Thread(target=lambda: reply.update(
                httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()))
            client.start()
            await until(pilot, lambda: app.session.view().requests)
            await press(pilot, "d")
            await press(pilot, "d")
            await asyncio.get_running_loop().run_in_executor(None, client.join, 120)
            await press(pilot, "D")
            seen["summary"] = shown(pilot.app.screen, "#divergence-summary")
            seen["reply"] = reply
            await pilot.press("escape", "q")
        drive(app, scenario)
    monkeypatch.setattr(DebuggerApp, "run", run_with_pilot)
    assert main(["serve", "--debug", "--compare-alone", "--port", "0"]) == 0
    request_id = seen["reply"]["id"] + "-0"
    assert seen["reply"]["choices"][0]["finish_reason"] == "length"
    assert seen["summary"].startswith(f"request {request_id}: batched vs alone: identical ("), seen["summary"]
    assert "compared bit for bit: " in seen["summary"] and "tokens: the same over 2" in seen["summary"]


def test_debug_replay_with_compare_alone_reaches_the_view(monkeypatch, tmp_path, capsys):
    """tinyvllm debug --replay FILE --compare-alone, its app driven by Pilot: the replay run to its end (c), the cursor
    on the second request (the one of 3 tokens, batched with the other at first), D: the same bits alone."""
    recording = record_two_requests(load_model(log=quiet), tmp_path / "two.jsonl")
    second = recording.requests[1].request_id
    seen = {}

    def run_with_pilot(app):
        async def scenario(pilot):
            await press(pilot, "c")
            pilot.app.query_one("#scheduler-table").move_cursor(row=1)
            await press(pilot, "D")
            seen["summary"] = shown(pilot.app.screen, "#divergence-summary")
            await pilot.press("escape", "q")
        drive(app, scenario)
    monkeypatch.setattr(DebuggerApp, "run", run_with_pilot)
    assert main(["debug", "--replay", str(tmp_path / "two.jsonl"), "--compare-alone"]) == 0
    assert "2/2 requests match token for token" in capsys.readouterr().out
    assert seen["summary"].startswith(f"request {second}: batched vs alone: identical ("), seen["summary"]
    assert "compared bit for bit: " in seen["summary"] and "tokens: the same over 3" in seen["summary"]


def unfinished_recording(path, requests, aborts=()):
    """A recording of fp32 requests (id, prompt ids, max tokens) that arrive at step 0 and never finish in it (the
    replay compares no answers), then `aborts`: (id, step) each."""
    lines = [{"type": "header", "format": FORMAT, "version": VERSION, "model": None,
              "engine_config": {"num_blocks": 32, "block_size": 4, "precision": "fp32"}}]
    lines += [{"type": "request", "id": request_id, "t": 0.0, "step": 0, "prompt_token_ids": prompt,
               "params": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "seed": 1}}
              for request_id, prompt, max_tokens in requests]
    lines += [{"type": "abort", "id": request_id, "t": 0.1, "step": step} for request_id, step in aborts]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def replay_with_pilot(monkeypatch, argv, scenario) -> int:
    """tinyvllm.cli.main(argv), its debugger app driven by `scenario` (then q)."""
    def run_with_pilot(app):
        async def driven(pilot):
            await scenario(pilot)
            await pilot.press("escape", "q")
        drive(app, driven)
    monkeypatch.setattr(DebuggerApp, "run", run_with_pilot)
    return main(argv)


@pytest.mark.slow   # a fast shadow in lockstep
def test_debug_replay_with_compare_precision_shows_where_the_precisions_part(monkeypatch, tmp_path):
    """tinyvllm debug --replay FILE --compare-precision: the recorded request enters and prefills (d), D on it: fp32
    (the recording's) against the fast shadow first differ at the first stage with a bf16 rounding upstream."""
    path = unfinished_recording(tmp_path / "one.jsonl", [("cmpl-r-0", TARGET, 1)])
    first = next(s for s in STAGES if _roundings_upstream(s) > 0)
    seen = {}

    async def scenario(pilot):
        await press(pilot, "d")
        await press(pilot, "D")
        seen["summary"] = shown(pilot.app.screen, "#divergence-summary")
    assert replay_with_pilot(monkeypatch, ["debug", "--replay", path, "--compare-precision"], scenario) == 0
    assert f"request cmpl-r-0: fp32 vs fast first differ at position 0 (prompt), {first}: max |diff| " \
        in seen["summary"], seen["summary"]


@pytest.mark.slow   # a fast shadow in lockstep, three steps
def test_a_replayed_abort_keeps_the_precision_shadow_in_step(monkeypatch, tmp_path):
    """A recording whose first request is aborted before step 1 while the second runs on: replayed with
    --compare-precision to its end (c), the shadow aborted it too and still compares (no other batch)."""
    path = unfinished_recording(tmp_path / "abort.jsonl", [("a", TARGET, 4), ("b", OTHER, 3)], aborts=[("a", 1)])
    seen = {}

    async def scenario(pilot):
        await press(pilot, "c")
        session = pilot.app.session
        seen["stopped"] = session.shadow.stopped
        seen["reasons"] = [(session.engine.request(r).finish_reason, session.shadow.engine.request(r).finish_reason)
                           for r in "ab"]
    assert replay_with_pilot(monkeypatch, ["debug", "--replay", path, "--compare-precision"], scenario) == 0
    assert seen["stopped"] == ""
    assert seen["reasons"] == [("abort", "abort"), ("length", "length")]
