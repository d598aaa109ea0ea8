"""Scheduler panel: every request with its state, prompt, progress, output so far and latencies.

With a feed of requests (serve --debug, debug --replay) three more columns say who sent each request,
its sampling parameters and what its client has received; the summary line names the server and the
standing breakpoints. Below WIDE_COLUMNS columns the cells are shorter (prompt and output cut sooner, no finish reason, golden
prompt and agreeing greedy tokens without the word "greedy"), so every column stays in view at 100 wide.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from debugger.session import RequestView, SessionView

STATE_STYLES = {"arrived": "bold yellow", "due": "dim", "waiting": "yellow", "preempted": "magenta", "prefill": "cyan", "chunked": "cyan",
                "decode": "green", "finished": "dim", "error": "red"}
RUNNING = ("prefill", "chunked", "decode")
WIDE_COLUMNS = 120
COLUMNS = {False: ("id", "state", "prompt", "prompt/done/out", "output", "TTFT ms", "ITL ms", "golden"),
           True: ("id", "state", "prompt", "p/done/out", "output", "TTFT ms", "ITL ms", "golden")}
SERVING_COLUMNS = ("client", "params", "stream")   # with a feed (serve --debug, debug --replay)
PROMPT_CHARS = {False: 28, True: 18}
OUTPUT_CHARS = {False: 24, True: 14}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _cut(text: str, limit: int) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _short_id(request_id: str, limit: int = 16) -> str:
    """A served request's id (cmpl-<32 hex digits>-0) cut in the middle: cmpl-779bc5…-0."""
    if len(request_id) <= limit:
        return request_id
    head, sep, tail = request_id.rpartition("-")
    if not sep or len(tail) > 4:
        head, tail = request_id, ""
    return head[:limit - len(tail) - 2] + "…" + (f"-{tail}" if tail else "")


class SchedulerPanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.view: SessionView | None = None
        self.columns_for: tuple[bool, bool] | None = None   # (compact, serving columns)

    def compose(self) -> ComposeResult:
        yield Static(id="scheduler-summary")
        yield DataTable(id="scheduler-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.border_title = "Scheduler"

    def on_resize(self) -> None:
        if self.view is not None and self.columns_for[0] != (0 < self.size.width < WIDE_COLUMNS):
            self.show(self.view)

    def show(self, view: SessionView) -> None:
        self.view = view
        states = [r.state for r in view.requests]
        running = sum(s in RUNNING for s in states)
        waiting = sum(s in ("waiting", "preempted") for s in states)
        finished = sum(s in ("finished", "error") for s in states)
        where = f"step {view.step} in progress" if view.in_step else f"before step {view.step}"
        arrived = sum(s in ("arrived", "due") for s in states)
        self.query_one("#scheduler-summary", Static).update(Text(
            (f"{view.serving} · " if view.serving else "")
            + f"{where} · running {running} · waiting {waiting} · finished {finished}"
            + (f" · arrived {arrived}" if arrived else "")
            + (" · all requests done" if view.idle and not arrived else "")
            + (f" · breakpoints: {', '.join(view.breakpoints)}" if view.breakpoints else "")))
        table = self.query_one("#scheduler-table", DataTable)
        layout = (0 < self.size.width < WIDE_COLUMNS, bool(view.serving))
        if layout != self.columns_for:
            self.columns_for = layout
            table.clear(columns=True)
            columns = list(COLUMNS[layout[0]])
            if layout[1]:   # who sent it and what they got, next to the state
                columns[2:2] = SERVING_COLUMNS
            table.add_columns(*columns)
        table.clear()
        for r in view.requests:
            cells = self._cells(r, layout[0])
            if layout[1]:
                cells[0] = _short_id(r.request_id)
                cells[2:2] = [r.client or "-", r.params, r.stream]
            table.add_row(*cells, key=r.request_id)

    @staticmethod
    def _cells(r: RequestView, compact: bool = False) -> list:
        prompt = _cut(r.prompt, PROMPT_CHARS[compact])
        output = _cut(r.error or r.output_text, OUTPUT_CHARS[compact])
        state = r.state
        if r.finish_reason and r.state != "error" and not compact:
            state += f" ({r.finish_reason})"
        golden = "-" if r.golden_prompt is None else f"p{r.golden_prompt}"
        if r.greedy_agree is not None:
            golden += f" {r.greedy_agree[0]}/{r.greedy_agree[1]}" + ("" if compact else " greedy")
        return [r.request_id, Text(state, style=STATE_STYLES.get(r.state, "")), prompt,
                f"{r.num_prompt_tokens}/{r.num_computed_tokens}/{len(r.output_token_ids)}", output,
                _ms(r.ttft), _ms(r.itl_mean), golden]
