"""The course's lessons (tinyvllm/course/lessons/) are still true of the code: every lesson parses, cites files,
names and stages that exist, and its console and pycon blocks print what it says (the slow tests run them). The
checker itself is tested on small bad lessons written here, each seen reporting its problem at its line."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernels_numba.common import SIMULATOR
from tinyvllm.course import lessons as course
from tinyvllm.course.check import (check_console, check_index, check_pycon, check_references, check_stages,
                                   load_problems)
from tinyvllm.course.lessons import load_lesson, load_lessons, lesson_for_stage, lessons_for_stage

ROOT = Path(__file__).resolve().parent.parent
LESSONS = load_lessons()


def lesson_id(lesson) -> str:
    return lesson.name


def problems_text(problems) -> str:
    return "\n".join(str(p) for p in problems)


def write_lesson(tmp_path: Path, body: str, name: str = "07-embedding.md", stage: str = "embedding",
                 code: str = "kernels_numba/embedding.py:embedding"):
    path = tmp_path / name
    path.write_text(f"# {name[:2]}. A lesson\n\nStage: {stage}\nCode: {code}\n\n" + textwrap.dedent(body))
    return load_lesson(path)


# ---- every lesson of the course ---------------------------------------------------------------------
def test_the_course_has_lessons_and_docs_course_points_at_them():
    assert LESSONS, "no lesson files in tinyvllm/course/lessons"
    assert (ROOT / "docs" / "course").resolve() == course.LESSONS_DIR


def test_every_lesson_parses_and_the_index_links_it():
    _, problems = load_problems()
    problems += check_index()
    assert not problems, problems_text(problems)


def test_every_lesson_cites_code_that_exists():
    problems = [p for lesson in LESSONS for p in check_references(lesson)]
    assert not problems, problems_text(problems)


def test_every_lesson_names_real_stages():
    problems = [p for lesson in LESSONS for p in check_stages(lesson)]
    assert not problems, problems_text(problems)


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS, ids=lesson_id)
def test_lesson_console_blocks_print_what_they_say(lesson):
    problems = check_console(lesson)
    assert not problems, problems_text(problems)


@pytest.mark.slow
@pytest.mark.skipif(not SIMULATOR, reason="the lessons show the simulator's kernels and numbers; their console "
                    "commands run in it on any machine, their pycon blocks run in this process")
@pytest.mark.parametrize("lesson", LESSONS, ids=lesson_id)
def test_lesson_pycon_blocks_print_what_they_say(lesson):
    problems = check_pycon(lesson)
    assert not problems, problems_text(problems)


# ---- the checker, on lessons that are wrong ------------------------------------------------------------
def test_a_reference_to_a_missing_file_or_name_is_reported_at_its_line(tmp_path):
    lesson = write_lesson(tmp_path, """\
        ## Where the code is
        `kernels_numba/embedding.py:embedding_kernel` is fine, `kernels_numba/embedding.py:no_such_kernel` is not,
        nor is `kernels_numba/no_such_file.py`, nor `tinyvllm/runner/forward.py:ForwardPass.no_such_method`,
        nor `docs/no_such_page.md`.
        """, code="kernels_numba/embedding.py:embedding, kernels_numba/rmsnorm.py:no_rmsnorm")
    problems = check_references(lesson)
    assert [(p.line, p.message.split(":")[0]) for p in problems] == [
        (4, "`kernels_numba/rmsnorm.py"),
        (7, "`kernels_numba/embedding.py"),
        (8, "`kernels_numba/no_such_file.py`"),
        (8, "`tinyvllm/runner/forward.py"),
        (9, "`docs/no_such_page.md`"),
    ], problems_text(problems)
    assert all(p.path == lesson.path for p in problems)


def test_a_wrong_stage_is_reported_in_the_header_and_in_the_text(tmp_path):
    lesson = write_lesson(tmp_path, """\
        At `layers.0.attn` and `layers.1.mlp`, not at `layers.0.attention` nor `layers.99.q`.
        """, stage="layers.0.rmsnorm")
    problems = check_stages(lesson)
    assert [(p.line, p.message.split(" ")[:2]) for p in problems] == [
        (3, ["Stage:", "'layers.0.rmsnorm'"]), (6, ["`layers.0.attention`", "is"]), (6, ["`layers.99.q`", "is"])]


def test_every_stage_of_the_tour_is_accepted(tmp_path):
    from tinyvllm.course.stages import tour_stages
    stages = tour_stages()
    assert stages[0] == "start" and stages[-1] == "step-end" and "layers.1.output" in stages
    for stage in stages:
        assert not check_stages(write_lesson(tmp_path, "", stage=stage)), stage


def test_a_console_block_with_the_wrong_output_is_reported(tmp_path):
    lesson = write_lesson(tmp_path, """\
        ```console
        $ echo "one two"
        one   two
        $ printf 'a\\nb\\nc\\n'
        a
        ...
        $ echo right
        wrong
        $ exit 3
        ```
        """)
    problems = check_console(lesson)
    assert [p.line for p in problems] == [12, 14], problems_text(problems)
    assert "expected\nwrong\ngot\nright" in problems[0].message
    assert "exit status 3" in problems[1].message


def test_a_console_command_that_opens_the_debugger_is_only_parsed(tmp_path):
    lesson = write_lesson(tmp_path, """\
        ```console
        $ tinyvllm debug --max-tokens 2
        $ tinyvllm debug --no-such-flag
        $ python -m tinyvllm serve --port 70000
        $ NUMBA_ENABLE_CUDASIM=1 tinyvllm debug --no-such-flag
        ```
        """)
    problems = check_console(lesson)
    assert [p.line for p in problems] == [8, 9, 10], problems_text(problems)
    assert "--no-such-flag" in problems[0].message and "port" in problems[1].message
    assert "--no-such-flag" in problems[2].message and "exit status" not in problems[2].message  # not run


def test_a_pycon_block_with_the_wrong_output_or_an_error_is_reported(tmp_path):
    lesson = write_lesson(tmp_path, """\
        ```pycon
        >>> x = 6 * 7
        >>> x
        42
        >>> [x] * 3
        [42, ..., 42]
        ```

        The next block shares the namespace:

        ```pycon
        >>> x + 1
        44
        >>> undefined_name
        ```
        """)
    problems = check_pycon(lesson)
    assert [p.line for p in problems] == [17, 19], problems_text(problems)
    assert "expected\n44\ngot\n43" in problems[0].message
    assert "NameError" in problems[1].message


def test_a_lesson_off_the_format_is_reported_with_its_line(tmp_path):
    (tmp_path / "README.md").write_text("[07](07-embedding.md)\n")
    (tmp_path / "07-embedding.md").write_text("# 07. Embedding\n\nStage: embedding\nCode: kernels_numba\n")
    (tmp_path / "08-rmsnorm.md").write_text("# 08. RMSNorm\n\nStage: layers.0.input_norm\n\nCode: x.py\n")
    (tmp_path / "27-extra.md").write_text("# 27. Extra\n\nStage: start\nCode: kernels_numba/rope.py\n")
    _, problems = load_problems(tmp_path)
    assert [(p.path.name, p.line) for p in problems] == [("07-embedding.md", 4), ("08-rmsnorm.md", 2)]
    problems = check_index(tmp_path)
    assert sorted((p.path.name, p.message.split(" ")[0]) for p in problems) == [
        ("27-extra.md", "27-extra.md"), ("README.md", "the"), ("README.md", "the")]


@pytest.mark.slow
def test_the_check_command_names_the_problem_and_fails(tmp_path):
    lesson = write_lesson(tmp_path, "See `kernels_numba/embedding.py:embeding`.\n")
    run = subprocess.run([sys.executable, "-m", "tinyvllm.course.check", "--no-run", str(lesson.path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1
    assert f"{lesson.path}:6: `kernels_numba/embedding.py:embeding`: kernels_numba/embedding.py defines no " \
           "embeding" in run.stdout


# ---- what the tour reads --------------------------------------------------------------------------
def test_a_stage_finds_its_lesson_in_any_layer(tmp_path):
    attn = write_lesson(tmp_path, "## What it computes\n\nScores.\n", name="14-attention.md", stage="layers.0.attn")
    norm = write_lesson(tmp_path, "", name="08-rmsnorm.md", stage="layers.1.input_norm")
    lessons = [norm, attn]
    assert lesson_for_stage("layers.0.attn", lessons) is attn
    assert lesson_for_stage("layers.1.attn", lessons) is attn
    assert lessons_for_stage("layers.0.input_norm", lessons) == [norm]
    assert lesson_for_stage("logits", lessons) is None
    assert attn.number == 14 and attn.slug == "attention" and attn.title == "A lesson"
    assert attn.body == "## What it computes\n\nScores.\n"
    assert [str(r) for r in attn.code] == ["kernels_numba/embedding.py:embedding"]
    assert attn.code[0].definition_line() == next(
        i for i, line in enumerate((ROOT / "kernels_numba/embedding.py").read_text().splitlines(), start=1)
        if line.startswith("def embedding("))
