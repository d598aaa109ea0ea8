"""The debugger's serving options (light: parsing the command line imports no engine): `tinyvllm debug
--replay FILE`; `tinyvllm serve --debug` is in serving/cli.py. The logic is in debug_mode.py."""
from __future__ import annotations


def add_debug_arguments(p) -> None:
    p.add_argument("--replay", metavar="FILE",
                   help="step a recorded serving session (tinyvllm serve --record FILE): its requests enter at "
                        "their recorded steps, on the recorded model and engine configuration; at the end, each "
                        "request's tokens against the recorded answer (exit 1 when one diverged)")


    p.add_argument("--compare-precision", action="store_true",
                   help="also step an engine of the other precision (fp32 <-> fast) on the same requests, in "
                        "lockstep: the golden diff panel shows each stage's max |main - other| and max rel, until "
                        "the two sample different tokens")


def run_debug_replay(args) -> int:
    if getattr(args, "compare_precision", False):
        from tinyvllm.errors import TinyVLLMError
        raise TinyVLLMError("--compare-precision steps the debugger's own requests; it does not combine with --replay")
    from debugger.serve_debug import run_debug_replay as run
    return run(args)
