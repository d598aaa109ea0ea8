"""`tinyvllm trace`: the debugger without the UI. Runs the engine (through the same debugger Session) up
to one stage and prints what the tensor inspector and the golden panel would show.

    tinyvllm trace --list                                 # every stage name, in order
    tinyvllm trace --stage layers.1.mlp [--prompt TEXT] [--step N] [--rows R] [--cols C]

Without --prompt the first golden prompt runs, so the stage's golden diff is printed too.
"""
from __future__ import annotations

from tinyvllm.engine.args import add_engine_arguments, build_engine
from tinyvllm.errors import TinyVLLMError


def add_session_arguments(p) -> None:
    """What `debug` and `trace` share: the prompts and the golden file."""
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt (repeatable; default: the first golden prompt)")
    p.add_argument("--requests", metavar="FILE", help="more prompts, one per line")
    p.add_argument("--goldens", metavar="FILE", help="golden .npz (default: the demo model's, tinyvllm/goldens/demo.npz)")
    p.add_argument("--no-goldens", action="store_true", help="compare with no golden file")
    p.add_argument("--max-tokens", type=int, default=8, metavar="N", help="new tokens per request (greedy)")


def add_arguments(p) -> None:
    add_engine_arguments(p)
    add_session_arguments(p)
    p.add_argument("--list", action="store_true", help="list the stage names and exit")
    p.add_argument("--stage", metavar="NAME", help="the stage to dump, e.g. layers.1.mlp")
    p.add_argument("--step", type=int, default=0, metavar="N", help="in which scheduler step (0 = the first)")
    p.add_argument("--rows", type=int, default=4, metavar="R", help="rows of values to print")
    p.add_argument("--cols", type=int, default=8, metavar="C", help="columns of values to print")
    p.set_defaults(precision="fp32")


def session_from_args(args, engine):
    """A debugger Session over `engine` with the prompts and goldens the arguments name."""
    from debugger.session import Session, SessionOptions
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
    from tinyvllm.engine.sampling_params import SamplingParams
    prompts = list(args.prompt)
    if args.requests:
        try:
            with open(args.requests, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise TinyVLLMError(f"cannot read requests file {args.requests}: {e.strerror}") from e
    goldens = None if args.no_goldens else Goldens.load(args.goldens or DEFAULT_GOLDENS)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    except ValueError as e:
        raise TinyVLLMError(f"invalid --max-tokens: {e}") from e
    return Session(engine, goldens, prompts or None,
                   SessionOptions(params=params, compare_precision=getattr(args, "compare_precision", False),
                                  record_rows=getattr(args, "compare_alone", False)))


def list_stages(num_layers: int) -> str:
    from debugger.session import stage_names
    return "\n".join(stage_names(num_layers))


def run(args) -> int:
    from debugger.session import Breakpoint, StageRecord, as_rows, stage_names
    if args.list:
        from tinyvllm.model.loader import read_model_config
        print(list_stages(read_model_config(args.model).num_hidden_layers))
        return 0
    if not args.stage:
        raise TinyVLLMError("say which stage: --stage NAME (--list shows them)")
    if args.no_goldens and not (args.prompt or args.requests):
        raise TinyVLLMError("nothing to run: without --prompt TEXT or --requests FILE the golden prompts run, "
                            "and --no-goldens leaves none")
    engine = build_engine(args, reference=True)
    names = stage_names(engine.model.config.num_hidden_layers)
    if args.stage not in names:
        raise TinyVLLMError(f"unknown stage {args.stage!r}: --list shows the {len(names)} stage names")
    session = session_from_args(args, engine)
    breakpoint = Breakpoint("stage", args.stage)
    while True:
        result = session.run_until(breakpoint)
        if result.reason != "breakpoint":
            raise TinyVLLMError(f"stage {args.stage} did not run in step {args.step}: the requests finished "
                                f"after {session.step_index} steps")
        if result.event.step >= args.step:
            break
    record: StageRecord = result.event
    print(f"step {record.step} stage {record.name}: kernel {record.kernel}, {record.seconds * 1000:.1f} ms")
    print(record.stats.describe())
    for g in record.golden:
        verdict = g.status.upper() + (f" ({g.note})" if g.note else "")
        print(f"golden p{g.prompt} (request {g.request_id}): max abs {g.max_abs:.3e} max rel {g.max_rel:.3e} "
              f"{verdict}")
    if not record.golden:
        print(f"golden: absent ({session.view().golden.absent_reason or 'no golden rows in this stage'})")
    values = as_rows(record.values)
    rows, cols = min(args.rows, values.shape[0]), min(args.cols, values.shape[1])
    print(f"values [0:{rows}, 0:{cols}] of {values.shape[0]} x {values.shape[1]} (tokens x features):")
    for r in range(rows):
        print(f"  {r:>4}: " + " ".join(f"{v:11.4e}" for v in values[r, :cols]))
    return 0
