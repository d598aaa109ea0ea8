"""Make docs/debugger.svg: the demo model with its goldens, stepped through its first layer (press `l`).

    python -m debugger.screenshot [--out docs/debugger.svg]     (runs in the simulator unless told otherwise)
"""
from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "debugger.svg"


async def take(out: Path, size=(160, 48)) -> None:
    from tinyvllm.engine import EngineConfig, LLMEngine
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens

    from .app import DebuggerApp
    from .session import Session
    engine = LLMEngine(None, EngineConfig(num_blocks=64, block_size=4), log=lambda message: None)
    app = DebuggerApp(Session(engine, Goldens.load(DEFAULT_GOLDENS)))
    async with app.run_test(size=size) as pilot:
        await pilot.press("l")
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    asyncio.run(take(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
