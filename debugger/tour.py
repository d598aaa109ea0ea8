"""The course's tour (`tinyvllm debug --tour`, or `n` in the debugger): the lessons in chapter order, each reached
by running the live engine forward to the stage its `Stage:` header names. No UI here.

A lesson's stage is `start` (between two steps: the engine loaded and nothing half run), a forward-pass stage
(`embedding`, `layers.<i>.<stage>`, `final_norm`, `logits`) or `step-end` (a whole step done: sampling, the
scheduler's bookkeeping). Reaching it goes through the debugger Session's own stepping (run_until, step_decode),
so always forward: a stage the engine has already passed in this step is reached in the next one (a second
chapter at the same stage stops one step later, typically in a decode step). When the requests have all
finished, the session is reset (a fresh engine with the initial prompts) and the run goes on from there.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from debugger.session import Breakpoint, RunResult, Session, SessionView
from tinyvllm.course import CodeRef, Lesson, lesson_for_stage
from tinyvllm.course.lessons import find_definition
from tinyvllm.course.stages import AFTER, BEFORE
from tinyvllm.errors import TinyVLLMError

(START,), (STEP_END,) = BEFORE, AFTER


def position(view: SessionView) -> str:
    """Where the session stands, named as a lesson's Stage header would name it."""
    if view.in_step:
        assert view.stage is not None
        return view.stage.name
    return START if view.step == 0 else STEP_END


def reached(session: Session, stage: str) -> bool:
    """Whether the session stands at `stage` now (`start`: between steps)."""
    view = session.view()
    return not view.in_step if stage == START else position(view) == stage


def reach(session: Session, stage: str, cancelled=None, progress=None) -> RunResult | None:
    """Run the session forward to the next time `stage` is reached: None when already there (`start` only: it
    is a state, where every other stage is an event that has to happen again)."""
    if stage == START and not session.in_step:
        return None
    for attempt in range(2):
        if stage in (START, STEP_END):
            result = session.step_decode(cancelled, progress)
        else:
            result = session.run_until(Breakpoint("stage", stage), cancelled, progress)
        if result.reason != "idle" or attempt:
            return result
        session.reset()   # every request has finished: the initial prompts again, on a fresh engine
    return result


@dataclass
class Tour:
    lessons: list[Lesson]
    index: int = 0        # the chapter shown (0-based)
    arrived: bool = False  # whether the session got to its stage (not cancelled or stopped on the way)

    def __post_init__(self):
        if not self.lessons:
            raise TinyVLLMError("the course has no lessons to tour (tinyvllm/course/lessons/ holds none)")

    @property
    def lesson(self) -> Lesson:
        return self.lessons[self.index]

    @property
    def heading(self) -> str:
        """`chapter 8 of 26 · 08. RMSNorm and parallel reduction`"""
        lesson = self.lesson
        return f"chapter {self.index + 1} of {len(self.lessons)} · {lesson.number:02d}. {lesson.title}"

    def run(self, session: Session, cancelled=None, progress=None) -> str:
        """Run the session to this chapter's stage; what happened, in a line for the status bar."""
        stage, engine = self.lesson.stage, session.engine
        result = reach(session, stage, cancelled, progress)
        self.arrived = result is None or reached(session, stage)
        if not self.arrived:   # cancelled, or a standing breakpoint hit on the way
            return f"{self.heading}: stopped short of {stage} ({result.detail or result.reason}); n runs on to it"
        fresh = " (the requests had finished: a fresh engine)" if session.engine is not engine else ""
        return f"{self.heading} · at {stage}, step {session.view().step}{fresh}"

    def replay_to(self, session: Session, index: int, cancelled=None, progress=None) -> str:
        """Back to chapter `index`: the engine cannot step back, so a fresh one walks the chapters up to it."""
        session.reset()
        for i in range(index + 1):
            self.index = i
            line = self.run(session, cancelled, progress)
            if cancelled is not None and cancelled():
                return line
        return line


def lesson_here(view: SessionView, lessons: list[Lesson]) -> Lesson | None:
    """The lesson about the stage the session stands at (outside the tour: the user stepped there)."""
    return lesson_for_stage(position(view), lessons)


# ---- a lesson's code -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Excerpt:
    reference: str        # as the lesson wrote it
    first_line: int       # 1-based, inclusive
    last_line: int
    text: str


def excerpt(ref: CodeRef) -> Excerpt:
    """The source `ref` names: a def or class (its decorators too), Class.method, or the whole file.
    ValueError names what cannot be found."""
    try:
        source = ref.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {ref.path}: {e}") from None
    lines = source.splitlines()
    if ref.name is None:
        return Excerpt(str(ref), 1, len(lines), source)
    node = find_definition(ast.parse(source), ref.name)
    if node is None:
        raise ValueError(f"{ref.path} has no {ref.name}")
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return Excerpt(str(ref), first, node.end_lineno, "\n".join(lines[first - 1:node.end_lineno]))


def excerpts(lesson: Lesson) -> list[Excerpt | str]:
    """What the code key shows: the lesson's first Code reference, then its Lesson code (a message for any
    reference that cannot be read)."""
    shown = []
    for ref in lesson.code[:1] + tuple(lesson.lesson_code):
        try:
            shown.append(excerpt(ref))
        except ValueError as e:
            shown.append(str(e))
    return shown

