"""`tinyvllm generate`: generate for prompts from the command line or a prompts file, print each result and
a metrics table."""
from __future__ import annotations

import argparse
import json
import sys

from tinyvllm.cli.formatting import count
from tinyvllm.cli.prompts_file import FORMATS, PromptSpec, read_prompt_specs
from tinyvllm.engine.args import add_engine_arguments, build_engine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.progress_timing import log_interval

PROGRESS_EVERY_S = 5.0  # a progress line this often when stderr is not a terminal

# The sampling flags' defaults: greedy. --use-generation-config lets the model's settings fill the flags
# still at these values.
SAMPLING_DEFAULTS = {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None,
                     "min_tokens": 0, "stop": (), "ignore_eos": False}

DESCRIPTION = """\
Generate for every prompt (--prompt, --prompts-file) and print each result, then a metrics table on
stderr. Every prompt is checked first: a bad line of a prompts file (not JSON, a missing or empty prompt,
malformed messages, an unknown field, a bad sampling value) is reported as FILE:LINE and the field before
the model loads; the other prompts still run, and the exit status is then 1 (as it is when a prompt fails
in the engine, e.g. one longer than the context)."""


def add_arguments(p) -> None:
    add_engine_arguments(p)
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    p.add_argument("--prompts-file", metavar="FILE",
                   help='one prompt per line, or JSONL (*.jsonl): {"prompt": ...} or {"messages": [...]}, '
                        "optionally with per-request sampling fields; - reads stdin")
    p.add_argument("--prompts-format", choices=FORMATS, default="auto",
                   help="auto: JSONL for *.jsonl files, and for stdin when its first line starts with {")
    p.add_argument("--chat", action="store_true", help="wrap each text prompt in the model's chat template")
    p.add_argument("--system", metavar="TEXT", help="system message for --chat")
    s = p.add_argument_group("sampling (default: greedy)")
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
    o = p.add_argument_group("output")
    o.add_argument("--stream", action="store_true",
                   help="print each output as it is generated (several prompts: in prompt order, each live once "
                        "the ones before it are done)")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal and not --stream)")
    o.add_argument("--metrics-json", metavar="FILE",
                   help="write per-request (with each prompt and text) and aggregate metrics as JSON")
    o.add_argument("--quiet-metrics", action="store_true", help="do not print the metrics table")


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


def run(args) -> int:
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
    engine = build_engine(args)
    print(f"generating for {len(good)} prompt(s)", file=sys.stderr)
    for spec in good:
        spec.request_id = engine.add_request(spec.prompt, spec.params)
    estimate_s = _announce(engine, [spec.request_id for spec in good])
    final = _run_with_live_output(engine, args, specs, estimate_s)
    for i, spec in enumerate(specs):
        out = final.get(spec.request_id)
        if spec.error is not None:
            print(f"[{i}] error: {spec.error}")
        elif not args.stream:  # --stream printed it already
            print(f"[{i}] {_shown(spec.prompt)}")
            print(f"    error: {out.error}" if out.error else
                  f"    -> {out.text!r}  ({count(len(out.token_ids), 'token')}, {out.finish_reason})")
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


def _announce(engine, request_ids: list[str]) -> float | None:
    """The simulator's up-front estimate of the run, printed when it is long (None on a GPU)."""
    from tinyvllm.runtime_estimate import announce, engine_estimate, engine_work
    work = engine_work(engine, request_ids)
    seconds = engine_estimate(engine, work)
    tokens = set(work.new_tokens)
    what = (f"{count(len(work.new_tokens), 'prompt')} x {count(tokens.pop(), 'token')}" if len(tokens) == 1 else
            f"{count(len(work.new_tokens), 'prompt')}, up to {count(sum(work.new_tokens), 'new token')}")
    announce(seconds, what)
    return seconds


def _run_with_live_output(engine, args, specs: list[PromptSpec], estimate_s: float | None = None) -> dict:
    """Step the engine until every request has finished, feeding --stream and the progress bar; returns
    request id -> final RequestOutput. Without --progress / --no-progress: a bar on a terminal, else lines every
    few seconds once the run has taken that long (none with --stream, whose text shows the progress)."""
    from tinyvllm.cli.live_output import OrderedStream, ProgressBar
    good = [spec for spec in specs if spec.error is None]
    listeners = []
    if args.stream:
        stream = OrderedStream()
        for i, spec in enumerate(specs):
            if spec.error is None:
                stream.add(spec.request_id, f"[{i}] {_shown(spec.prompt)}", spec.params.stop)
        listeners.append(stream.update)
    show_progress = args.progress if args.progress is not None else not args.stream
    progress = None
    if show_progress:
        progress = ProgressBar({spec.request_id: spec.params.max_tokens for spec in good},
                               log_every=log_interval(PROGRESS_EVERY_S), estimate_s=estimate_s,
                               final_line=args.progress is not None or sys.stderr.isatty())
    if progress:
        listeners.append(progress.update)
    final = {}
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                for listen in listeners:
                    listen(out)
                if out.finished:
                    final[out.request_id] = out
    finally:
        if progress:
            progress.close()
    return final
