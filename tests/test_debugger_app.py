"""The debugger app driven by Pilot (headless): press keys, read what the panels show."""
import asyncio
import re
import threading

import numpy as np
import pytest
from textual.widgets import DataTable, Static

from debugger.app import DebuggerApp
from debugger.session import Session, SessionOptions, stage_names
from debugger.widgets.help_screen import HelpScreen
from kernels_numba.bf16 import bf16_to_f32_ref
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
from tinyvllm.model.loader import default_model_dir, load_model
from tinyvllm.model.weights import load_weights

PROMPT = [384, 341, 265, 84, 77, 220, 81, 90]   # 8 tokens: two full blocks of 4


def make_app(prompts, goldens=None):
    engine = LLMEngine(None, EngineConfig(num_blocks=32, block_size=4), log=lambda message: None)
    return DebuggerApp(Session(engine, goldens, prompts))


def drive(app, scenario, size=(160, 50)):
    async def run():
        async with app.run_test(size=size) as pilot:
            await scenario(pilot)
    asyncio.run(run())


async def press(pilot, *keys):
    """Press keys and wait until the engine worker is done and its messages are handled."""
    await pilot.press(*keys)
    await settle(pilot)


async def settle(pilot):
    """Wait for the engine worker and for its last message (RunFinished, which clears `busy`) to be handled."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    for _ in range(300):
        if not pilot.app.busy:
            break
        await pilot.pause(0.1)


def text(app, selector) -> str:
    content = app.query_one(selector, Static).content
    return getattr(content, "plain", str(content))


def shown(app, selector) -> str:
    """What a Static shows: its content after markup (which would eat "[id]")."""
    return app.query_one(selector, Static).render().plain


def screen_lines(app) -> list[str]:
    """The terminal as the user sees it, one string a row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def seen_in(app, region) -> list[str]:
    """The rows of the terminal inside `region`."""
    return [line[region.x:region.right] for line in screen_lines(app)[region.y:region.bottom]]


def cells(table: DataTable, row: int) -> list[str]:
    return [getattr(c, "plain", str(c)) for c in table.get_row_at(row)]


def test_stepping_a_stage_then_a_layer_shows_the_stage_and_its_stats():
    host = load_weights(default_model_dir(), load_model(None, log=lambda m: None).config)
    embedding = bf16_to_f32_ref(host["model.embed_tokens.weight"])[PROMPT]  # independent of the kernel
    app = make_app([PROMPT])

    async def scenario(pilot):
        await press(pilot, "s")
        assert "stage embedding · step 0 · #0" in text(app, "#inspector-header")
        assert text(app, "#inspector-stats") == (   # the panel's width takes the short form
            f"(8, 64) float32 min {embedding.min():.4g} max {embedding.max():.4g} "
            f"mean {embedding.astype(np.float64).mean():.4g} std {embedding.astype(np.float64).std():.4g} "
            f"NaN 0 Inf 0")
        values = app.query_one("#inspector-values", DataTable)
        assert cells(values, 7)[:3] == ["0:7", f"{embedding[7, 0]:.4g}", f"{embedding[7, 1]:.4g}"]
        assert "row 7 of 8 · req 0 pos 7" in text(app, "#inspector-row-label")
        await pilot.press("left_square_bracket")
        assert "row 6 of 8 · req 0 pos 6" in text(app, "#inspector-row-label")
        assert text(app, "#status").startswith("ran embedding (embedding.embedding")
        await press(pilot, "l")
        assert "stage layers.0.output · step 0 · #10 · layer 0" in text(app, "#inspector-header")
        assert app.query_one("#timeline").lines[-1].split()[:2] == ["0", "layers.0.output"]
        assert "running 1 · waiting 0" in text(app, "#scheduler-summary")
        assert cells(app.query_one("#scheduler-table", DataTable), 0)[1] == "prefill"
        assert text(app, "#golden-summary") == "goldens: absent (no golden file)"
    drive(app, scenario)


def test_a_block_table_after_two_requests_share_a_prefix():
    app = make_app([PROMPT])

    async def scenario(pilot):
        await press(pilot, "d")                      # prefill: the 8 prompt tokens fill blocks 0 and 1
        await press(pilot, "a")
        assert app.query_one("#command-input").has_class("visible")
        await pilot.press(*"[384, 341, 265, 84, 77, 220, 81, 90, 5, 6]", "enter")  # "d" here must not step
        await pilot.pause()
        assert text(app, "#status") == "added request 1: it joins at the next scheduler step"
        await press(pilot, "s")                      # the next step admits it with a prefix-cache hit
        blocks = text(app, "#blocks-text")
        assert "req 0: 0→0* 1→1* 2→2\n" in blocks
        assert "req 1: 0→0* 1→1* 2→3\n" in blocks
        # 4 blocks referenced, the 2 of the common prefix by both; prefix hits: 8 of the 8 + 10 looked-up tokens
        assert f"usage 4/32 (12.5%) · shared 2 · cached 0 · free 28 · prefix hits {100 * 8 / 18:.1f}%\n" in blocks
        assert " 0   1   2+  3+" in blocks                # only the blocks this step took are marked new
        assert "running 2 · waiting 0" in text(app, "#scheduler-summary")
    drive(app, scenario)


def test_a_corrupted_weight_makes_the_golden_panel_flag_the_first_failing_stage(monkeypatch):
    import tinyvllm.model.loader as model_module

    def corrupted_load(model_dir, config, **kwargs):
        weights = load_weights(model_dir, config, **kwargs)
        w = weights["model.layers.1.mlp.down_proj.weight"].copy()
        w[3, :] = np.uint16(0x4000)  # every weight of output row 3 becomes 2.0
        weights["model.layers.1.mlp.down_proj.weight"] = w
        return weights
    monkeypatch.setattr(model_module, "load_weights", corrupted_load)
    app = make_app(None, Goldens.load(DEFAULT_GOLDENS))   # the first golden prompt, queued by default

    async def scenario(pilot):
        await pilot.press("b", *"golden", "enter")
        await settle(pilot)
        assert text(app, "#status").startswith("breakpoint: golden error at layers.1.mlp: prompt 0")
        assert "first failure: step 0 layers.1.mlp (prompt 0" in text(app, "#golden-summary")
        table = app.query_one("#golden-table", DataTable)
        rows = [cells(table, i) for i in range(table.row_count)]
        assert [r[0] for r in rows][-2:] == ["layers.1.post_norm", "layers.1.mlp"]
        assert all(r[4] == "PASS" for r in rows[:-1])
        assert rows[-1][4] == "FAIL ◀ first failure" and float(rows[-1][3]) > 1e-2
        assert table.cursor_row == len(rows) - 1
    drive(app, scenario)


def test_help_screen_and_cancel():
    app = make_app([PROMPT])
    # The run's first stage waits until x has been pressed: a GPU would otherwise finish the whole 8-token run
    # before the key arrives (the simulator never did), and the test would race the engine.
    running, x_pressed = threading.Event(), threading.Event()
    step_stage = app.session.step_stage

    def first_stage_waits_for_x():
        if not running.is_set():
            running.set()
            assert x_pressed.wait(timeout=60), "x was never pressed"
        return step_stage()
    app.session.step_stage = first_stage_waits_for_x

    async def scenario(pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert any("run until a breakpoint" in line for line in screen_lines(app))
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("c")
        assert await asyncio.get_running_loop().run_in_executor(None, running.wait, 60), "c started no run"
        await pilot.press("x")
        x_pressed.set()
        await settle(pilot)
        status = text(app, "#status")
        assert status.startswith("cancelled after 1 events at ") and "embedding" in status, status
        assert not app.busy and app.session.view().stages_done == 1
    drive(app, scenario)


def test_at_100_by_30_every_column_the_block_grid_and_every_key_fit():
    # as `tinyvllm debug` opens: the first golden prompt (27 tokens) queued, a pool of 64 blocks of 4
    engine = LLMEngine(None, EngineConfig(num_blocks=64, block_size=4), log=lambda message: None)
    app = DebuggerApp(Session(engine, Goldens.load(DEFAULT_GOLDENS)))

    async def scenario(pilot):
        await press(pilot, "d")                            # the whole prefill step: every panel has content
        screen = app.screen.region
        for panel in ("#scheduler", "#inspector", "#golden", "#blocks", "#timeline", "#status", "Footer"):
            region = app.query_one(panel).region
            assert region.area and screen.contains_region(region), (panel, region)
        for table in ("#scheduler-table", "#golden-table"):       # no column cut off or scrolled away
            t = app.query_one(table, DataTable)
            assert t.virtual_size.width <= t.scrollable_content_region.width, (table, t.virtual_size)
        golden = app.query_one("#golden-table", DataTable)
        rendered = [golden.render_line(y).text for y in range(golden.scrollable_content_region.height)]
        assert rendered[0].split() == ["stage", "prompt", "max", "rel", "result"]
        names = set(stage_names(2))
        shown = [re.fullmatch(r"\s*(\S+)\s+p0\s+\d\.\d{3}e[+-]\d\d\s+PASS\s*", line) for line in rendered[1:]]
        assert all(m and m.group(1) in names for m in shown) and len(shown) >= 5, rendered   # nothing truncated
        values = app.query_one("#inspector-values", DataTable)
        logits = app.session.view().stage.values
        assert logits.shape[0] == 27     # every prompt position: the golden comparison asks for all logits
        assert values.render_line(1).text.split()[:2] == ["0:0", f"{logits[0, 0]:.4g}"]
        scheduler = cells(app.query_one("#scheduler-table", DataTable), 0)
        assert scheduler[-1] == "p0 1/1"                           # the golden column, in view
        blocks = app.query_one("#blocks")                          # the whole grid in view, no scrolling
        lines = text(app, "#blocks-text").splitlines()
        grid_end = next(i for i, line in enumerate(lines) if line.startswith("block tables"))
        assert grid_end <= blocks.scrollable_content_region.height and blocks.scroll_y == 0
        assert max(len(line) for line in lines[:grid_end]) <= blocks.scrollable_content_region.width
        assert lines[2].startswith(" 0+ 1+ 2+") and lines[grid_end - 1].rstrip().endswith("63")   # 7 new blocks
        keys = [k for k in app.query("FooterKey") if k.description]
        assert {k.description for k in keys} >= {"stage", "layer", "step", "help", "quit"}
        assert all(screen.contains_region(k.region) for k in keys)
        assert values.scrollable_content_region.height >= 2       # the header and at least one row of values
    drive(app, scenario, size=(100, 30))


def test_status_lines_read_as_text():
    app = make_app([PROMPT])

    async def scenario(pilot):
        await press(pilot, "d")
        token = app.session.view().requests[0].output_token_ids[0]
        word = app.session.engine.tokenizer.decode([token])
        assert shown(app, "#status") == f"stopped after 24 events: step 0 done: req 0: {token} {word!r}"
        await pilot.press("b", *"bogus", "enter")        # markup would eat [id] and [threshold]
        await pilot.pause()
        assert shown(app, "#status").endswith("finished [ID glob | from CLIENT] | golden [THRESHOLD] | "
                                              "arrival [CLIENT] | kv FRACTION|PCT% | preemption | prefix-hit | slow MS")
    drive(app, scenario)


BREAKPOINT_KEY = ("run until a breakpoint: layer N · stage NAME (globs: layers.*.mlp) · finished [ID glob | from "
                  "CLIENT] · golden [THRESHOLD] · arrival [CLIENT] · kv 80% · preemption · prefix-hit · slow MS")


@pytest.mark.parametrize("width", [80, 120, 160])
def test_the_help_wraps_each_action_in_a_column_beside_its_key(width):
    app = make_app([PROMPT])

    async def scenario(pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#help-box").content_region
        lines = seen_in(app, box)
        start = next(i for i, line in enumerate(lines) if "run until a breakpoint" in line)
        column = lines[start].index("run until")
        assert lines[start][:column].split() == ["b"]
        entry = [lines[start]]
        for line in lines[start + 1:]:           # the wrapped rest: under the action, never under the key
            if line[:column].strip():
                assert line[:column].split() == ["B"], (line, lines)   # the next key
                break
            entry.append(line)
        assert " ".join(" ".join(line[column:].split()) for line in entry).strip() == BREAKPOINT_KEY
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
    drive(app, scenario, size=(width, 40))


@pytest.mark.parametrize("width", [80, 120])
def test_a_rejected_request_is_announced_with_its_whole_error_above_the_progress_bar(width):
    app = make_app([PROMPT])
    vocab = app.session.engine.model.config.vocab_size
    bad = [vocab + i for i in range(5)]

    async def scenario(pilot):
        await press(pilot, "s")
        await pilot.press("a", *str([5, *bad]), "enter")
        await pilot.pause()
        error = f"rejected request 1: token ids outside the vocabulary [0, {vocab}): {bad}"
        screen = app.screen.region
        status, progress = app.query_one("#status").region, app.query_one("#progress").region
        assert screen.contains_region(status) and screen.contains_region(progress)
        assert not status.overlaps(progress)
        assert " ".join(" ".join(seen_in(app, status)).split()) == error     # all of it, wrapped
        assert seen_in(app, progress)[0].split()[-1] == "4%"                # 1 of 23 stages, not cut off
        assert "joins at the next" not in shown(app, "#status")
        assert app.session.view().requests[1].state == "error"
    drive(app, scenario, size=(width, 40))


def test_the_title_says_done_only_once_the_run_has_ended():
    engine = LLMEngine(None, EngineConfig(num_blocks=32, block_size=4), log=lambda message: None)
    one_token = SessionOptions(SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    app = DebuggerApp(Session(engine, None, [[5, 6, 7]], one_token))

    async def scenario(pilot):
        assert app.sub_title == "step 0 · ready"
        await press(pilot, "s")
        assert "done" not in app.sub_title and "ready" not in app.sub_title
        await press(pilot, "c")
        assert app.sub_title == "step 1 · done"
    drive(app, scenario)


def test_below_100_by_30_a_warning_and_the_requests_blocks_status_and_keys_still_show():
    app = make_app([PROMPT])

    async def scenario(pilot):
        await pilot.pause()
        warning = app.query_one("#size-warning")
        assert seen_in(app, warning.region)[0].strip() == (
            "terminal is 80x24; the tensor and golden panels need at least 100x30")
        assert not app.query_one("#inspector").display or not app.query_one("#middle").display
        screen = app.screen.region
        shown_regions = [app.query_one(s).region for s in ("#scheduler", "#blocks", "#timeline", "#status",
                                                           "#progress", "Footer")]
        assert all(r.area and screen.contains_region(r) for r in shown_regions), shown_regions
        assert not any(a.overlaps(b) for i, a in enumerate(shown_regions) for b in shown_regions[i + 1:])
        assert any("step" in line and "stage" in line for line in seen_in(app, shown_regions[-1]))  # the keys
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert not warning.display and app.query_one("#inspector").region.area
    drive(app, scenario, size=(80, 24))
