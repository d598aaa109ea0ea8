"""The debugger, headless, from an installed tinyvllm (run by .ci/wheel_smoke outside the checkout).

Builds the app exactly as `tinyvllm debug` does (its stylesheet, the shipped goldens), presses l at
100 x 30 and checks that the first layer ran and every golden stage passed; then `tinyvllm debug --tour`: the
shipped lessons load, n reaches chapter 2 and o opens the source the lesson cites, from the installed package.
"""
import asyncio
import sys

import tinyvllm
from debugger.cli import debug_app
from tinyvllm.cli import parse_args


async def main() -> None:
    assert "site-packages" in tinyvllm.__file__, f"not the installed package: {tinyvllm.__file__}"
    app = debug_app(parse_args(["debug"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("l")
        await app.workers.wait_for_complete()
        await pilot.pause()
        status = str(app.query_one("#status").content)
        rows = app.session.view().golden.rows
    assert app.failure is None, app.failure
    assert status == "stopped after 11 events at layers.0.output", status
    assert len(rows) == 11 and all(r.status == "pass" for r in rows), rows
    print(f"debugger smoke test: PASS ({status}; {len(rows)} golden stages pass)")
    await tour()


async def tour() -> None:
    from debugger.widgets.source_screen import SourceScreen
    from tinyvllm.course import load_lessons
    lessons = load_lessons()
    assert len(lessons) == 26, [lesson.name for lesson in lessons]
    app = debug_app(parse_args(["debug", "--tour"]))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        await pilot.press("n")
        await app.workers.wait_for_complete()
        await pilot.pause()
        title = str(app.query_one("#lesson-title").content)
        await pilot.press("o")
        await pilot.pause()
        opened = isinstance(app.screen, SourceScreen)
    assert app.failure is None, app.failure
    assert title.startswith(f"chapter 2 of 26 · 02. {lessons[1].title}"), title
    assert opened, "o did not open the lesson's code"
    print(f"tour smoke test: PASS ({title})")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
