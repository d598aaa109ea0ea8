"""Golden diff: this step's stages against the golden file, per golden prompt; the first failure stands out.

With `--compare-precision` a line under the summary gives the current stage against the other precision's
engine (max abs, max rel = max|main - other| / max|main|), or why there is none (e.g. the precisions diverged).
Absent goldens (no golden file, no golden prompt in the batch, decode steps past the golden prompt)
are shown as absent, never as a pass. Below WIDE_COLUMNS columns the table drops "max abs" (the verdict
is on "max rel") and the notes, so the verdict stays in view at 100 wide.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from debugger.session import GoldenRow, GoldenView

STATUS_STYLES = {"pass": "green", "fail": "bold red", "absent": "yellow"}
FIRST_FAILURE_STYLE = "bold white on red"
WIDE_COLUMNS = 76   # the full table: a 22-character stage, two numbers, "FAIL ◀ first failure"
COLUMNS = {False: ("stage", "prompt", "max abs", "max rel", "result"), True: ("stage", "prompt", "max rel", "result")}


def _number(x: float) -> str:
    return "-" if x != x else f"{x:.3e}"


class GoldenDiffPanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.golden: GoldenView | None = None
        self.compact: bool | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="golden-summary")
        yield DataTable(id="golden-table", cursor_type="row")

    def on_mount(self) -> None:
        self.border_title = "Golden diff"

    def on_resize(self) -> None:
        if self.golden is not None and self.compact != (0 < self.size.width < WIDE_COLUMNS):
            self.show(self.golden)

    def show(self, golden: GoldenView) -> None:
        self.golden = golden
        compact = 0 < self.size.width < WIDE_COLUMNS
        summary = Text()
        if golden.source is None:
            summary.append("goldens: absent (no golden file)", style="yellow")
        else:
            summary.append(f"goldens: {golden.source} · pass when " +
                           (f"max rel <= {golden.rtol:g}\n" if compact else
                            f"max|ours-golden|/max|golden| <= {golden.rtol:g}\n"))
            first = golden.first_failure
            if first is None:
                summary.append("first failure: none so far", style="green")
            else:
                summary.append(f"first failure: step {first.step} {first.stage} (prompt {first.prompt}, "
                               f"rel {_number(first.max_rel)})", style=FIRST_FAILURE_STYLE)
            if golden.absent_reason:
                summary.append(f"\nthis step: absent: {golden.absent_reason}", style="yellow")
        if golden.precision is not None:
            summary.append(("\n" if summary else "") + golden.precision.describe(), style="cyan")
        elif golden.precision_note:
            summary.append(("\n" if summary else "") + golden.precision_note, style="yellow")
        self.query_one("#golden-summary", Static).update(summary)
        table = self.query_one("#golden-table", DataTable)
        if compact != self.compact:
            self.compact = compact
            table.clear(columns=True)
            table.add_columns(*COLUMNS[compact])
        table.clear()
        first_row = None
        for i, row in enumerate(golden.rows):
            is_first = row == golden.first_failure
            first_row = i if is_first else first_row
            table.add_row(*self._cells(row, is_first, compact))
        if golden.rows:
            table.move_cursor(row=first_row if first_row is not None else len(golden.rows) - 1)

    @staticmethod
    def _cells(row: GoldenRow, is_first: bool, compact: bool = False) -> list:
        style = FIRST_FAILURE_STYLE if is_first else STATUS_STYLES[row.status]
        result = row.status.upper() + ((" ◀" if compact else " ◀ first failure") if is_first else "")
        if row.note and row.status != "absent" and not compact:
            result += f" ({row.note})"
        cells = [Text(row.stage, style=style if is_first else ""), f"p{row.prompt}", _number(row.max_abs),
                 _number(row.max_rel), Text(result, style=style)]
        return cells[:2] + cells[3:] if compact else cells
