"""Checks that a lesson is still true of the code: what it cites exists and what it shows is what the project prints.

- references: every header reference and every inline code span shaped like a path (`some/path.py`,
  `some/path.py:name`, `docs/x.md`) names a file that exists and, for a .py, a name defined in it;
- stages: the Stage header, and every inline code span shaped like `layers.N.stage`, names a real stage;
- console: every `$ ` line of a ```console block runs from the repository root in the simulator and prints what
  the lines after it say (doctest's comparison, ELLIPSIS and NORMALIZE_WHITESPACE); `tinyvllm debug` and
  `tinyvllm serve` (interactive) are only parsed;
- pycon: every ```pycon block runs as doctest examples (a lesson's blocks share one namespace);
- index: lessons/README.md links every lesson file, and each file is a chapter of CHAPTERS.

Each check returns a list of Problems naming the lesson file and line.

    python -m tinyvllm.course.check [--no-run] [LESSON.md ...]
"""
from __future__ import annotations

import argparse
import contextlib
import doctest
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tinyvllm.course.lessons import (CHAPTERS, LESSONS_DIR, SOURCE_ROOT, CodeRef, CourseError, Lesson, lesson_files,
                                     load_lesson)
from tinyvllm.course.stages import tour_stages

DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PATH_SPAN = re.compile(r"^[\w.-]+(?:/[\w.-]+)+\.(?:md|toml|json|txt|sh|tcss|npz|cfg|yml|yaml)$")
STAGE_SPAN = re.compile(r"^layers\.\d+\.\w+$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
INTERACTIVE = ("debug", "serve")  # commands that open an app or a server: parsed, not run
COMMAND_TIMEOUT_S = 300


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Block:
    """A fenced block: its language and its lines, the first at lesson line `start`."""
    lang: str
    start: int
    lines: list[str]


def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[Block]]:
    """(prose lines with their line numbers, fenced blocks)."""
    prose, blocks, block = [], [], None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line.strip())
        if block is None and fence:
            block = (fence[1], Block(fence[2], number + 1, []))
        elif block is not None and line.strip().startswith(block[0]) and not line.strip()[len(block[0]):].strip():
            blocks.append(block[1])
            block = None
        elif block is not None:
            block[1].lines.append(line)
        else:
            prose.append((number, line))
    if block is not None:
        blocks.append(block[1])  # an unclosed fence: its block runs to the end of the file
    return prose, blocks


def inline_spans(lesson: Lesson) -> list[tuple[int, str]]:
    """(line, text) of every inline code span outside fenced blocks."""
    prose, _ = split_markdown(lesson.text)
    return [(number, m[1].strip()) for number, line in prose for m in INLINE_CODE.finditer(line)]


# ---- references ------------------------------------------------------------------------------------
def check_references(lesson: Lesson) -> list[Problem]:
    refs = list(lesson.code) + list(lesson.lesson_code)
    problems = []
    for number, span in inline_spans(lesson):
        ref = CodeRef.parse(span, number) if "/" in span else None
        if ref is not None:
            refs.append(ref)
        elif PATH_SPAN.match(span) and not (SOURCE_ROOT / span).exists():
            problems.append(Problem(lesson.path, number, f"`{span}`: {span} does not exist"))
    for ref in refs:
        missing = ref.missing()
        if missing:
            problems.append(Problem(lesson.path, ref.line, f"`{ref}`: {missing}"))
    return sorted(problems, key=lambda p: p.line)


# ---- stages ----------------------------------------------------------------------------------------
def check_stages(lesson: Lesson) -> list[Problem]:
    stages = tour_stages()
    problems = []
    if lesson.stage not in stages:
        problems.append(Problem(lesson.path, lesson.stage_line, f"Stage: {lesson.stage!r} is not a stage "
                                f"(start, embedding, layers.<i>.<stage>, final_norm, logits, step-end)"))
    for number, span in inline_spans(lesson):
        if STAGE_SPAN.match(span) and span not in stages:
            problems.append(Problem(lesson.path, number, f"`{span}` is not a stage of the demo model"))
    return problems


# ---- console ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    line: int
    command: str
    expected: str


def console_commands(lesson: Lesson) -> list[Command]:
    """The `$ ` commands of the lesson's console blocks, each with the output the lines after it expect."""
    _, blocks = split_markdown(lesson.text)
    commands = []
    for block in (b for b in blocks if b.lang == "console"):
        current = None
        for offset, line in enumerate(block.lines):
            if line.startswith("$ "):
                if current:
                    commands.append(Command(current[0], current[1], "\n".join(current[2])))
                current = [block.start + offset, line[2:], []]
            elif current is not None and current[1].endswith("\\") and not current[2]:
                current[1] = current[1][:-1] + " " + line.strip()  # a command continued on the next line
            elif current is not None:
                current[2].append(line)
        if current:
            commands.append(Command(current[0], current[1], "\n".join(current[2])))
    return commands


def interactive_argv(command: str) -> list[str] | None:
    """The tinyvllm arguments of a command that opens the debugger or a server, or None for any other command."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and ENV_ASSIGNMENT.match(words[0]):  # NUMBA_ENABLE_CUDASIM=1 tinyvllm debug
        words = words[1:]
    if words[:1] == ["tinyvllm"]:
        argv = words[1:]
    elif words[:3] == ["python", "-m", "tinyvllm"]:
        argv = words[3:]
    else:
        return None
    names = [w for w in argv if not w.startswith("-")]
    return argv if names[:1] and names[0] in INTERACTIVE else None


def parse_problem(argv: list[str]) -> str | None:
    """What argparse says is wrong with `tinyvllm ARGV`, or None."""
    from tinyvllm.cli import parse_args
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def simulator_env() -> dict[str, str]:
    """The environment lesson commands run in: the simulator, and this source tree first on the path."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def output_differs(expected: str, got: str) -> bool:
    checker = doctest.OutputChecker()
    return not checker.check_output(expected.strip() + "\n", got.strip() + "\n", DOCTEST_FLAGS)


def check_console(lesson: Lesson) -> list[Problem]:
    problems = []
    for cmd in console_commands(lesson):
        argv = interactive_argv(cmd.command)
        if argv is not None:
            problem = parse_problem(argv)
            if problem:
                problems.append(Problem(lesson.path, cmd.line, f"$ {cmd.command}: {problem}"))
            continue
        try:
            run = subprocess.run(cmd.command, shell=True, cwd=SOURCE_ROOT, env=simulator_env(), text=True,
                                 capture_output=True, stdin=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            problems.append(Problem(lesson.path, cmd.line, f"$ {cmd.command}: still running after "
                                    f"{COMMAND_TIMEOUT_S} s"))
            continue
        if run.returncode != 0:
            problems.append(Problem(lesson.path, cmd.line, f"$ {cmd.command}: exit status {run.returncode}; "
                                    f"stderr ends:\n{run.stderr[-2000:]}"))
        elif output_differs(cmd.expected, run.stdout):
            problems.append(Problem(lesson.path, cmd.line, f"$ {cmd.command}: expected\n{cmd.expected}\n"
                                    f"got\n{run.stdout}"))
    return problems


# ---- pycon -----------------------------------------------------------------------------------------
class _CollectingRunner(doctest.DocTestRunner):
    """A doctest runner that keeps each failure as a Problem at its lesson line."""

    def __init__(self, path: Path):
        super().__init__(checker=doctest.OutputChecker(), verbose=False, optionflags=DOCTEST_FLAGS)
        self.path, self.problems = path, []

    def _problem(self, test, example, message):
        source = example.source.strip().splitlines()[0]
        self.problems.append(Problem(self.path, test.lineno + example.lineno, f">>> {source}: {message}"))

    def report_failure(self, out, test, example, got):
        self._problem(test, example, f"expected\n{example.want}got\n{got}")

    def report_unexpected_exception(self, out, test, example, exc_info):
        self._problem(test, example, "raised\n" + doctest._exception_traceback(exc_info))


def check_pycon(lesson: Lesson) -> list[Problem]:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # in time only if numba.cuda is not imported yet
    _, blocks = split_markdown(lesson.text)
    runner, globs, parser = _CollectingRunner(lesson.path), {"__name__": lesson.name}, doctest.DocTestParser()
    for block in (b for b in blocks if b.lang == "pycon"):
        source = "\n".join(block.lines) + "\n"
        test = doctest.DocTest(parser.get_examples(source), globs, lesson.name, str(lesson.path), block.start,
                               source)
        test.globs = globs  # DocTest copies its globs; the lesson's blocks share one namespace
        runner.run(test, out=lambda _: None, clear_globs=False)
    return runner.problems


# ---- the index and the whole course ------------------------------------------------------------------
def check_index(directory: Path = LESSONS_DIR) -> list[Problem]:
    readme = Path(directory) / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    chapters = {f"{c.number:02d}-{c.slug}.md" for c in CHAPTERS}
    problems = []
    for path in lesson_files(directory):
        if path.name not in chapters:
            problems.append(Problem(path, 1, f"{path.name} is no chapter of the course "
                                    "(tinyvllm/course/lessons.py: CHAPTERS)"))
        if f"({path.name})" not in text:
            problems.append(Problem(readme, 1, f"the index does not link {path.name}"))
    return problems


def load_problems(directory: Path = LESSONS_DIR) -> tuple[list[Lesson], list[Problem]]:
    """The lessons that parse, and a Problem for each one that does not."""
    lessons, problems = [], []
    for path in lesson_files(directory):
        try:
            lessons.append(load_lesson(path))
        except CourseError as e:
            problems.append(Problem(e.path, e.line, e.message))
    return lessons, problems


STATIC_CHECKS = (check_references, check_stages)
RUNNING_CHECKS = (check_console, check_pycon)


def check_lesson(lesson: Lesson, run: bool = True) -> list[Problem]:
    checks = STATIC_CHECKS + (RUNNING_CHECKS if run else ())
    return [problem for check in checks for problem in check(lesson)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinyvllm.course.check", description=__doc__.split("\n")[0])
    parser.add_argument("lessons", nargs="*", type=Path, help="lesson files (default: every lesson and the index)")
    parser.add_argument("--no-run", action="store_true", help="check references and stages only")
    args = parser.parse_args(argv)
    problems = []
    if args.lessons:
        lessons = []
        for path in args.lessons:
            if path.name == "README.md":  # the index, not a lesson (a glob over lessons/ brings it along)
                continue
            try:
                lessons.append(load_lesson(path))
            except CourseError as e:
                problems.append(Problem(e.path, e.line, e.message))
    else:
        lessons, problems = load_problems()
        problems += check_index()
    for lesson in lessons:
        problems += check_lesson(lesson, run=not args.no_run)
    for problem in problems:
        print(problem)
    print(f"{len(lessons)} lessons checked, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
