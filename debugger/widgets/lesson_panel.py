"""The lesson panel, beside the tensor panel: the course's lesson about the stage the engine stands at (in the
tour, the current chapter's), as rendered markdown, with its heading and the keys that move on.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from tinyvllm.course import Lesson

TOUR_KEYS = "n next chapter · p back · o its code · pgup/pgdn scroll · L hide"
FREE_KEYS = "o its code · n starts the tour · pgup/pgdn scroll · L hide"


class LessonPanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lesson: Lesson | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="lesson-title")
        yield Static(id="lesson-where")
        yield Static(id="lesson-keys")
        with VerticalScroll(id="lesson-scroll"):
            yield Markdown(id="lesson-text")

    def on_mount(self) -> None:
        self.border_title = "Lesson"

    def show(self, lesson: Lesson | None, heading: str | None, stage: str, touring: bool) -> None:
        """`heading`: the tour's `chapter k of N · title` (None outside the tour); `stage`: where the session is."""
        title = self.query_one("#lesson-title", Static)
        where = self.query_one("#lesson-where", Static)
        self.query_one("#lesson-keys", Static).update(Text(TOUR_KEYS if touring else FREE_KEYS, style="dim"))
        if lesson is None:
            title.update(Text(f"no lesson stops at {stage}", style="bold"))
            where.update(Text("step on (s, l, d, b) to a stage a lesson explains", style="dim"))
        else:
            title.update(Text(heading or f"{lesson.number:02d}. {lesson.title}", style="bold"))
            code = ", ".join(str(ref) for ref in lesson.code[:1] + tuple(lesson.lesson_code))
            where.update(Text.assemble(("stage ", "dim"), lesson.stage, ("\ncode ", "dim"), code))
        if lesson is not self.lesson:
            self.lesson = lesson
            self.query_one("#lesson-text", Markdown).update(lesson.body if lesson else "")
            self.query_one("#lesson-scroll", VerticalScroll).scroll_home(animate=False)

    def scroll_text(self, pages: int) -> None:
        scroll = self.query_one("#lesson-scroll", VerticalScroll)
        scroll.scroll_to(y=scroll.scroll_y + pages * max(1, scroll.size.height - 2), animate=False)
