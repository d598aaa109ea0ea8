"""What the engine worker thread tells the UI: small dataclass messages carrying immutable snapshots."""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from debugger.session import SessionView


@dataclass
class RunProgress(Message):
    """After every stage of a long run."""
    command: str
    step: int
    stage: str
    stages_done: int
    stages_per_step: int


@dataclass
class SessionUpdated(Message):
    """A new snapshot to show (after each scheduler step of a long run)."""
    view: SessionView


@dataclass
class RunFinished(Message):
    command: str
    summary: str              # why it stopped, or the error
    view: SessionView
    failed: bool = False


@dataclass
class FeedChanged(Message):
    """A request arrived from outside the debugger (an HTTP client), or its client went away."""
