"""Make docs/debugger.svg: the demo model with its goldens, stepped through its first layer (press `l`);
with --serve, docs/serve-debug.svg: `tinyvllm serve --debug` with two streaming HTTP clients, recording,
after one decode step (`d`); with --tour, docs/course-tour.svg: `tinyvllm debug --tour` walked (`n`) to the
RMSNorm chapter (--chapter paged-attention --out docs/course-tour-paged.svg: to chapter 20's block tables); with
--edit, docs/debugger-edit.svg: a value edit (`e`) of the sampling row's logits at step 0, then the step finished;
with --divergence, docs/debugger-divergence.svg: `D` on a request batched with a longer one in the fast plan
without batch invariance, against itself alone (`--compare-alone`).

    python -m debugger.screenshot [--serve | --tour [--chapter SLUG] | --edit | --divergence] [--out FILE]
                                                                          (in the simulator unless told)
"""
from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
DEFAULT_OUT = DOCS / "debugger.svg"
SERVE_OUT = DOCS / "serve-debug.svg"
TOUR_OUT = DOCS / "course-tour.svg"
TOUR_CHAPTER = "rmsnorm"
EDIT_OUT = DOCS / "debugger-edit.svg"
EDIT = "row -1 channel 42 = x + 100"   # the sampling row (the last prompt position): token 42 becomes its argmax
DIVERGENCE_OUT = DOCS / "debugger-divergence.svg"


def demo_app():
    """The debugger on the demo model with its goldens, as `tinyvllm debug` opens it (64 blocks of 4)."""
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens

    from debugger.app import DebuggerApp
    from debugger.session import Session
    engine = LLMEngine(None, EngineConfig(num_blocks=64, block_size=4), log=lambda message: None)
    return DebuggerApp(Session(engine, Goldens.load(DEFAULT_GOLDENS)))


async def settle(app, pilot) -> None:
    """Wait for the running command and for its last message (RunFinished), which is on its way after it."""
    await app.workers.wait_for_complete()
    while app.busy:
        await pilot.pause(0.05)


async def take(out: Path, size=(160, 48)) -> None:
    app = demo_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("l")
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


async def take_edit(out: Path, size=(160, 48)) -> None:
    app = demo_app()
    async with app.run_test(size=size) as pilot:
        for keys in (["b", *"stage logits", "enter"], ["e", *EDIT, "enter"], ["s"]):
            await pilot.press(*keys)
            await settle(app, pilot)
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


async def take_divergence(out: Path, size=(160, 48)) -> None:
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams

    from debugger.app import DebuggerApp
    from debugger.divergence import AloneComparison
    from debugger.session import Session, SessionOptions
    # a budget of 16 tokens: request 0's first decode step shares the long prompt's next chunk (gemm_tc), alone it
    # is one row (gemv)
    config = EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=16, precision="fast",
                          batch_invariant=False)
    engine = LLMEngine(None, config, log=lambda message: None)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = ["The sun rose", "A small dog ran along the river bank while the old man watched it from the bridge"]
    session = Session(engine, None, prompts, SessionOptions(params=params, record_rows=True))
    session.divergence = AloneComparison()
    app = DebuggerApp(session)
    async with app.run_test(size=size) as pilot:
        await pilot.press("c")
        await settle(app, pilot)
        await pilot.press("D")   # on request 0: the scheduler table's cursor row
        await settle(app, pilot)
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


async def take_tour(out: Path, chapter: str = TOUR_CHAPTER, size=(160, 48)) -> None:
    from tinyvllm.cli import parse_args

    from debugger.cli import debug_app
    app = debug_app(parse_args(["debug", "--tour"]))
    async with app.run_test(size=size) as pilot:
        while True:
            await settle(app, pilot)
            if app.tour.lesson.slug == chapter:
                break
            if app.tour.index == len(app.tour.lessons) - 1:
                raise SystemExit(f"the course has no {chapter} chapter")
            await pilot.press("n")
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


async def take_serving(out: Path, size=(160, 48)) -> None:
    import tempfile
    import threading
    import time

    import httpx

    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.serving.server import listen
    from debugger.serve_debug import ServerThread, serving_session

    from debugger.app import DebuggerApp
    engine = LLMEngine(None, EngineConfig(num_blocks=64, block_size=4), log=lambda message: None)
    session, feed = serving_session(engine, None)
    server = ServerThread(feed, listen("127.0.0.1", 0), "tinyvllm-demo")
    feed.url = server.url
    feed.start()
    server.start()
    bodies = [{"prompt": "The sun rose over the town", "max_tokens": 8, "temperature": 0, "stream": True},
              {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0.8, "seed": 3,
               "stream": True}]

    def client(path, body):
        with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=600) as response:
            for _ in response.iter_lines():
                pass

    threads = [threading.Thread(target=client, args=("/v1/completions", bodies[0])),
               threading.Thread(target=client, args=("/v1/chat/completions", bodies[1]))]
    app = DebuggerApp(session)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            here = os.getcwd()
            os.chdir(tmp)   # w records to ./tinyvllm-session.jsonl
            async with app.run_test(size=size) as pilot:
                await pilot.press("w")
                await pilot.press("B", *"kv 50%", "enter")
                threads[0].start()
                while len(session.view().requests) < 1:
                    await pilot.pause(0.05)
                await pilot.press("d")
                await app.workers.wait_for_complete()
                threads[1].start()
                deadline = time.monotonic() + 30
                while len(session.view().requests) < 2 and time.monotonic() < deadline:
                    await pilot.pause(0.05)
                await pilot.pause(0.3)
                app.save_screenshot(filename=out.name, path=str(out.parent))
            os.chdir(here)
    finally:
        session.close()
        server.stop()
        for t in threads:
            if t.is_alive():
                t.join(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shot = parser.add_mutually_exclusive_group()
    shot.add_argument("--serve", action="store_true", help="serve --debug with two HTTP clients instead")
    shot.add_argument("--tour", action="store_true", help=f"the course's tour at its {TOUR_CHAPTER} chapter instead")
    shot.add_argument("--edit", action="store_true", help="a value edit of the logits, and the step it changed")
    shot.add_argument("--divergence", action="store_true",
                      help="the divergence view (D) of a request batched vs alone, fast plan, invariance off")
    parser.add_argument("--chapter", default=TOUR_CHAPTER, metavar="SLUG",
                        help="with --tour, the chapter to stop at (its file name without the number, e.g. "
                             "paged-attention)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    out = args.out or (SERVE_OUT if args.serve else TOUR_OUT if args.tour else EDIT_OUT if args.edit else
                       DIVERGENCE_OUT if args.divergence else DEFAULT_OUT)
    asyncio.run(take_serving(out) if args.serve else take_tour(out, args.chapter) if args.tour else
                take_edit(out) if args.edit else take_divergence(out) if args.divergence else take(out))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
