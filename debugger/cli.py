"""`tinyvllm debug`: step through the engine stage by stage in the debugger app, on its own prompts or on a
recorded serving session (--replay FILE, debugger/serve_debug.py). `tinyvllm serve --debug` is
serve_debug.run. Parsing the command line imports no engine and no Textual."""
from __future__ import annotations

import sys

from debugger import trace
from tinyvllm.engine.args import add_engine_arguments, build_engine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.serving.recording import check_recording_path


def add_arguments(p) -> None:
    add_engine_arguments(p)
    trace.add_session_arguments(p)
    p.add_argument("--replay", metavar="FILE",
                   help="step a recorded serving session (tinyvllm serve --record FILE): its requests enter at "
                        "their recorded steps, on the recorded model and engine configuration; at the end, each "
                        "request's tokens against the recorded answer (exit 1 when one diverged)")
    p.add_argument("--record", metavar="FILE",
                   help="record this session (its requests, their answers, the value edits made with e) as "
                        "serve --record does, for tinyvllm debug --replay FILE to step again")
    p.add_argument("--compare-precision", action="store_true",
                   help="also step an engine of the other precision (fp32 <-> fast) on the same requests, in "
                        "lockstep: the golden diff panel shows each stage's max |main - other| and max rel, until "
                        "the two sample different tokens; D shows where the picked request's two runs part. With "
                        "--replay FILE: the recording's requests and aborts, at their recorded steps")
    p.add_argument("--compare-alone", action="store_true",
                   help="keep every stage's rows, so that D shows where the picked request's run parts from the same "
                        "request run alone (a fresh engine with the same configuration, given only that request)")
    p.add_argument("--against", metavar="FILE2",
                   help="with --replay FILE: D compares the picked request's answer in FILE with the same prompt's in "
                        "FILE2 (tokens: recordings hold no stage tensors)")
    p.add_argument("--tour", action="store_true",
                   help="the course's tour: step the engine chapter by chapter (n: next), each lesson beside the "
                        "tensor panel at the stage it explains (tinyvllm/course/lessons/)")
    p.set_defaults(block_size=4, num_blocks=64, precision="fp32")  # small blocks: a readable pool grid


def debug_app(args):
    """The debugger app `tinyvllm debug` runs, on an engine and session made from the arguments."""
    from debugger.app import DebuggerApp
    from debugger.divergence import comparison_for
    comparison = comparison_for(args)   # before the model loads: flags that do not combine fail at once
    tour = None
    if getattr(args, "tour", False):
        from debugger.tour import Tour
        from tinyvllm.course import load_lessons
        tour = Tour(load_lessons())
    session = trace.session_from_args(args, build_engine(args, reference=True))
    session.divergence = comparison
    return DebuggerApp(session, tour)


def run(args) -> int:
    if args.record and (args.replay or args.tour):
        raise TinyVLLMError(f"--record records the debugger's own requests; it does not combine with "
                            f"{'--replay' if args.replay else '--tour'}")
    if args.replay:
        return _run_replay(args)
    if args.record:
        check_recording_path(args.record)
    app = debug_app(args)
    if args.record:
        app.session.record_to(args.record, args.model)
    app.run()
    app.session.close()
    if args.record:
        print(f"tinyvllm debug: recorded to {args.record} (tinyvllm debug --replay {args.record})", file=sys.stderr)
    if app.failure is not None:  # the app exited on an unhandled exception: main() gives it one line
        raise app.failure
    return app.return_code or 0


def _run_replay(args) -> int:
    if args.tour:
        raise TinyVLLMError("--tour steps the debugger's own requests; it does not combine with --replay")
    from debugger.serve_debug import run_debug_replay
    return run_debug_replay(args)
