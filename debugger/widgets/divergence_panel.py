"""The divergence view (`D`): where the picked request's two runs part (debugger/divergence.py's report).

The summary names the first (position, stage) whose rows differ bit for bit, the first output token that differs
and the top-1 / top-2 margins there; the table lists every stage at that first differing position with its max abs,
max rel and each run's kernel, the first differing stage marked. The picked request is the scheduler table's
cursor row (the first request when the table has no cursor).
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from debugger.divergence import DivergenceReport

FIRST_STYLE = "bold white on red"
COLUMNS = ("stage", "max abs", "max rel", "bits", "kernels")
NO_COMPARISON = ("D shows where two runs of a request part: start with --compare-alone (the request alone), "
                 "--compare-precision (the other precision) or, with --replay FILE, --against FILE2")


def picked_request(app) -> str | None:
    """The request under the scheduler table's cursor, else the first; None when there is none."""
    table = app.query_one("#scheduler-table", DataTable)
    if table.row_count == 0:
        return None
    row = min(max(table.cursor_row, 0), table.row_count - 1)
    return table.coordinate_to_cell_key((row, 0)).row_key.value


def _short(kernel: str) -> str:
    """A stage's kernel string without what its kernel does besides ("gemm_tc.gemm_tc (q|k|v in one) + rope..."
    -> "gemm_tc.gemm_tc"); "(computed by STAGE)" whole."""
    return kernel if kernel.startswith("(") else kernel.split(" ")[0]


def _number(x: float) -> str:
    return f"{x:.3e}"


class DivergenceScreen(ModalScreen):
    """The report over the panels; escape (or D again) closes it."""
    BINDINGS = [("escape", "app.pop_screen", "close"), ("D", "app.pop_screen", "close")]
    # its own sizes, beside the help box's look (app.tcss #help-box): the table as tall as its stages
    DEFAULT_CSS = """
    DivergenceScreen { align: center middle; }
    DivergenceScreen #divergence-table-title { margin-top: 1; }
    DivergenceScreen #divergence-table { height: auto; max-height: 30; }
    """

    def __init__(self, report: DivergenceReport):
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box") as box:
            box.border_title = f"where request {self.report.request_id}'s runs part (escape closes)"
            yield Static(id="divergence-summary")
            yield Static(id="divergence-table-title")
            yield DataTable(id="divergence-table", cursor_type="row")

    def on_mount(self) -> None:
        report = self.report
        summary = Text()
        for i, line in enumerate(report.lines()):
            style = ("bold green" if report.identical else "bold red") if i == 0 else ""
            summary.append(("\n" if i else "") + line, style=style)
        self.query_one("#divergence-summary", Static).update(summary)
        table = self.query_one("#divergence-table", DataTable)
        title = self.query_one("#divergence-table-title", Static)
        if not report.table:
            table.display = title.display = False
            return
        position, first = report.first
        title.update(Text(f"each stage at {report.where(position)}, {' vs '.join(report.labels)}:", style="bold"))
        table.add_columns(*COLUMNS)
        for diff in report.table:
            is_first = diff.stage == first
            kernels = " / ".join(dict.fromkeys(_short(k) for k in diff.kernels))
            bits = "same" if diff.identical else "differ" + (" ◀ first" if is_first else "")
            style = FIRST_STYLE if is_first else ("" if diff.identical else "red")
            table.add_row(Text(diff.stage, style=style), _number(diff.max_abs), _number(diff.max_rel),
                          Text(bits, style=style), kernels, key=diff.stage)
        table.move_cursor(row=[d.stage for d in report.table].index(first))
