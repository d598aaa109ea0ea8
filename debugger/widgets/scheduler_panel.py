"""Scheduler panel: every request with its state, prompt, progress, output so far and latencies."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..session import RequestView, SessionView

STATE_STYLES = {"waiting": "yellow", "preempted": "magenta", "prefill": "cyan", "chunked": "cyan",
                "decode": "green", "finished": "dim", "error": "red"}
RUNNING = ("prefill", "chunked", "decode")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


class SchedulerPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="scheduler-summary")
        table = DataTable(id="scheduler-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("id", "state", "prompt", "prompt/done/out", "output", "TTFT ms", "ITL ms", "golden")
        yield table

    def on_mount(self) -> None:
        self.border_title = "Scheduler"

    def show(self, view: SessionView) -> None:
        states = [r.state for r in view.requests]
        running = sum(s in RUNNING for s in states)
        waiting = sum(s in ("waiting", "preempted") for s in states)
        finished = sum(s in ("finished", "error") for s in states)
        where = f"step {view.step} in progress" if view.in_step else f"before step {view.step}"
        self.query_one("#scheduler-summary", Static).update(
            f"{where} · running {running} · waiting {waiting} · finished {finished}"
            + (" · all requests done" if view.idle else ""))
        table = self.query_one("#scheduler-table", DataTable)
        table.clear()
        for r in view.requests:
            table.add_row(*self._cells(r), key=r.request_id)

    @staticmethod
    def _cells(r: RequestView) -> list:
        prompt = r.prompt.replace("\n", "⏎")
        prompt = prompt if len(prompt) <= 28 else prompt[:27] + "…"
        output = (r.error or r.output_text).replace("\n", "⏎")
        output = output if len(output) <= 24 else output[:23] + "…"
        state = r.state + (f" ({r.finish_reason})" if r.finish_reason and r.state != "error" else "")
        golden = "-" if r.golden_prompt is None else f"p{r.golden_prompt}"
        if r.greedy_agree is not None:
            golden += f" {r.greedy_agree[0]}/{r.greedy_agree[1]} greedy"
        return [r.request_id, Text(state, style=STATE_STYLES.get(r.state, "")), prompt,
                f"{r.num_prompt_tokens}/{r.num_computed_tokens}/{len(r.output_token_ids)}", output,
                _ms(r.ttft), _ms(r.itl_mean), golden]
