"""Golden diff: this step's stages against the golden file, per golden prompt; the first failure stands out.

Absent goldens (no golden file, no golden prompt in the batch, decode steps past the golden prompt)
are shown as absent, never as a pass.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..session import GoldenRow, GoldenView

STATUS_STYLES = {"pass": "green", "fail": "bold red", "absent": "yellow"}
FIRST_FAILURE_STYLE = "bold white on red"


def _number(x: float) -> str:
    return "-" if x != x else f"{x:.3e}"


class GoldenDiffPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="golden-summary")
        table = DataTable(id="golden-table", cursor_type="row")
        table.add_columns("stage", "prompt", "max abs", "max rel", "result")
        yield table

    def on_mount(self) -> None:
        self.border_title = "Golden diff"

    def show(self, golden: GoldenView) -> None:
        summary = Text()
        if golden.source is None:
            summary.append("goldens: absent (no golden file)", style="yellow")
        else:
            summary.append(f"goldens: {golden.source} · pass when max|ours-golden|/max|golden| <= "
                           f"{golden.rtol:g}\n")
            first = golden.first_failure
            if first is None:
                summary.append("first failure: none so far", style="green")
            else:
                summary.append(f"first failure: step {first.step} {first.stage} (prompt {first.prompt}, "
                               f"rel {_number(first.max_rel)})", style=FIRST_FAILURE_STYLE)
            if golden.absent_reason:
                summary.append(f"\nthis step: absent: {golden.absent_reason}", style="yellow")
        self.query_one("#golden-summary", Static).update(summary)
        table = self.query_one("#golden-table", DataTable)
        table.clear()
        first_row = None
        for i, row in enumerate(golden.rows):
            is_first = row == golden.first_failure
            first_row = i if is_first else first_row
            table.add_row(*self._cells(row, is_first))
        if golden.rows:
            table.move_cursor(row=first_row if first_row is not None else len(golden.rows) - 1)

    @staticmethod
    def _cells(row: GoldenRow, is_first: bool) -> list:
        style = FIRST_FAILURE_STYLE if is_first else STATUS_STYLES[row.status]
        result = row.status.upper() + (" ◀ first failure" if is_first else "")
        if row.note and row.status != "absent":
            result += f" ({row.note})"
        return [Text(row.stage, style=style if is_first else ""), f"p{row.prompt}", _number(row.max_abs),
                _number(row.max_rel), Text(result, style=style)]
