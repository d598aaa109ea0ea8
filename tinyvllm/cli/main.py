"""The `tinyvllm` command: generate text with the serving engine, check a model against golden files."""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.choices import add_precision_arguments
from tinyvllm.cli.prompts_file import FORMATS, PromptSpec, read_prompt_specs

# The sampling flags' defaults: greedy. --use-generation-config lets the model's settings fill the flags
# still at these values.
SAMPLING_DEFAULTS = {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None,
                     "min_tokens": 0, "stop": (), "ignore_eos": False}
CUDA_SETUP_ERRORS = ("CudaSupportError", "CudaDriverError")


GENERATE_DESCRIPTION = """\
Generate for every prompt (--prompt, --prompts-file) and print each result, then a metrics table on
stderr. Every prompt is checked first: a bad line of a prompts file (not JSON, a missing or empty prompt,
malformed messages, an unknown field, a bad sampling value) is reported as FILE:LINE and the field before
the model loads; the other prompts still run, and the exit status is then 1 (as it is when a prompt fails
in the engine, e.g. one longer than the context)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each flag's help ends with its default, unless the help already speaks of
    it or there is none to show (None, a switch, an empty list)."""

    def _get_help_string(self, action):
        help = action.help or ""
        default = action.default
        if ("default" in help or default in (None, argparse.SUPPRESS, [], ()) or isinstance(default, bool)
                or not action.option_strings):
            return help
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{help} (default: {shown})"


class _Parser(argparse.ArgumentParser):
    """Every subcommand's parser shows defaults (HelpFormatter) unless it asks for another formatter."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def version() -> str:
    """The installed package's version (its metadata), or the source tree's when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version as installed_version
    from tinyvllm import __version__
    try:
        return installed_version("tinyvllm")
    except PackageNotFoundError:
        return __version__


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
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


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tinyvllm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(metavar="COMMAND", parser_class=_Parser)

    g = sub.add_parser("generate", help="generate for one or many prompts, print results and metrics",
                       description=GENERATE_DESCRIPTION)
    _engine_args(g)
    g.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    g.add_argument("--prompts-file", metavar="FILE",
                   help='one prompt per line, or JSONL (*.jsonl): {"prompt": ...} or {"messages": [...]}, '
                        "optionally with per-request sampling fields; - reads stdin")
    g.add_argument("--prompts-format", choices=FORMATS, default="auto",
                   help="auto: JSONL for *.jsonl files, and for stdin when its first line starts with {")
    g.add_argument("--chat", action="store_true", help="wrap each text prompt in the model's chat template")
    g.add_argument("--system", metavar="TEXT", help="system message for --chat")
    s = g.add_argument_group("sampling (default: greedy)")
    s.add_argument("--max-tokens", type=int, default=SAMPLING_DEFAULTS["max_tokens"], metavar="N",
                   help="new tokens per prompt")
    s.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS["temperature"], metavar="T",
                   help="0 = greedy")
    s.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS["top_p"], metavar="P",
                   help="sample from the smallest set of tokens whose probabilities add up to P (1 = off)")
    s.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS["top_k"], metavar="K",
                   help="sample from the K most likely tokens (-1 = off)")
    s.add_argument("--seed", type=int, metavar="S", help="same seed, same output (default: a random seed per request)")
    s.add_argument("--min-tokens", type=int, default=SAMPLING_DEFAULTS["min_tokens"], metavar="N",
                   help="ignore EOS and stop tokens until this many new tokens")
    s.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop string, cut from the output (repeatable)")
    s.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence tokens")
    s.add_argument("--use-generation-config", action="store_true",
                   help="start from the model's generation_config.json (temperature, top_p, top_k)")
    o = g.add_argument_group("output")
    o.add_argument("--stream", action="store_true",
                   help="print each output as it is generated (several prompts: in prompt order, each live once "
                        "the ones before it are done)")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal and not --stream)")
    o.add_argument("--metrics-json", metavar="FILE",
                   help="write per-request (with each prompt and text) and aggregate metrics as JSON")
    o.add_argument("--quiet-metrics", action="store_true", help="do not print the metrics table")
    g.set_defaults(run=_generate)

    c = sub.add_parser("check-goldens", help="compare every stage of the forward pass with a golden file")
    _engine_args(c)
    c.add_argument("--goldens", metavar="FILE", help="golden .npz (default: the demo model's, tinyvllm/goldens/demo.npz)")
    c.add_argument("--rtol", type=float, help="max error relative to each stage's largest value")
    c.add_argument("--no-greedy", action="store_true", help="skip the greedy continuation check")
    c.set_defaults(run=_check_goldens, precision="fp32")  # goldens are HF float32: the fp32 path only

    from tinyvllm import bench
    b = sub.add_parser("bench", help="benchmark latency, prefill, throughput and serving (optionally vs HF)",
                       description=bench.__doc__)
    bench.add_arguments(b)
    from tinyvllm.serving import replay
    replay.add_bench_arguments(b)
    b.set_defaults(run=bench.run)

    from tinyvllm.serving import cli as serving_cli
    sv = sub.add_parser("serve", help="serve the model: OpenAI-compatible HTTP API, or --jsonl on stdin/stdout",
                       description=serving_cli.__doc__)
    serving_cli.add_arguments(sv)
    sv.set_defaults(run=serving_cli.run)

    from tinyvllm.model.gguf import convert
    v = sub.add_parser("convert", help="write a GGUF model as an HF model directory", description=convert.__doc__)
    convert.add_arguments(v)
    v.set_defaults(run=convert.run)

    from tinyvllm.evaluation import cli as evaluation_cli
    e = sub.add_parser("eval", help="MMLU / GPQA-diamond accuracy of a model or an OpenAI-compatible server")
    _engine_args(e)
    evaluation_cli.add_arguments(e)
    # scoring is prefill-bound: big steps (the settings of the H200 runs in docs/eval.md; eval_profile.py --sweep)
    e.set_defaults(run=evaluation_cli.run, max_num_seqs=256, max_num_batched_tokens=16384)

    from debugger import trace
    d = sub.add_parser("debug", help="step through the engine stage by stage in a terminal app (Textual)")
    _engine_args(d)
    trace.add_session_arguments(d)
    from debugger import cli as debug_cli
    debug_cli.add_debug_arguments(d)
    d.set_defaults(run=_debug, block_size=4, num_blocks=64, precision="fp32")  # small blocks: a readable pool grid
    t = sub.add_parser("trace", help="run up to one stage and print its stats, golden diff and values")
    _engine_args(t)
    trace.add_arguments(t)
    t.set_defaults(run=_trace, precision="fp32")
    return parser


def _engine_args(p):
    p.add_argument("--model", metavar="DIR", help="HF Llama model directory, or a .gguf file (or a directory "
                                                  "holding one) (default: the demo model)")
    e = p.add_argument_group("engine")
    e.add_argument("--max-model-len", type=int, metavar="N", help="longest prompt + output (default: min(4096, model's))")
    e.add_argument("--max-num-seqs", type=int, default=8, metavar="N", help="sequences in flight per step")
    e.add_argument("--max-num-batched-tokens", type=int, default=512, metavar="N", help="token budget per step")
    e.add_argument("--block-size", type=int, default=16, metavar="N", help="tokens per KV block")
    e.add_argument("--num-blocks", type=int, metavar="N",
                   help="KV blocks in the pool (default: max-num-seqs x max-model-len, capped by memory)")
    e.add_argument("--gpu-memory-fraction", type=float, default=0.5, metavar="F",
                   help="share of free GPU memory for the KV pool when --num-blocks is not given")
    e.add_argument("--batching", choices=("continuous", "static"), default="continuous",
                   help="continuous: requests join and leave every step; static: a batch runs to completion")
    e.add_argument("--no-chunked-prefill", action="store_true",
                   help="prefill each prompt in one step (default: chunks within the token budget)")
    e.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV blocks of shared prefixes")
    add_precision_arguments(e)


def _engine(args):
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    config = EngineConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, num_blocks=args.num_blocks, gpu_memory_fraction=args.gpu_memory_fraction,
        max_model_len=args.max_model_len, chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching, batching=args.batching,
        kv_cache_dtype=args.kv_cache_dtype, precision=args.precision)
    return LLMEngine(args.model, config)


def _sampling_params(args, overrides: dict, where: str):
    """One request's SamplingParams: command-line flags (or, with --use-generation-config, the model's
    generation_config.json for what the flags leave unset), then the request's own JSONL fields."""
    from tinyvllm.engine.sampling_params import SamplingParams
    flags = {name: getattr(args, name) for name in SAMPLING_DEFAULTS} | {"stop": tuple(args.stop)}
    try:
        if args.use_generation_config:
            from tinyvllm.model.loader import read_generation_defaults
            defaults = read_generation_defaults(args.model)
            explicit = {k: v for k, v in flags.items() if v != SAMPLING_DEFAULTS[k]}
            return SamplingParams.from_generation_defaults(defaults, **{**explicit, **overrides})
        unknown = set(overrides) - set(SamplingParams.__dataclass_fields__)
        if unknown:
            raise TinyVLLMError(f"unknown sampling fields {sorted(unknown)}")
        return SamplingParams(**{**flags, **overrides})
    except (TypeError, ValueError, TinyVLLMError) as e:
        raise TinyVLLMError(f"{where}: {e}") from e


def _checked_specs(args) -> list[PromptSpec]:
    """Every prompt with its SamplingParams (`spec.params`) or its error. A bad flag fails them all (raised);
    a bad line of a prompts file fails only that line."""
    specs = read_prompt_specs(args.prompt, args.prompts_file, args.prompts_format)
    for spec in specs:
        if spec.error is not None:
            continue
        if not spec.overrides:  # only the flags decide: their error is everyone's (raised)
            spec.params = _sampling_params(args, {}, "invalid sampling parameters")
        else:
            try:
                spec.params = _sampling_params(args, spec.overrides, spec.source)
            except TinyVLLMError as e:
                spec.error = str(e)
                continue
        if args.chat and isinstance(spec.prompt, str):
            spec.prompt = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": spec.prompt}]
    return specs


def _shown(prompt) -> str:
    """A prompt as its results line shows it: the text, or a chat's last message."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return repr(prompt[-1].get("content"))
    return repr(prompt)


def _generate(args) -> int:
    from tinyvllm.engine.metrics import format_table
    specs = _checked_specs(args)
    # Bad lines are reported now, before the model loads; the others run; the exit status is then 1.
    for spec in specs:
        if spec.error:
            print(f"error: {spec.error}", file=sys.stderr)
    good = [spec for spec in specs if spec.error is None]
    if not good:
        print("error: no valid request to run", file=sys.stderr)
        return 1
    engine = _engine(args)
    print(f"generating for {len(good)} prompt(s)", file=sys.stderr)
    for spec in good:
        spec.request_id = engine.add_request(spec.prompt, spec.params)
    final = _run_with_live_output(engine, args, specs)
    for i, spec in enumerate(specs):
        out = final.get(spec.request_id)
        if spec.error is not None:
            print(f"[{i}] error: {spec.error}")
        elif not args.stream:  # --stream printed it already
            print(f"[{i}] {_shown(spec.prompt)}")
            print(f"    error: {out.error}" if out.error else
                  f"    -> {out.text!r}  ({len(out.token_ids)} tokens, {out.finish_reason})")
    summary = engine.metrics.summary()
    if not args.quiet_metrics:
        print(format_table(summary), file=sys.stderr)
    if args.metrics_json:
        extras = {spec.request_id: {"source": spec.source, "prompt": engine.request(spec.request_id).prompt,
                                    "text": final[spec.request_id].text, "error": final[spec.request_id].error}
                  for spec in good}
        report = summary.to_json_dict(extras)
        report["rejected"] = [{"source": spec.source, "error": spec.error} for spec in specs if spec.error]
        with open(args.metrics_json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 1 if len(good) < len(specs) or any(o.error for o in final.values()) else 0


def _run_with_live_output(engine, args, specs: list[PromptSpec]) -> dict:
    """Step the engine until every request has finished, feeding --stream and the progress bar; returns
    request id -> final RequestOutput."""
    from tinyvllm.cli.live_output import OrderedStream, ProgressBar
    good = [spec for spec in specs if spec.error is None]
    listeners = []
    if args.stream:
        stream = OrderedStream()
        for i, spec in enumerate(specs):
            if spec.error is None:
                stream.add(spec.request_id, f"[{i}] {_shown(spec.prompt)}", spec.params.stop)
        listeners.append(stream.update)
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty() and not args.stream
    progress = ProgressBar({spec.request_id: spec.params.max_tokens for spec in good}) if show_progress else None
    if progress:
        listeners.append(progress.update)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for listen in listeners:
                listen(out)
            if out.finished:
                final[out.request_id] = out
    if progress:
        progress.close()
    return final


def _check_goldens(args) -> int:
    from tinyvllm.golden_check import DEFAULT_GOLDENS, DEFAULT_RTOL, Goldens, GreedyResult, check_goldens
    if args.precision == "fast":
        raise TinyVLLMError("check-goldens compares with HF float32 goldens at 1e-4: it runs --precision fp32 only "
                            "(scripts/fast_path_compare.py checks the fast path against HF bf16 on a GPU)")
    if args.kv_cache_dtype == "bfloat16":
        raise TinyVLLMError("check-goldens compares with HF float32 goldens at 1e-4: it runs a float32 KV cache only")
    args.precision = "fp32"  # auto too
    args.kv_cache_dtype = "float32"
    goldens = Goldens.load(args.goldens or DEFAULT_GOLDENS)
    engine = _engine(args)
    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    print(f"goldens: {goldens.path} ({len(goldens.prompts)} prompts, source: {goldens.meta.get('source', '?')})")
    print(f"pass when max|ours - golden| / max|golden| <= {rtol:g}")
    print(f"{'prompt':>6}  {'stage':<26} {'max abs err':>12} {'max rel err':>12}  result")

    def show(r):
        if isinstance(r, GreedyResult):
            print(f"{r.prompt:>6}  greedy: {r.agreeing_prefix}/{len(r.golden)} tokens agree  "
                  f"{'PASS' if r.passed else 'FAIL'}  ours={r.ours} golden={r.golden}")
        else:
            verdict = "PASS" if r.passed else "FAIL"
            if r.note:
                verdict += f" ({r.note})"
            print(f"{r.prompt:>6}  {r.stage:<26} {r.max_abs:12.3e} {r.max_rel:12.3e}  {verdict}", flush=True)

    report = check_goldens(engine, goldens, rtol=rtol, check_greedy=not args.no_greedy, on_result=show)
    worst = max((s for s in report.stages if s.max_rel == s.max_rel), key=lambda s: s.max_rel, default=None)
    if worst:
        print(f"worst stage: prompt {worst.prompt} {worst.stage} rel err {worst.max_rel:.3e}")
    if report.passed:
        print(f"all {len(report.stages)} stages and {len(report.greedy)} greedy continuations PASS")
        return 0
    first = report.first_failure
    print("FAIL" + (f": first failing stage is prompt {first.prompt} {first.stage}" if first else ": greedy tokens differ"))
    return 1


def debug_app(args):
    """The debugger app `tinyvllm debug` runs, on an engine and session made from the arguments."""
    from debugger.app import DebuggerApp
    from debugger.trace import session_from_args
    return DebuggerApp(session_from_args(args, _engine(args)))


def _debug(args) -> int:
    if args.replay:
        from debugger.cli import run_debug_replay
        return run_debug_replay(args)
    app = debug_app(args)
    app.run()
    if app.failure is not None:  # the app exited on an unhandled exception: main() gives it one line
        raise app.failure
    return app.return_code or 0


def _trace(args) -> int:
    from debugger import trace
    return trace.run(args, _engine)


if __name__ == "__main__":
    sys.exit(main())
