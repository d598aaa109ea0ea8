"""The step-through debugger app: composes the panels and drives a Session from one worker thread.

All engine work (every kernel launch) runs in one `@work(thread=True, exclusive=True)` worker, because
the simulator runs one kernel at a time and the engine is not thread-safe; the worker posts small
messages (debugger/messages.py) carrying immutable snapshots, and the panels only ever render those.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Header, Input, ProgressBar, Static
from textual.worker import get_current_worker

from debugger.messages import FeedChanged, RunFinished, RunProgress, SessionUpdated
from debugger.session import (BREAKPOINT_HELP, ArrivalRecord, Breakpoint, RunResult, Session, SessionView, StageRecord,
                      StepRecord)
from debugger.widgets.block_table_panel import BlockTablePanel
from debugger.widgets.divergence_panel import NO_COMPARISON, DivergenceScreen, picked_request
from debugger.widgets.golden_diff import GoldenDiffPanel
from debugger.tour import Tour, excerpts, lesson_here, position
from debugger.widgets.help_screen import HelpScreen, TextScreen
from debugger.widgets.lesson_panel import LessonPanel
from debugger.widgets.source_screen import SourceScreen
from debugger.widgets.scheduler_panel import SchedulerPanel
from debugger.widgets.tensor_inspector import TensorInspector
from debugger.widgets.timeline import TimelinePanel
from tinyvllm.errors import TinyVLLMError

Job = Callable[[Session, Callable[[], bool], Callable], object]

INPUT_PROMPTS = {
    "request": "add a request: text, token ids as [1, 2, 3], or golden N  (enter adds, escape closes)",
    "breakpoint": f"run until: {BREAKPOINT_HELP}  (escape closes)",
    "standing": f"standing breakpoint (c stops at it): {BREAKPOINT_HELP}; clear | del N  (escape closes)",
}
VIEW_INTERVAL_S = 0.1   # a long run shows a new snapshot at most this often
MIN_SIZE = (100, 30)    # columns, rows: below this the tensor and golden panels have no room and are hidden


def summarize(result) -> str:
    """One status line for what a command did."""
    if result is None:
        return "nothing to run: every request has finished (a adds one, r resets)"
    if isinstance(result, str):
        return result
    if isinstance(result, StageRecord):
        return f"ran {result.name} ({result.kernel}, {result.seconds * 1000:.1f} ms)"
    if isinstance(result, StepRecord):
        return f"step {result.step} done: {result.describe()}"
    if isinstance(result, ArrivalRecord):
        return f"arrived before step {result.step}: {result.describe()}"
    assert isinstance(result, RunResult)
    event = result.event
    where = ("" if event is None else f" at {event.name}" if isinstance(event, StageRecord)
             else f": {summarize(event)}")
    if result.reason == "breakpoint":
        return f"breakpoint: {result.detail} ({result.num_events} events)"
    if result.reason == "idle":
        return f"every request has finished ({result.num_events} events)"
    if result.reason == "cancelled":
        return f"cancelled after {result.num_events} events{where}"
    return f"stopped after {result.num_events} events{where}"


def run_state(view: SessionView, feed) -> str:
    """What the title says of the run as a whole ("" while it is under way): "done" only once it has ended."""
    started = view.step > 0 or view.in_step
    if feed is not None and feed.serves_forever:
        return "waiting for requests" if view.idle else ""
    if feed is not None and not feed.done:
        return "" if started else f"replaying {feed.num_requests} requests"
    if view.idle:
        return "done" if started else "no requests: a adds one"
    return "" if started else "ready"


class DebuggerApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "tinyvllm debugger"
    AUTO_FOCUS = None   # keys are commands: no panel (least of all the hidden input box) takes them at start
    # app.tcss sizes the panels for the screen: narrow (< 140 columns) and short (< 40 rows) screens get
    # fixed widths and heights that fit every column down to 100 x 30
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]
    BINDINGS = [
        # short descriptions: the whole footer fits in 100 columns
        Binding("s", "step_stage", "stage"),
        Binding("l", "step_layer", "layer"),
        Binding("d", "step_decode", "step"),
        Binding("c", "continue_run", "continue"),
        Binding("b", "ask('breakpoint')", "break"),
        Binding("B", "ask('standing')", "bkpts", show=False),
        Binding("a", "ask('request')", "add"),
        Binding("e", "edit_value", "edit", show=False),   # in the help: the footer is full at 100 columns
        Binding("r", "reset", "reset"),
        Binding("x", "cancel", "cancel"),
        Binding("w", "record", "rec"),
        Binding("v", "report", "report"),
        Binding("D", "divergence", "diverge", show=False),
        Binding("n", "chapter(1)", "tour"),   # the course's tour: the next chapter
        Binding("p", "chapter(-1)", "back", show=False),
        Binding("o", "lesson_code", "code", show=False),
        Binding("L", "toggle_lesson", "lesson", show=False),
        Binding("pagedown", "scroll_lesson(1)", "lesson", show=False),
        Binding("pageup", "scroll_lesson(-1)", "lesson", show=False),
        Binding("left_square_bracket", "row(-1)", "row", show=False),
        Binding("right_square_bracket", "row(1)", "row", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        Binding("escape", "close_input", "close", show=False),
    ]

    def __init__(self, session: Session, tour: Tour | None = None):
        super().__init__()
        self.session = session
        self.tour = tour
        self.lessons = None               # the course's lessons, read at the first stop (debugger/tour.py)
        self.stage_here = "start"         # where the session stands, as a lesson's Stage header names it
        self.stage_lesson = None          # the lesson about that stage
        self.lesson_visible: bool | None = None   # L: shown / hidden; None: shown in the tour only
        self.busy = False
        self.input_mode: str | None = None
        self.failure: BaseException | None = None   # what ended the app, if an exception did

    def _handle_exception(self, error: Exception) -> None:
        """Textual's hook for an unhandled exception (a missing stylesheet, a bug in a panel): it exits the
        app with return code 1 and prints a long traceback. Keep the exception for `tinyvllm debug` to
        report in one line instead (TINYVLLM_DEBUG=1 keeps Textual's traceback)."""
        if self.failure is None:
            self.failure = error
        super()._handle_exception(error)
        if not os.environ.get("TINYVLLM_DEBUG"):
            self._exit_renderables.clear()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """Keys that only mean something with a feed of requests show (and work) only with one: w records
        a served session, v reports on a replay; r (reset) would drop the clients, so it goes."""
        feed = self.session.feed
        if action == "record":
            return feed is not None and hasattr(feed, "recorder")
        if action == "report":
            return feed is not None and hasattr(feed, "summary")
        if action == "reset":
            return feed is None
        if action == "chapter":   # the tour steps the debugger's own requests, resetting when they finish
            return feed is None
        return True

    def compose(self) -> ComposeResult:
        yield Static(id="size-warning")
        yield Header()
        yield SchedulerPanel(id="scheduler")
        with Horizontal(id="middle"):
            yield TensorInspector(id="inspector")
            yield LessonPanel(id="lesson")
            yield GoldenDiffPanel(id="golden")
        with Horizontal(id="bottom"):
            yield BlockTablePanel(id="blocks")
            yield TimelinePanel(id="timeline")
        yield Static("ready: s steps one stage, ? for help", id="status")
        yield ProgressBar(id="progress", show_eta=False)
        yield Input(id="command-input")
        yield Footer(show_command_palette=False)   # ctrl+p still opens it

    def on_mount(self) -> None:
        if self.session.feed is not None:
            self.session.feed.on_change = lambda: self.post_message(FeedChanged())
        self.show(self.session.view())
        if self.tour is not None:
            self.action_chapter(0)

    def show(self, view: SessionView) -> None:
        self.query_one(SchedulerPanel).show(view)
        self.query_one(BlockTablePanel).show(view.blocks)
        self.query_one(TensorInspector).show(view.stage)
        self.query_one(GoldenDiffPanel).show(view.golden)
        self.query_one(TimelinePanel).show(view.timeline)
        self.query_one(ProgressBar).update(total=view.stages_per_step, progress=view.stages_done)
        stage = f" · {view.stage.name}" if view.stage is not None and view.in_step else ""
        state = run_state(view, self.session.feed)
        self.sub_title = f"step {view.step}{stage}" + (f" · {state}" if state else "")
        self.stage_here, self.stage_lesson = position(view), lesson_here(view, self.course())
        self.show_lesson()
        if view.in_step and self.stage_lesson is not None and self.tour is None and not self.lesson_visible:
            self.sub_title += f" · lesson {self.stage_lesson.number:02d}: L"   # a forward-pass stage a lesson explains

    def on_resize(self, event: events.Resize) -> None:
        """Below MIN_SIZE: a warning across the top, and the panels that cannot fit (tensor, golden) hidden."""
        width, height = event.size
        cramped = width < MIN_SIZE[0] or height < MIN_SIZE[1]
        if cramped:
            warning = (f"terminal is {width}x{height}; the tensor and golden panels need at least "
                       f"{MIN_SIZE[0]}x{MIN_SIZE[1]}")
            self.query_one("#size-warning", Static).update(Text(warning))
            if not self.has_class("-cramped"):
                self.notify(warning, severity="warning", markup=False)
        self.set_class(cramped, "-cramped")

    def set_status(self, text: str) -> None:
        # Text, not markup: "[id]" in a message is what the user should read
        self.query_one("#status", Static).update(Text(text))

    # ---- commands ---------------------------------------------------------------------------------
    def action_step_stage(self) -> None:
        self.launch("stage", lambda s, cancelled, progress: s.step_stage())

    def action_step_layer(self) -> None:
        self.launch("layer", lambda s, cancelled, progress: s.step_layer(cancelled, progress))

    def action_step_decode(self) -> None:
        self.launch("decode step", lambda s, cancelled, progress: s.step_decode(cancelled, progress))

    def action_continue_run(self) -> None:
        if self.session.feed is not None and self.session.feed.serves_forever:
            self.launch("serve", lambda s, cancelled, progress: s.serve(cancelled, progress))
        else:
            self.launch("continue", lambda s, cancelled, progress: s.continue_to_end(cancelled, progress))

    def action_record(self) -> None:
        feed = self.session.feed
        if feed is None or not hasattr(feed, "recorder"):
            self.set_status("w records a served session: start it with tinyvllm serve --debug")
            return
        try:
            self.set_status(feed.toggle_recording())
        except Exception as e:  # a directory we cannot write to
            self.set_status(f"cannot record: {e}")
        self.show(self.session.view())

    def action_report(self) -> None:
        report = self.session.feed.report() if self.session.feed is not None else None
        if report is None:
            self.set_status("v shows a replay's report: tinyvllm debug --replay FILE")
            return
        self.push_screen(TextScreen("replay report (escape closes)", report))

    def action_divergence(self) -> None:
        """D: where the picked request's two runs part (debugger/divergence.py; the flag says which two)."""
        comparison, request_id = self.session.divergence, picked_request(self)
        if comparison is None or request_id is None:
            self.set_status(NO_COMPARISON if comparison is None else "D compares a request's runs: no request yet")
            return

        def compare(s, cancelled, progress):
            report = comparison.report(s, request_id, cancelled)
            self.call_from_thread(self.push_screen, DivergenceScreen(report))
            return report.headline()
        self.launch(f"compare request {request_id} ({comparison.kind})", compare)

    def on_feed_changed(self, message: FeedChanged) -> None:
        """A client arrived or went away: shown now while paused (a running command shows it at its next step),
        and a client that went away has its request aborted at once unless a step is half done."""
        if not self.busy:
            self.session.apply_feed_aborts()
            self.show(self.session.view())

    def action_reset(self) -> None:
        def reset(s, cancelled, progress):
            s.reset()
            return "reset: fresh engine and KV pool, initial prompts queued"
        self.launch("reset", reset)

    def action_cancel(self) -> None:
        if self.busy:
            self.workers.cancel_group(self, "engine")
            self.set_status("cancelling after the current stage…")

    def action_row(self, delta: int) -> None:
        self.query_one(TensorInspector).select_row(delta)

    def action_edit_value(self) -> None:
        """e: set part of the current stage's output before the next stage reads it (widgets/edit_screen.py)."""
        from debugger.widgets.edit_screen import open_edit
        open_edit(self)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.workers.cancel_group(self, "engine")
        self.exit()

    def launch(self, command: str, job: Job) -> None:
        if self.busy:
            self.set_status(f"busy: x cancels the running command before {command!r}")
            return
        self.busy = True
        self.set_status(f"running: {command} (x cancels)")
        self.run_job(command, job)

    @work(thread=True, exclusive=True, group="engine")
    def run_job(self, command: str, job: Job) -> None:
        worker = get_current_worker()
        per_step = self.session.view().stages_per_step
        shown = [0.0]

        def progress(event) -> None:
            if isinstance(event, (StepRecord, ArrivalRecord)):
                now = time.monotonic()
                if isinstance(event, ArrivalRecord) or now - shown[0] >= VIEW_INTERVAL_S:
                    shown[0] = now
                    self.post_message(SessionUpdated(self.session.view()))
            else:
                self.post_message(RunProgress(command, event.step, event.name, event.index + 1, per_step))

        try:
            result = job(self.session, lambda: worker.is_cancelled, progress)
            self.post_message(RunFinished(command, summarize(result), self.session.view()))
        except Exception as e:  # shown in the status line; the session stays usable (r resets)
            self.post_message(RunFinished(command, f"{command} failed: {type(e).__name__}: {e}",
                                          self.session.view(), failed=True))

    def on_run_progress(self, message: RunProgress) -> None:
        self.set_status(f"running: {message.command} · step {message.step} · {message.stage} (x cancels)")
        self.query_one(ProgressBar).update(total=message.stages_per_step, progress=message.stages_done)

    def on_session_updated(self, message: SessionUpdated) -> None:
        self.show(message.view)

    def on_run_finished(self, message: RunFinished) -> None:
        self.busy = False
        self.show(message.view)
        summary = message.summary
        feed = self.session.feed
        if feed is not None and getattr(feed, "done", False) and hasattr(feed, "summary"):
            summary += f" · {feed.summary()} (v: report)"
        self.set_status(summary)
        if message.failed:
            self.notify(message.summary, severity="error", markup=False)

    # ---- the course: its tour and the lesson panel (debugger/tour.py) --------------------------------
    def course(self) -> list:
        if self.lessons is None:
            from tinyvllm.course import CourseError, load_lessons
            try:
                self.lessons = load_lessons()
            except CourseError as e:   # a broken lesson file takes the lessons away, not the debugger
                self.lessons = []
                self.notify(f"no lessons: {e}", severity="warning", markup=False)
        return self.lessons

    def show_lesson(self) -> None:
        visible = self.tour is not None if self.lesson_visible is None else self.lesson_visible
        self.query_one("#middle").set_class(visible, "-lesson")
        if visible and self.tour is not None:
            self.query_one(LessonPanel).show(self.tour.lesson, self.tour.heading, self.stage_here, True)
        elif visible:
            self.query_one(LessonPanel).show(self.stage_lesson, None, self.stage_here, False)

    def action_chapter(self, delta: int) -> None:
        """n: the tour's next chapter (outside the tour: start it, at chapter 1); p: back one."""
        if self.busy:
            self.set_status("busy: x cancels the running command first")
            return
        if self.tour is None:
            if not self.course():
                self.set_status("the course has no lessons to tour")
                return
            self.tour, delta = Tour(self.course()), 0
        tour = self.tour
        target = tour.index + (delta if tour.arrived or delta <= 0 else 0)   # n after a stop on the way: go on
        if not 0 <= target < len(tour.lessons):
            self.set_status(f"{tour.heading}: the tour's {'last' if delta > 0 else 'first'} chapter")
            return
        if delta < 0:
            self.launch(f"back to chapter {target + 1}", lambda s, cancelled, progress:
                        tour.replay_to(s, target, cancelled, progress))
        else:
            tour.index = target
            self.launch(f"chapter {target + 1}", lambda s, cancelled, progress: tour.run(s, cancelled, progress))
        self.show_lesson()

    def action_toggle_lesson(self) -> None:
        self.lesson_visible = not self.query_one("#middle").has_class("-lesson")
        self.show_lesson()

    def action_scroll_lesson(self, pages: int) -> None:
        self.query_one(LessonPanel).scroll_text(pages)

    def action_lesson_code(self) -> None:
        lesson = self.tour.lesson if self.tour is not None else self.stage_lesson
        if lesson is None:
            self.set_status("no lesson explains this stage: o shows a lesson's code (n starts the tour)")
            return
        self.push_screen(SourceScreen(f"{lesson.number:02d}. {lesson.title}: its code", excerpts(lesson)))

    def edit_breakpoints(self, text: str) -> str:
        """`clear`, `del N` (1-based, as listed), or a breakpoint spec to add; ValueError if unreadable."""
        standing = self.session.breakpoints
        if text == "clear":
            standing.clear()
            return "standing breakpoints cleared"
        if text.startswith("del "):
            try:
                removed = standing.pop(int(text[4:]) - 1)
            except (ValueError, IndexError):
                raise ValueError(f"del N takes N in 1..{len(standing)}") from None
            return f"removed breakpoint {removed.describe()}"
        breakpoint = Breakpoint.parse(text)
        standing.append(breakpoint)
        return f"breakpoint {len(standing)}: {breakpoint.describe()} (c stops at it)"

    # ---- the input box (add request, breakpoint) -------------------------------------------------
    def action_ask(self, mode: str) -> None:
        box = self.query_one("#command-input", Input)
        self.input_mode = mode
        box.placeholder = INPUT_PROMPTS[mode]
        box.value = ""
        box.add_class("visible")
        box.focus()

    def action_close_input(self) -> None:
        box = self.query_one("#command-input", Input)
        box.remove_class("visible")
        self.input_mode = None
        self.set_focus(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        mode, text = self.input_mode, event.value.strip()
        self.action_close_input()
        if not text:
            return
        try:
            if mode == "request":
                # Safe while a run is going: the session's lock admits the request between two stages.
                request_id = self.session.add_request(self.session.prompt_from_text(text))
                self.show(self.session.view())
                refused = self.session.rejection(request_id)
                if refused is None:
                    self.set_status(f"added request {request_id}: it joins at the next scheduler step")
                else:
                    self.set_status(f"rejected request {request_id}: {refused}")
                    self.notify(f"request {request_id} rejected: {refused}", severity="error", markup=False)
            elif mode == "standing":
                self.set_status(self.edit_breakpoints(text))
                self.show(self.session.view())
            elif mode == "breakpoint":
                breakpoint = Breakpoint.parse(text)
                self.launch(f"until {text}", lambda s, cancelled, progress: s.run_until(breakpoint, cancelled,
                                                                                         progress))
        except (ValueError, TinyVLLMError) as e:
            self.set_status(f"error: {e}")
            self.notify(str(e), severity="error", markup=False)
