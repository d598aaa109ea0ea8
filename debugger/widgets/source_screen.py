"""The code a lesson cites, over the panels (`o`): the function of its first Code reference, then its Lesson
code, each with its file and line range, scrollable; escape closes it."""
from __future__ import annotations

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from debugger.tour import Excerpt


def render_excerpts(shown: list[Excerpt | str]) -> Group:
    parts = []
    for item in shown:
        if isinstance(item, str):   # a reference that cannot be read: say which
            parts.append(Text(item, style="bold red"))
            continue
        parts.append(Text(f"{item.reference}  (lines {item.first_line}-{item.last_line})", style="bold"))
        parts.append(Syntax(item.text, "python", line_numbers=True, start_line=item.first_line,
                            word_wrap=False, theme="ansi_dark"))
        parts.append(Text(""))
    return Group(*parts)


class SourceScreen(ModalScreen):
    BINDINGS = [("escape", "app.pop_screen", "close"), ("o", "app.pop_screen", "close")]

    def __init__(self, title: str, shown: list[Excerpt | str]):
        super().__init__()
        self.title_text, self.shown = title, shown

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="source-box") as box:
            box.border_title = self.title_text
            box.border_subtitle = "arrows / page keys scroll · escape closes"
            yield Static(render_excerpts(self.shown), id="source-text")

    def on_mount(self) -> None:
        self.query_one("#source-box").focus()
