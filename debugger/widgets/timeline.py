"""Timeline: every schedule, stage and step end, with kernel names and host wall times."""
from __future__ import annotations

from textual.widgets import Log

from debugger.session import TimelineEntry


def format_entry(e: TimelineEntry) -> str:
    """`  0  layers.0.attn   61.7 ms  paged_attention...`: step, stage and time first, so a narrow panel still
    shows them (the kernel scrolls)."""
    ms = "" if e.seconds is None else f"{e.seconds * 1000:.1f} ms"
    return f"{e.step:>3}  {e.name:<22} {ms:>9}  {e.kernel}"


class TimelinePanel(Log):
    def __init__(self, **kwargs):
        super().__init__(max_lines=5000, **kwargs)
        self.shown = 0

    def on_mount(self) -> None:
        self.border_title = "Timeline · step · stage · host time · kernel"

    def show(self, timeline: tuple[TimelineEntry, ...]) -> None:
        if len(timeline) < self.shown:  # a reset
            self.clear()
            self.shown = 0
        new = timeline[self.shown:]
        if new:
            self.write_lines([format_entry(e) for e in new])
            self.shown = len(timeline)
