"""The help screen (`?`): what each key does and how to write a breakpoint.

Nothing here is wrapped by hand: each key's action and each note is one string, and the screen wraps them to
its width (the actions in a column of their own, beside the keys)."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

TITLE = "tinyvllm step-through debugger"
KEYS = (
    ("s", "step one stage of the forward pass (after the logits: finish the step: sample, stop rules)"),
    ("l", "step to the end of the current layer (outside the layers: to the logits)"),
    ("d", "step one decode step: the rest of the current scheduler step, or a whole one"),
    ("c", "continue until every request has finished or a standing breakpoint hits "
          "(serve --debug: serve until one)"),
    ("b", "run until a breakpoint: layer N · stage NAME (globs: layers.*.mlp) · finished [ID glob | from CLIENT] "
          "· golden [THRESHOLD] · arrival [CLIENT] · kv 80% · preemption · prefix-hit · slow MS"),
    ("B", "standing breakpoints (the same specs; clear, del N): c stops at any of them"),
    ("a", "add a request: text, token ids as [1, 2, 3], or golden N (a golden file prompt)"),
    ("e", "edit the output of the stage stepping stopped at, before the next stage reads it: SELECTION = "
          "EXPRESSION, e.g. row 0 = x * 0, head 1 = np.flip(x), channel 3 = x + 1e-2 (kept in a recording)"),
    ("r", "reset: a fresh engine and KV pool with the initial prompts queued"),
    ("x", "cancel a running c / b / d / l"),
    ("w", "start / stop recording the served session (JSONL, as serve --record; tinyvllm debug --replay FILE)"),
    ("v", "the replay report (tinyvllm debug --replay FILE): each finished request's tokens against the "
          "recorded answer"),
    ("D", "where the picked request (the scheduler table's cursor row) parts from its other run: the first stage "
          "and token that differ bit for bit, each stage's max abs / rel there, the top-1 / top-2 margins at the "
          "first differing token; the other run is the request alone (--compare-alone), the other precision "
          "(--compare-precision) or a second recording (--replay FILE --against FILE2)"),
    ("[ ]", "previous / next token row in the tensor inspector"),
    ("n", "the course's tour: run on to the next chapter's stage, its lesson beside the tensor panel (p: back one)"),
    ("L", "show / hide the lesson panel: the course's lesson about the stage you stopped at (page up / down "
          "scroll it)"),
    ("o", "the code the lesson cites (its first Code reference and its Lesson code)"),
    ("?", "this help (escape closes it)"),
    ("q", "quit"),
)
NOTES = (
    "Each stage runs the kernels named in the timeline; the tensor panel shows its output as [tokens, features].",
    "Golden diffs compare the stage's rows for requests whose prompt is a golden prompt (prompt positions only: "
    "decode steps have no goldens and say so).",
    "`tinyvllm debug --compare-precision` also steps an engine of the other precision (fp32 <-> fast) on the same "
    "requests in lockstep: the golden diff panel shows the stage's max abs and max rel |main - other| "
    "(\"fp32 vs fast\"), the tensor panel each row's max abs, until the two sample different tokens "
    "(\"precisions diverged at step N\"). With --replay FILE the shadow gets the recording's requests and aborts "
    "at their recorded steps.",
)


def help_text() -> Group:
    keys = Table.grid(padding=(0, 2))
    keys.add_column(no_wrap=True, style="bold")
    keys.add_column(ratio=1)
    for key, action in KEYS:
        keys.add_row(key, action)
    parts = [Text(TITLE, style="bold"), Text(), keys]
    for note in NOTES:
        parts += [Text(), Text(note)]
    return Group(*parts)


class HelpScreen(ModalScreen):
    BINDINGS = [("escape", "app.pop_screen", "close"), ("question_mark", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(help_text(), id="help-text")


class TextScreen(ModalScreen):
    """A long text (the replay report) over the panels; escape closes it."""
    BINDINGS = [("escape", "app.pop_screen", "close")]

    def __init__(self, title: str, text: str):
        super().__init__()
        self.title_text, self.text = title, text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = self.title_text
            yield Static(self.text, id="report-text", markup=False)
