"""`tinyvllm bench --base-url URL`: the serving and throughput workloads sent to a running OpenAI-compatible
server over HTTP (http_client.py), reported with the fields `vllm bench serve` reports, and optionally each
greedy output checked against offline LLM.generate on the same prompts (--check-greedy).

    serving     the serving workload's requests at their Poisson arrival times (--request-rate; inf: at once)
    throughput  the throughput workload's requests all at once: the same 256 requests the offline
                throughput run sends, so the two output tok/s can be set side by side

The prompts are the offline workloads' random token ids (--model / --random-1b give the vocabulary and,
for --check-greedy, the weights: they must be the server's); --prompt-as text sends them decoded instead.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

from tinyvllm.engine.metrics import Stats
from tinyvllm.bench.config import BenchConfig, PROGRESS_EVERY_S, command_line
from tinyvllm.bench.http_client import COMPLETIONS_PATH, HttpRequest, HttpRun, probe_server, run_requests
from tinyvllm.bench.workloads import BenchRequest, Workloads, random_prompt, workload_rng

WARMUP_PROMPT_LEN = 8

GREEDY_MISMATCHES_KEPT = 5


def http_requests(requests: list[BenchRequest], prompt_as: str, tokenizer) -> list[HttpRequest]:
    prompt = (lambda ids: ids) if prompt_as == "ids" else tokenizer.decode
    return [HttpRequest(prompt(r.prompt_ids), r.max_tokens, r.arrival) for r in requests]


def warm_up_server(cfg: BenchConfig, server: dict, vocab_size: int, log) -> None:
    """--max-num-seqs requests at once asking for 1, 2, ... tokens: the server's running batch then shrinks by
    one each step, so every decode batch size compiles its kernels (numba compiles at first launch) before
    the timed runs. Random prompts shorter than a KV block: nothing the workloads could hit in the prefix cache."""
    rng = workload_rng(cfg.seed + 1, "serving")
    room = (server.get("max_model_len") or math.inf) - WARMUP_PROMPT_LEN
    requests = [HttpRequest(random_prompt(rng, WARMUP_PROMPT_LEN, vocab_size), int(min(n + 1, room)))
                for n in range(cfg.max_num_seqs)]
    start = time.perf_counter()
    run = run_requests(cfg.base_url, requests, server.get("model"), max_seconds=cfg.max_seconds)
    failed = sum(r is None or not r.ok for r in run.results)
    log(f"warm-up: {len(requests)} requests at once, 1..{len(requests)} tokens each, "
        f"{time.perf_counter() - start:.1f} s" + (f", {failed} failed" if failed else ""))


def http_row(workload: str, cfg: BenchConfig, server: dict, requests: list[BenchRequest], run: HttpRun) -> dict:
    """One result row: tinyvllm's common fields plus vLLM's (mean / median / p99 of each latency, in ms)."""
    ok = [(q, r) for q, r in zip(requests, run.results) if r is not None and r.ok]
    failed = [r for r in run.results if r is not None and not r.ok]
    prompt_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else len(q.prompt_ids) for q, r in ok)
    output_tokens = sum(r.output_tokens for _, r in ok)
    rate = cfg.request_rate if workload == "serving" else math.inf
    per = lambda tokens: tokens / run.duration if run.duration > 0 else 0.0
    row = {
        "workload": workload, "system": "http", "variant": "at once" if math.isinf(rate) else f"{rate:g} req/s",
        "compare_key": workload, "base_url": cfg.base_url, "endpoint": COMPLETIONS_PATH,
        "served_model": server.get("model"), "prompt_as": cfg.prompt_as,
        "num_requests": len(requests), "num_finished": len(ok), "num_errored": len(failed),
        "num_not_sent_or_cut": sum(r is None for r in run.results),
        "completed": len(ok) == len(requests), "stopped_early": run.stopped_early,
        "request_rate": rate, "max_concurrency": cfg.max_concurrency, "max_concurrent_requests": run.peak_concurrency,
        "prompt_tokens": prompt_tokens, "requested_output_tokens": sum(q.max_tokens for q in requests),
        "output_tokens": output_tokens, "elapsed_s": run.duration,
        "request_throughput": per(len(ok)), "output_tok_s": per(output_tokens),
        "total_token_throughput": per(prompt_tokens + output_tokens),
        # ignore_eos: a successful request that did not produce exactly max_tokens is a server bug
        "token_count_mismatches": sum(r.output_tokens != q.max_tokens for q, r in ok),
    }
    samples = {"ttft": [r.ttft for _, r in ok], "tpot": [r.tpot for _, r in ok if r.tpot is not None],
               "itl": [gap for _, r in ok for gap in r.itls], "e2el": [r.e2e for _, r in ok]}
    for key, values in samples.items():
        s = Stats.of(values)
        for name, value in (("mean", s.mean), ("median", s.p50), ("p99", s.p99)):
            row[f"{name}_{key}_ms"] = None if value is None else 1e3 * value
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error] = errors.get(r.error, 0) + 1
    row["error_samples"] = dict(sorted(errors.items(), key=lambda kv: -kv[1])[:10])
    return row


def check_greedy(model_dir: Path, cfg: BenchConfig, runs: list[tuple[list[BenchRequest], HttpRun]], log) -> list[dict]:
    """Offline LLM.generate (greedy, ignore_eos) on the same prompt ids, every run's in one call: served token
    ids (or, from a server that does not send them, text) must be identical. Only successful requests count.
    One dict per run."""
    from tinyvllm.llm import LLM
    from tinyvllm.engine.sampling_params import SamplingParams
    pairs = [[(i, requests[i], r) for i, r in enumerate(run.results) if r is not None and r.ok] for requests, run in runs]
    every = [q for run_pairs in pairs for _, q, _ in run_pairs]
    log(f"check-greedy: offline LLM.generate on {len(every)} prompts")
    if not every:
        return [compare_greedy([], []) for _ in pairs]
    llm = LLM(model_dir, log=lambda message: None, max_num_seqs=max(cfg.max_num_seqs, len(every)),
              max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
              num_blocks=cfg.num_blocks, gpu_memory_fraction=cfg.gpu_memory_fraction,
              max_model_len=max((len(q.prompt_ids) + q.max_tokens for q in every), default=None))
    outs = iter(llm.generate([q.prompt_ids for q in every],
                             [SamplingParams(temperature=0.0, max_tokens=q.max_tokens, ignore_eos=True) for q in every]))
    del llm
    return [compare_greedy(run_pairs, [next(outs) for _ in run_pairs]) for run_pairs in pairs]


def compare_greedy(pairs, offline_outputs) -> dict:
    """pairs: (request index, request, served HttpResult); offline_outputs: RequestOutputs in the same order."""
    mismatches, by_ids = [], 0
    for (i, _, served), offline in zip(pairs, offline_outputs):
        if served.token_ids is not None:
            by_ids += 1
            same, a, b = served.token_ids == offline.token_ids, served.token_ids, offline.token_ids
        else:
            same, a, b = served.text == offline.text, served.text, offline.text
        if not same:
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatches.append({"request": i, "first_difference_at": first, "served": a[first:first + 8],
                               "offline": b[first:first + 8]})
    return {"compared": len(pairs), "compared_by_token_ids": by_ids, "identical": len(pairs) - len(mismatches),
            "mismatches": mismatches[:GREEDY_MISMATCHES_KEPT], "num_mismatches": len(mismatches)}


def run_http_bench(cfg: BenchConfig, log) -> int:
    """The `--base-url` run: exit status 0, or 1 when a request failed or a greedy output differed."""
    from tinyvllm.model.config import ModelConfig
    from tinyvllm.model.loader import default_model_dir
    from tinyvllm.model.tokenizer import Tokenizer
    from tinyvllm.model.fixtures.random_model import prepare_random_model
    from tinyvllm.bench.report import format_report, weight_bytes, write_outputs
    t0 = time.perf_counter()
    model_dir = Path(cfg.model) if cfg.model else (prepare_random_model(Path(cfg.random_1b), log=log)
                                                   if cfg.random_1b else default_model_dir())
    c = ModelConfig.from_model_dir(model_dir)
    tokenizer = Tokenizer.from_model_dir(model_dir) if cfg.prompt_as == "text" else None
    server = probe_server(cfg.base_url)
    if "error" in server:
        log(f"warning: {server['error']} (the requests are sent anyway)")
    else:
        log(f"server {cfg.base_url}: model {server['model']!r}, max_model_len {server['max_model_len']}")
    max_model_len = min(cfg.max_model_len or cfg.needed_model_len(), server.get("max_model_len") or math.inf,
                        c.max_position_embeddings)
    workloads = Workloads.make(cfg, c.vocab_size, max_model_len)
    if cfg.warmup and "error" not in server:
        warm_up_server(cfg, server, c.vocab_size, log)
    rows, runs = [], []
    for name in cfg.workloads:
        requests = getattr(workloads, name)
        log(f"http {name}: {len(requests)} requests to {cfg.base_url}{COMPLETIONS_PATH}"
            + (f" at {cfg.request_rate:g} req/s" if name == "serving" else ", all at once"))
        next_progress = [time.perf_counter() + PROGRESS_EVERY_S]

        def progress(done, name=name, total=len(requests)):
            if time.perf_counter() >= next_progress[0]:
                next_progress[0] += PROGRESS_EVERY_S
                log(f"  http {name}: {done}/{total} requests done")

        run = run_requests(cfg.base_url, http_requests(requests, cfg.prompt_as, tokenizer), server.get("model"),
                           cfg.max_concurrency, cfg.max_seconds, return_token_ids=cfg.check_greedy, progress=progress)
        rows.append(http_row(name, cfg, server, requests, run))
        runs.append((requests, run))
        log(f"  http {name}: {rows[-1]['num_finished']} ok, {rows[-1]['num_errored']} failed, "
            f"{rows[-1]['output_tok_s']:.1f} output tok/s")
    if cfg.check_greedy:
        for row, check in zip(rows, check_greedy(model_dir, cfg, runs, log)):
            row["greedy_check"], row["greedy_mismatches"] = check, check["num_mismatches"]
            log(f"  check-greedy, http {row['workload']}: {check['identical']}/{check['compared']} identical "
                "to offline")
    report = {
        "format": "tinyvllm-bench/1",
        "command": command_line(cfg),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": {"device": f"HTTP server at {cfg.base_url}", "client": "tinyvllm bench (httpx, asyncio)",
                        "python": sys.version.split()[0], "server": server, "hf": None},
        "model": {"dir": str(model_dir), "layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
                  "vocab_size": c.vocab_size, "weight_bytes": weight_bytes(c)},
        "config": dataclasses.asdict(cfg),
        "results": rows,
        "comparisons": [],
        "notes": [f"* http {r['workload']}: stopped at --max-seconds {cfg.max_seconds:g}: {r['num_finished']}/"
                  f"{r['num_requests']} requests done" for r in rows if r["stopped_early"]],
        "wall_seconds": time.perf_counter() - t0,
    }
    written = write_outputs(report, Path(cfg.out), cfg.plot, log)
    print(format_report(report))
    log("wrote " + ", ".join(map(str, written)))
    bad = any(r["num_errored"] or not r["completed"] or r["token_count_mismatches"] or r.get("greedy_mismatches")
              for r in rows)
    return 1 if bad else 0
