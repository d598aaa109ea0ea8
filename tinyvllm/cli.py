"""The `tinyvllm` command: generate text with the serving engine, check a model against golden files."""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from .errors import TinyVLLMError

# The sampling flags' defaults: greedy. --use-generation-config lets the model's settings fill the flags
# still at these values.
SAMPLING_DEFAULTS = {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None,
                     "min_tokens": 0, "stop": (), "ignore_eos": False}


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
        print(f"internal error: {type(e).__name__}: {e} (set TINYVLLM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 70


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinyvllm", description=__doc__)
    sub = parser.add_subparsers(metavar="COMMAND")

    g = sub.add_parser("generate", help="generate for one or many prompts, print results and metrics")
    _engine_args(g)
    g.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    g.add_argument("--prompts-file", metavar="FILE",
                   help='one prompt per line, or JSONL (*.jsonl): {"prompt": ...} or {"messages": [...]}, '
                        "optionally with per-request sampling fields")
    g.add_argument("--chat", action="store_true", help="wrap each text prompt in the model's chat template")
    g.add_argument("--system", metavar="TEXT", help="system message for --chat")
    s = g.add_argument_group("sampling (default: greedy)")
    s.add_argument("--max-tokens", type=int, default=SAMPLING_DEFAULTS["max_tokens"], metavar="N",
                   help="new tokens per prompt")
    s.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS["temperature"], help="0 = greedy")
    s.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS["top_p"])
    s.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS["top_k"], help="-1 = off")
    s.add_argument("--seed", type=int, help="same seed, same output")
    s.add_argument("--min-tokens", type=int, default=SAMPLING_DEFAULTS["min_tokens"])
    s.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    s.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence tokens")
    s.add_argument("--use-generation-config", action="store_true",
                   help="start from the model's generation_config.json (temperature, top_p, top_k)")
    g.add_argument("--metrics-json", metavar="FILE", help="write per-request and aggregate metrics as JSON")
    g.add_argument("--quiet-metrics", action="store_true", help="do not print the metrics table")
    g.set_defaults(run=_generate)

    c = sub.add_parser("check-goldens", help="compare every stage of the forward pass with a golden file")
    _engine_args(c)
    c.add_argument("--goldens", metavar="FILE", help="golden .npz (default: goldens/demo.npz)")
    c.add_argument("--rtol", type=float, help="max error relative to each stage's largest value")
    c.add_argument("--no-greedy", action="store_true", help="skip the greedy continuation check")
    c.set_defaults(run=_check_goldens)

    from . import bench
    b = sub.add_parser("bench", help="benchmark latency, prefill, throughput and serving (optionally vs HF)",
                       description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(b)
    from .serving import replay
    replay.add_bench_arguments(b)
    b.set_defaults(run=bench.run)

    from .serving import cli as serving_cli
    sv = sub.add_parser("serve", help="serve the model: OpenAI-compatible HTTP API, or --jsonl on stdin/stdout",
                       description=serving_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serving_cli.add_arguments(sv)
    sv.set_defaults(run=serving_cli.run)

    from .gguf_import import convert
    v = sub.add_parser("convert", help="write a GGUF model as an HF model directory", description=convert.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    convert.add_arguments(v)
    v.set_defaults(run=convert.run)

    from .evaluation import cli as evaluation_cli
    e = sub.add_parser("eval", help="MMLU / GPQA-diamond accuracy of a model or an OpenAI-compatible server")
    _engine_args(e)
    evaluation_cli.add_arguments(e)
    e.set_defaults(run=evaluation_cli.run, max_num_seqs=32, max_num_batched_tokens=4096)

    from . import trace
    d = sub.add_parser("debug", help="step through the engine stage by stage in a terminal app (Textual)")
    _engine_args(d)
    trace.add_session_arguments(d)
    d.set_defaults(run=_debug, block_size=4, num_blocks=64)  # small blocks make a readable pool grid
    t = sub.add_parser("trace", help="run up to one stage and print its stats, golden diff and values")
    _engine_args(t)
    trace.add_arguments(t)
    t.set_defaults(run=_trace)
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
    e.add_argument("--batching", choices=("continuous", "static"), default="continuous")
    e.add_argument("--no-chunked-prefill", action="store_true")
    e.add_argument("--no-prefix-caching", action="store_true")


def _engine(args):
    from .engine import EngineConfig, LLMEngine
    config = EngineConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, num_blocks=args.num_blocks, gpu_memory_fraction=args.gpu_memory_fraction,
        max_model_len=args.max_model_len, chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching, batching=args.batching)
    return LLMEngine(args.model, config)


def _read_requests(args) -> list[tuple[object, dict]]:
    """(prompt, per-request sampling overrides) for every prompt given on the command line or in a file."""
    requests = [(p, {}) for p in args.prompt]
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                lines = [(n, line.rstrip("\n")) for n, line in enumerate(f, 1) if line.strip()]
        except OSError as e:
            raise TinyVLLMError(f"cannot read prompts file {args.prompts_file}: {e.strerror}") from e
        for n, line in lines:
            if not args.prompts_file.endswith(".jsonl"):
                requests.append((line, {}))
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise TinyVLLMError(f"{args.prompts_file}:{n}: not JSON ({e.msg})") from e
            if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
                raise TinyVLLMError(f'{args.prompts_file}:{n}: expected an object with "prompt" or "messages"')
            prompt = item.pop("prompt", None) or item.pop("messages")
            requests.append((prompt, item))
    if not requests:
        raise TinyVLLMError("no prompt given: use --prompt TEXT (repeatable) or --prompts-file FILE")
    return requests


def _sampling_params(args, overrides: dict, where: str):
    """One request's SamplingParams: command-line flags (or, with --use-generation-config, the model's
    generation_config.json for what the flags leave unset), then the request's own JSONL fields."""
    from .sampling_params import SamplingParams
    flags = {name: getattr(args, name) for name in SAMPLING_DEFAULTS} | {"stop": tuple(args.stop)}
    try:
        if args.use_generation_config:
            from .model import read_generation_defaults
            defaults = read_generation_defaults(args.model)
            explicit = {k: v for k, v in flags.items() if v != SAMPLING_DEFAULTS[k]}
            return SamplingParams.from_generation_defaults(defaults, **{**explicit, **overrides})
        unknown = set(overrides) - set(SamplingParams.__dataclass_fields__)
        if unknown:
            raise TinyVLLMError(f"unknown sampling fields {sorted(unknown)}")
        return SamplingParams(**{**flags, **overrides})
    except (TypeError, ValueError, TinyVLLMError) as e:
        raise TinyVLLMError(f"{where}: {e}") from e


def _generate(args) -> int:
    from .metrics import format_table
    requests = _read_requests(args)
    # Every request's sampling parameters are checked before the model is loaded.
    params = [_sampling_params(args, overrides, "invalid sampling parameters" if not overrides else f"request {i}")
              for i, (_, overrides) in enumerate(requests)]
    prompts = []
    for prompt, _ in requests:
        if args.chat and isinstance(prompt, str):
            prompt = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": prompt}]
        prompts.append(prompt)
    engine = _engine(args)
    print(f"generating for {len(prompts)} prompt(s)", file=sys.stderr)
    outputs = engine.generate(prompts, params)
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        shown = prompt[-1].get("content") if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) else prompt
        print(f"[{i}] {shown!r}")
        if out.error:
            print(f"    error: {out.error}")
        else:
            print(f"    -> {out.text!r}  ({len(out.token_ids)} tokens, {out.finish_reason})")
    summary = engine.metrics.summary()
    if not args.quiet_metrics:
        print(format_table(summary), file=sys.stderr)
    if args.metrics_json:
        with open(args.metrics_json, "w", encoding="utf-8") as f:
            json.dump(summary.to_json_dict(), f, indent=1)
    return 1 if any(o.error for o in outputs) else 0


def _check_goldens(args) -> int:
    from .golden_check import DEFAULT_GOLDENS, DEFAULT_RTOL, Goldens, GreedyResult, check_goldens
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


def _debug(args) -> int:
    from debugger.app import DebuggerApp
    from .trace import session_from_args
    DebuggerApp(session_from_args(args, _engine(args))).run()
    return 0


def _trace(args) -> int:
    from . import trace
    return trace.run(args, _engine)


if __name__ == "__main__":
    sys.exit(main())
