"""The course's tour in the debugger, through Pilot (headless): `tinyvllm debug --tour` walks every lesson at its
stage, the lesson beside the tensor panel; `o` shows the code a lesson cites; a user who stops at a lesson's stage
on their own gets that lesson (L)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Static

from debugger.cli import debug_app
from debugger.widgets.lesson_panel import LessonPanel
from debugger.widgets.source_screen import SourceScreen
from tests.test_debugger_app import drive, press, settle, shown
from tinyvllm.cli import parse_args
from tinyvllm.course import load_lessons

LESSONS = load_lessons()
ROOT = Path(__file__).resolve().parent.parent


def at_stage(app, stage: str) -> bool:
    """Whether the engine stands where a lesson's Stage header says, read from the session's own view."""
    view = app.session.view()
    if stage == "start":
        return not view.in_step
    if stage == "step-end":
        return not view.in_step and view.step > 0 and view.stages_done == 0 and view.stage.name == "logits"
    return view.in_step and view.stage.name == stage and f"{stage} · step {view.step}" in shown(
        app, "#inspector-header")


def definition_line(path: str, name: str | None) -> str:
    """The line that defines `name` (a def, class or assignment; Class.method: the method), read with a regex."""
    from tinyvllm.course.lessons import SOURCE_ROOT
    source = (SOURCE_ROOT / path).read_text(encoding="utf-8")
    last = name.split(".")[-1]
    match = re.search(rf"^\s*(?:async def|def|class) {last}\b.*$|^{last}\s*(?::[^=]*)?=.*$", source, re.M)
    assert match, (path, name)
    return match.group(0).strip()


@pytest.mark.slow
def test_the_tour_stops_at_every_chapters_stage_with_its_lesson_beside_the_tensor_panel():
    app = debug_app(parse_args(["debug", "--tour"]))
    assert [lesson.number for lesson in app.tour.lessons] == [lesson.number for lesson in LESSONS]

    async def scenario(pilot):
        await settle(pilot)
        panel = app.query_one(LessonPanel)
        for k, lesson in enumerate(LESSONS, start=1):
            engine = app.session.engine
            if k > 1:
                await press(pilot, "n")
            fresh = " (the requests had finished: a fresh engine)" if app.session.engine is not engine else ""
            where = f"chapter {k} of {len(LESSONS)} · {lesson.number:02d}. {lesson.title}"
            assert panel.display and panel.region.area, "the lesson panel is not on screen"
            assert shown(app, "#lesson-title") == where
            assert at_stage(app, lesson.stage), (lesson.name, lesson.stage, app.session.view().stage)
            assert shown(app, "#status") == f"{where} · at {lesson.stage}, step {app.session.view().step}{fresh}"
        await press(pilot, "n")
        assert shown(app, "#status").endswith("the tour's last chapter")
    drive(app, scenario, size=(160, 50))


def test_stopping_at_a_lessons_stage_by_hand_shows_that_lesson_and_its_code():
    lesson = next(lesson for lesson in LESSONS if lesson.stage not in ("start", "step-end") and lesson.code[0].name)
    app = debug_app(parse_args(["debug"]))

    async def scenario(pilot):
        panel = app.query_one(LessonPanel)
        await pilot.press("b", *f"stage {lesson.stage}", "enter")
        await settle(pilot)
        assert app.session.view().stage.name == lesson.stage
        assert not panel.display or not panel.region.area, "outside the tour the panel waits for L"
        assert app.sub_title == f"step 0 · {lesson.stage} · lesson {lesson.number:02d}: L"
        await pilot.press("L")
        await pilot.pause()
        assert panel.region.area
        assert shown(app, "#lesson-title") == f"{lesson.number:02d}. {lesson.title}"
        scroll = app.query_one("#lesson-scroll")
        assert scroll.max_scroll_y > 0, "a lesson longer than its panel"
        await pilot.press("pagedown")
        await pilot.pause()
        assert scroll.scroll_y > 0
        await pilot.press("o")
        await pilot.pause()
        assert isinstance(app.screen, SourceScreen)
        source = app.screen.query_one("#source-text", Static)
        lines = [source.render_line(y).text for y in range(source.region.height)]
        ref = lesson.code[0]
        assert lines[0].startswith(f"{ref.path}:{ref.name}  (lines ")
        definition = definition_line(ref.path, ref.name)     # after its decorators, if any
        assert any(definition in line for line in lines[1:4]), lines[:4]
    drive(app, scenario, size=(160, 50))


def test_n_starts_the_tour_and_p_goes_back_a_chapter_on_a_100_by_30_screen():
    first, second = LESSONS[0], LESSONS[1]
    app = debug_app(parse_args(["debug"]))

    async def scenario(pilot):
        await press(pilot, "n")                     # outside the tour, n starts it
        assert shown(app, "#lesson-title") == f"chapter 1 of {len(LESSONS)} · {first.number:02d}. {first.title}"
        screen = app.screen.region
        lesson = app.query_one(LessonPanel)
        assert lesson.region.area and screen.contains_region(lesson.region)
        assert not app.query_one("#golden").display, "a narrow screen gives the golden panel's place to the lesson"
        await press(pilot, "n")
        assert shown(app, "#lesson-title").startswith(f"chapter 2 of {len(LESSONS)} · {second.number:02d}.")
        assert at_stage(app, second.stage)
        await press(pilot, "p")
        assert shown(app, "#lesson-title").startswith(f"chapter 1 of {len(LESSONS)} · {first.number:02d}.")
        assert at_stage(app, first.stage)
        await press(pilot, "p")
        assert shown(app, "#status").endswith("the tour's first chapter")
    drive(app, scenario, size=(100, 30))


def test_tour_with_replay_is_refused_in_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tinyvllm.cli", "debug", "--tour", "--replay", "session.jsonl"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: --tour steps the debugger's own requests; it does not combine with "
                                   "--replay"), done.stderr


def test_a_standing_breakpoint_on_the_way_stops_the_tour_short_and_n_goes_on_to_the_same_chapter():
    from debugger.tour import Tour
    k = next(i for i, lesson in enumerate(LESSONS) if lesson.stage not in ("start", "step-end", "embedding"))
    lesson = LESSONS[k]
    app = debug_app(parse_args(["debug"]))
    app.tour = Tour(LESSONS, index=k - 1, arrived=True)     # as if the tour stood at the chapter before

    async def scenario(pilot):
        await pilot.press("B", *"stage embedding", "enter")
        await press(pilot, "n")
        assert shown(app, "#status").endswith(f"stopped short of {lesson.stage} (stage embedding); n runs on to it")
        assert at_stage(app, "embedding")
        await press(pilot, "n")
        where = f"chapter {k + 1} of {len(LESSONS)} · {lesson.number:02d}. {lesson.title}"
        assert shown(app, "#lesson-title") == where
        assert at_stage(app, lesson.stage)
    drive(app, scenario, size=(160, 50))
