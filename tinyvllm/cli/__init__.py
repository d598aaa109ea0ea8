"""The `tinyvllm` command: generate text with the serving engine, check a model against golden files."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Iterable

from tinyvllm.cli.formatting import CommandParser
from tinyvllm.errors import TinyVLLMError

CUDA_SETUP_ERRORS = ("CudaSupportError", "CudaDriverError")


@dataclass(frozen=True)
class Command:
    """A subcommand: the module holding its add_arguments(parser) and run(args) -> int (an optional
    DESCRIPTION is its --help text), imported only when the command runs or shows its help."""
    module: str
    help: str


# The commands, in --help's order. debug and trace drive the debugger's Session, so their modules live in
# debugger/: these module paths are the one place tinyvllm names the debugger (strings, never imports).
COMMANDS = {
    "generate": Command("tinyvllm.cli.generate", "generate for one or many prompts, print results and metrics"),
    "check-goldens": Command("tinyvllm.cli.check_goldens",
                             "compare every stage of the forward pass with a golden file"),
    "bench": Command("tinyvllm.cli.bench", "benchmark latency, prefill, throughput and serving (optionally vs HF)"),
    "serve": Command("tinyvllm.cli.serve", "serve the model: OpenAI-compatible HTTP API, or --jsonl on stdin/stdout"),
    "convert": Command("tinyvllm.cli.convert", "write a GGUF model as an HF model directory"),
    "eval": Command("tinyvllm.cli.eval", "MMLU / GPQA-diamond accuracy of a model or an OpenAI-compatible server"),
    "debug": Command("debugger.cli", "step through the engine stage by stage in a terminal app (Textual)"),
    "trace": Command("debugger.trace", "run up to one stage and print its stats, golden diff and values"),
}
# `serve --debug`: the debugger steps the HTTP server; `serve` hands its arguments over to this module's run.
SERVE_DEBUG = Command("debugger.serve_debug", "step the server in the debugger")


def load(command: Command) -> ModuleType:
    return importlib.import_module(command.module)


def version() -> str:
    """The installed package's version (its metadata), or the source tree's when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version as installed_version
    from tinyvllm import __version__
    try:
        return installed_version("tinyvllm")
    except PackageNotFoundError:
        return __version__


def build_parser(loaded: Iterable[str] = ()) -> argparse.ArgumentParser:
    """The whole command line: every command listed with its help; the commands named in `loaded` also get
    their arguments (importing their modules), the others only parse as far as their name."""
    parser = CommandParser(prog="tinyvllm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(metavar="COMMAND", parser_class=CommandParser)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help)
        if name in loaded:
            module = load(command)
            p.description = getattr(module, "DESCRIPTION", None)
            module.add_arguments(p)
            p.set_defaults(run=module.run)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """argv parsed with only its own command's module loaded."""
    commands = [a for a in argv if not a.startswith("-")]  # the top level has no flag that takes a value
    return build_parser(commands[:1]).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if not hasattr(args, "run"):
        build_parser().print_help()
        return 2
    try:
        return args.run(args)
    except TinyVLLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: say so plainly, traceback on request
        if os.environ.get("TINYVLLM_DEBUG"):
            traceback.print_exc()
        if type(e).__name__ in CUDA_SETUP_ERRORS:  # a GPU was asked for (NUMBA_ENABLE_CUDASIM=0) and is not usable
            print(f"error: no usable CUDA GPU ({type(e).__name__}: {_first_line(e)}); unset NUMBA_ENABLE_CUDASIM "
                  f"(tinyvllm then picks numba's CUDA simulator) or set NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
            return 1
        print(f"internal error: {type(e).__name__}: {_first_line(e)} (set TINYVLLM_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 70


def _first_line(e: Exception) -> str:
    """An exception's message on one line (numba's driver errors span several)."""
    return " ".join(str(e).split()) or "(no message)"
