"""`tinyvllm eval`: the command's flags and what it does with them (tinyvllm/evaluation holds the rest)."""
from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from pathlib import Path

from tinyvllm.engine.args import add_engine_arguments, build_engine, engine_config_from_args
from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.prompts import ANSWER_PREFIX
from tinyvllm.evaluation.runner import MODES, EvalConfig, prepare_task, run_task, select
from tinyvllm.evaluation.tasks import GPQA_ORDERS, TASKS

DEFAULT_OUT = "out/eval"


def add_arguments(p) -> None:
    """The engine flags (--model, --max-num-seqs, ...), then the eval flags."""
    add_engine_arguments(p)
    # scoring is prefill-bound: big steps (the settings of the runs in docs/eval.md; eval_profile.py --sweep)
    p.set_defaults(max_num_seqs=256, max_num_batched_tokens=16384)
    d = EvalConfig()
    p.add_argument("--tasks", default=",".join(d.tasks), metavar="LIST",
                   help=f"comma-separated, from {','.join(TASKS)} (default: %(default)s)")
    p.add_argument("--mode", choices=MODES, default=d.mode,
                   help="loglikelihood: the answer letter's log-probability after the prompt, highest wins "
                        "(lm-evaluation-harness); generative: the model answers through its chat template and "
                        "the letter is parsed (Meta's 'The best answer is')")
    p.add_argument("--num-fewshot", type=int, default=d.num_fewshot, metavar="K",
                   help="MMLU dev examples before each question, 0-5 (GPQA is always 0-shot)")
    s = p.add_mutually_exclusive_group()
    s.add_argument("--limit", type=int, metavar="N",
                   help="a reproducible subset of N questions per task, stratified by subject and prompt length")
    s.add_argument("--subset", metavar="FILE",
                   help="exactly these questions: ids one per line ([task:]id), or an earlier results.json")
    p.add_argument("--seed", type=int, default=d.seed, help="the --limit sample's seed (default: %(default)s)")
    p.add_argument("--max-context", type=int, default=d.max_context, metavar="N",
                   help="context cap: longer prompts are reported as too long, not run (default: %(default)s)")
    p.add_argument("--max-gen-tokens", type=int, default=d.max_gen_tokens, metavar="N",
                   help="generative: new tokens per answer (default: %(default)s)")
    p.add_argument("--answer-prefix", default=d.answer_prefix, metavar="TEXT",
                   help=f"generative: the assistant's answer begins with this (default: {ANSWER_PREFIX!r}; '' = none)")
    p.add_argument("--no-special-tokens", dest="add_special_tokens", action="store_false",
                   help="loglikelihood: do not let the tokenizer add its BOS to prompts (lm-eval's HF default)")
    p.add_argument("--gpqa-order", choices=GPQA_ORDERS, default=d.gpqa_order,
                   help="GPQA's choice order: tinyvllm (a hash of each Record ID) or lm-eval (as lm-evaluation-"
                        "harness's gpqa_diamond_zeroshot: random.seed(0), one shuffle per row), so per-question "
                        "results line up with lm-eval runs (default: %(default)s)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help="results.json, items.csv, summary.txt, lengths_<task>.png (default: %(default)s)")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="no PNG histograms even with matplotlib")
    r = p.add_argument_group("OpenAI-compatible server (instead of the in-process engine)")
    r.add_argument("--base-url", metavar="URL",
                   help="evaluate through this server (e.g. http://127.0.0.1:8000/v1); --model DIR then names "
                        "the served model's directory, for its tokenizer only")
    r.add_argument("--served-model", metavar="NAME", help="model name to request (default: the server's first)")
    r.add_argument("--api-key", metavar="KEY", help="bearer token for the server")
    r.add_argument("--concurrency", type=int, default=8, metavar="N", help="requests in flight (default: %(default)s)")


def config_from_args(args) -> EvalConfig:
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    return EvalConfig(tasks=tasks, mode=args.mode, num_fewshot=args.num_fewshot, limit=args.limit,
                      subset=args.subset, seed=args.seed, max_context=args.max_context,
                      max_gen_tokens=args.max_gen_tokens, answer_prefix=args.answer_prefix,
                      add_special_tokens=args.add_special_tokens, gpqa_order=args.gpqa_order)


def run(args) -> int:
    t0 = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr, flush=True)

    config = config_from_args(args)
    backend, tokenizer, model_info, config = _backend(args, config, log)
    prepared = []
    for task in config.tasks:
        prepared.append(prepare_task(task, config, tokenizer))
        p = prepared[-1]
        log(f"{task}: {len(p.questions)} questions, {sum(n is not None for n in p.lengths)} prompts tokenized")
    selection = select(prepared, config)
    estimates = _estimates(backend, prepared, selection, config)
    runs = [run_task(p, selection[p.task], config, backend, tokenizer, estimates.get(p.task)) for p in prepared]
    from tinyvllm.evaluation.report import format_summary, task_summary, write_report
    report = {
        "format": "tinyvllm-eval/1",
        "command": _command_line(args, config),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backend": backend.name,
        "model": model_info,
        "config": dataclasses.asdict(config),
        "selection": (f"--subset {config.subset}" if config.subset else
                      f"stratified --limit {config.limit}, seed {config.seed}" if config.limit else "all"),
        "tasks": {run.prepared.task: task_summary(run, config) for run in runs},
        "wall_seconds": time.perf_counter() - t0,
    }
    written = write_report(report, runs, Path(args.out), args.plot, log)
    print(format_summary(report))
    log("wrote " + ", ".join(map(str, written)))
    return 1 if any(s["num_errors"] for s in report["tasks"].values()) else 0


def _backend(args, config: EvalConfig, log):
    """(backend, tokenizer, model facts, config with the context cap the model allows)."""
    if args.base_url:
        from tinyvllm.model.tokenizer import Tokenizer
        from tinyvllm.evaluation.remote import RemoteBackend
        if not args.model:
            raise TinyVLLMError("--base-url needs --model DIR: the served model's directory (or .gguf), for its tokenizer "
                                "(prompt lengths, the context cap and the answer letters' tokens)")
        from tinyvllm.model.gguf import GGUFModelFiles, find_gguf_file
        gguf_file = find_gguf_file(args.model) if Path(args.model).exists() else None
        tokenizer = GGUFModelFiles.read(gguf_file).tokenizer() if gguf_file else Tokenizer.from_model_dir(args.model)
        backend = RemoteBackend(args.base_url, args.served_model, args.api_key, args.concurrency)
        log(f"evaluating through {backend.name}")
        return backend, tokenizer, {"tokenizer_dir": str(args.model), "served_model": backend.model}, config
    from tinyvllm.evaluation.backends import EngineBackend
    engine_config = engine_config_from_args(args, reference=True, max_model_len=args.max_model_len or config.max_context)
    engine = build_engine(args, engine_config, log=log)
    if engine.max_model_len < config.max_context:
        log(f"note: the model's context is {engine.max_model_len} tokens: --max-context lowered to it")
        config = dataclasses.replace(config, max_context=engine.max_model_len)
    c = engine.model.config
    info = {"dir": str(engine.model.model_dir), "layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size, "engine_config": dataclasses.asdict(engine.config)}
    return EngineBackend(engine), engine.tokenizer, info, config


def _estimates(backend, prepared, selection: dict[str, list[int]], config: EvalConfig) -> dict[str, float]:
    """Per task, the simulator's up-front estimate of its questions (none on a GPU or through a server); the
    whole run's is printed when it is long. Each question is one request (loglikelihood: one new token; a
    multi-token answer's deeper trie nodes are not counted) and prompts the context cap drops are left out."""
    from tinyvllm.evaluation.backends import EngineBackend
    from tinyvllm.runtime_estimate import Work, announce, engine_estimate
    if not isinstance(backend, EngineBackend):
        return {}
    engine = backend.engine
    new_tokens = config.max_gen_tokens if config.mode == "generative" else 1
    estimates, questions = {}, 0
    for p in prepared:
        lengths = [n for n in (len(p.prompt_ids[i]) for i in selection[p.task])
                   if n + new_tokens <= config.max_context]
        work = Work(tuple(lengths), (new_tokens,) * len(lengths), engine.config.max_num_seqs,
                    engine.config.max_num_batched_tokens)
        estimates[p.task] = engine_estimate(engine, work)
        questions += len(lengths)
    if None in estimates.values():  # a GPU
        return {}
    announce(sum(estimates.values()), f"{questions} questions ({', '.join(estimates)}, {config.mode})")
    return estimates


def _command_line(args, config: EvalConfig) -> str:
    """The command that repeats this run (eval flags that differ from their defaults)."""
    parts = ["tinyvllm", "eval"]
    if args.model:
        parts += ["--model", str(args.model)]
    if args.base_url:
        parts += ["--base-url", args.base_url]
    default = EvalConfig()
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value == getattr(default, f.name) or value is None:
            continue
        if f.name == "add_special_tokens":
            parts.append("--no-special-tokens")
        else:
            parts += ["--" + f.name.replace("_", "-"), ",".join(value) if isinstance(value, tuple) else str(value)]
    return shlex.join(parts)
