"""The value-edit box (`e`): set part of the output of the stage stepping stopped at (debugger/value_edit.py).

A modal over the panels: which stage and step it edits, how to write an edit, the session's edits so far, and an
input. Enter applies the edit (Session.edit: written into the stage's device output before the next stage reads
it); the status line says what was done or, in one line, why not; escape closes without an edit.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from debugger.session import StageRecord
from debugger.value_edit import EDIT_HELP, ValueEdit
from tinyvllm.errors import TinyVLLMError


class EditScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    EditScreen {
        align: center bottom;
    }
    #edit-box {
        width: 110;
        max-width: 100%;
        height: auto;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    #edit-help, #edit-list {
        height: auto;
    }
    """
    BINDINGS = [("escape", "close", "close")]

    def __init__(self, stage: StageRecord, edits: tuple[ValueEdit, ...]):
        super().__init__()
        self.stage, self.edits = stage, edits

    def compose(self) -> ComposeResult:
        with Vertical(id="edit-box") as box:
            box.border_title = f"edit {self.stage.name} (step {self.stage.step}, shape {self.stage.values.shape})"
            yield Static(Text(EDIT_HELP + "  (enter applies, escape closes)"), id="edit-help")
            listed = "\n".join(f"  {e.describe()}" for e in self.edits)
            yield Static(Text("edits so far:\n" + listed if self.edits else "no edits so far"), id="edit-list")
            yield Input(placeholder="row 0 = x * 0", id="edit-input")

    def on_mount(self) -> None:
        self.query_one("#edit-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_close(self) -> None:
        self.dismiss(None)


def open_edit(app) -> None:
    """What `e` does in the DebuggerApp: the edit box over the current stage, and the edit applied on enter."""
    view = app.session.view()
    if app.busy:
        app.set_status("busy: x cancels the running command before an edit")
        return
    if not view.in_step or view.stage is None or view.stage.step != view.step:
        app.set_status("e edits the output of the stage stepping stopped at: step to a stage first (s, l, b)")
        return

    def apply(text: str | None) -> None:
        if text is None:
            return
        try:
            edit = app.session.edit(text)
        except TinyVLLMError as e:
            app.set_status(f"edit refused: {e}")
            app.notify(str(e), severity="error", markup=False)
            return
        app.show(app.session.view())
        app.set_status(f"edited {edit.describe()}; continue (s, c) to see its effect on the tokens")
    app.push_screen(EditScreen(view.stage, view.edits), apply)
