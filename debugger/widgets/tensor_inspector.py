"""Tensor inspector: the latest stage's output: stats, a sparkline of one token's row, a slice of values.

The output is viewed as [tokens, features] (q/k/v's heads flattened); `[` and `]` pick the row. Each row
is labelled request:position (a mixed batch holds several requests' tokens, and the logits of a step
without golden prompts only the rows that sample). With --compare-precision the row line adds the row's
max |main - other precision|.
"""
from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from debugger.session import StageRecord, as_rows

MAX_ROWS, MAX_COLS = 64, 48
NARROW = 60   # below this many columns: shorter header and row line


class TensorInspector(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.record: StageRecord | None = None
        self.row = -1   # which token's row the sparkline shows; -1 = the last

    def compose(self) -> ComposeResult:
        yield Static("no stage has run yet: press s", id="inspector-header")
        yield Static(id="inspector-stats")
        yield Static(id="inspector-row-label")
        yield Sparkline([], id="inspector-sparkline")
        yield DataTable(id="inspector-values", zebra_stripes=True)

    def on_mount(self) -> None:
        self.border_title = "Tensor"

    def on_resize(self) -> None:
        if self.record is not None:  # the text lines fit themselves to the width; the table scrolls
            self._show_text(self.record)
            self._show_row()

    def show(self, record: StageRecord | None) -> None:
        if record is None:
            self.query_one("#inspector-header", Static).update("no stage has run yet: press s")
            self.query_one("#inspector-stats", Static).update("")
            self.query_one("#inspector-values", DataTable).clear(columns=True)
            self.query_one("#inspector-sparkline", Sparkline).data = []
            self.record = None
            return
        if record is self.record:
            return
        self.record = record
        self._show_text(record)
        self._show_values(as_rows(record.values), record.row_labels)
        self._show_row()

    def _show_text(self, record: StageRecord) -> None:
        narrow = self.size.width < NARROW
        layer = "" if record.layer is None or narrow else f" · layer {record.layer}"  # narrow: in the name
        self.query_one("#inspector-header", Static).update(Text.assemble(
            ("" if narrow else "stage ", "dim"), (record.name, "bold"),
            f" · step {record.step} · #{record.index}{layer}\n",
            ("kernel ", "dim"), record.kernel, f" · {record.seconds * 1000:.1f} ms",
            *((("\nedited ", "bold red"), "; ".join(f"{e.select} = {e.expr}" for e in record.edits))
              if record.edits else ())))
        self.query_one("#inspector-stats", Static).update(Text(record.stats.describe(self.size.width or None)))

    def select_row(self, delta: int) -> None:
        if self.record is None:
            return
        rows = as_rows(self.record.values).shape[0]
        current = self.row % rows
        self.row = (current + delta) % rows
        self._show_row()

    def _show_row(self) -> None:
        values = as_rows(self.record.values)
        row = self.row % values.shape[0]
        data = values[row].astype(np.float64)
        finite = np.where(np.isfinite(data), data, 0.0)
        labels = self.record.row_labels
        owner = ""
        if labels:
            request, position = labels[row].split(":")
            owner = f" · req {request} pos {position}"
        extent = f" · min {finite.min():.4g} max {finite.max():.4g}" if self.size.width >= NARROW else ""
        precision = self.record.precision
        if precision is not None and row < len(precision.row_max_abs):  # --compare-precision: this row's max |Δ|
            extent += f" · {precision.label} max abs {precision.row_max_abs[row]:.3e}"
        self.query_one("#inspector-row-label", Static).update(Text(f"row {row} of {values.shape[0]}{owner}{extent}:"))
        self.query_one("#inspector-sparkline", Sparkline).data = finite.tolist()

    def _show_values(self, values: np.ndarray, labels: tuple[str, ...] = ()) -> None:
        table = self.query_one("#inspector-values", DataTable)
        table.clear(columns=True)
        rows, cols = min(values.shape[0], MAX_ROWS), min(values.shape[1], MAX_COLS)
        table.add_column("req:pos" if labels else "row")
        table.add_columns(*[str(c) for c in range(cols)])
        if cols < values.shape[1]:
            table.add_column(f"…{values.shape[1] - cols} more")
        for r in range(rows):
            cells = [f"{v:.4g}" for v in values[r, :cols]]
            table.add_row(labels[r] if labels else str(r), *cells, *(["…"] if cols < values.shape[1] else []))
        if rows < values.shape[0]:
            table.add_row(f"…{values.shape[0] - rows} more", *[""] * (len(table.columns) - 1))
