"""`tinyvllm bench`: one run of the selected workloads (and HF beside them), or a merge of two runs."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from tinyvllm.bench.config import BenchConfig, KERNEL_STEPS, SIMULATOR_COPY_BYTES, command_line, config_from_args
from tinyvllm.bench.workloads import Workloads
from tinyvllm.bench.engine_runs import EngineFactory, TINYVLLM_WORKLOADS, warm_up
from tinyvllm.bench.hf_baseline import HFBaseline, HF_WORKLOADS, check_hf_available
from tinyvllm.bench.report import (add_roofline, comparisons, copy_bandwidth, environment, format_report,
                                   invariance_ratios, merge_reports, on_off, report_notes, weight_bytes, write_outputs)
from tinyvllm.model.fixtures.random_model import prepare_random_model


def run(args) -> int:
    """The `tinyvllm bench` subcommand: exit status 0, or 1 when a request ended with an error."""
    if getattr(args, "replay", None):  # tinyvllm serve --record's session (serving/replay.py)
        from tinyvllm.serving.replay import run_bench_replay
        return run_bench_replay(args)
    if args.merge:
        return merge_reports([Path(p) for p in args.merge], Path(args.out), args.plot)
    return run_bench(config_from_args(args))


def run_bench(cfg: BenchConfig, log=None) -> int:
    t0 = time.perf_counter()
    log = log or (lambda message: print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr,
                                        flush=True))
    if cfg.base_url:
        from tinyvllm.bench.http_runs import run_http_bench
        return run_http_bench(cfg, log)
    if cfg.compare == "hf":
        check_hf_available(cfg.hf_device)
    from kernels_numba.common import SIMULATOR
    from tinyvllm.engine.engine import EngineConfig
    from tinyvllm.runner.kernel_plan import resolve_precision
    from tinyvllm.model.loader import default_model_dir, load_model
    model_dir = Path(cfg.model) if cfg.model else (prepare_random_model(Path(cfg.random_1b), log=log)
                                                   if cfg.random_1b else default_model_dir())
    model = load_model(model_dir, log=log)
    c = model.config
    max_model_len = min(cfg.max_model_len or cfg.needed_model_len(), c.max_position_embeddings)
    engine_config = EngineConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
        num_blocks=cfg.num_blocks, gpu_memory_fraction=cfg.gpu_memory_fraction, max_model_len=max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching, kv_cache_dtype=cfg.kv_cache_dtype,
        precision=resolve_precision(cfg.precision, model.weights.embed_tokens.dtype),  # the report shows which ran
        batch_invariant=cfg.invariance_modes[0])
    workloads = Workloads.make(cfg, c.vocab_size, max_model_len)
    if SIMULATOR and not cfg.hf_only:
        _announce(c, engine_config, workloads, cfg)
    engines = EngineFactory(model, engine_config, log)
    if cfg.warmup and not cfg.hf_only:
        for invariant in cfg.invariance_modes:  # each plan compiles its own kernels
            engines.set_batch_invariant(invariant)
            warm_up(engines, log)

    copy_bytes = SIMULATOR_COPY_BYTES if SIMULATOR else cfg.copy_mib << 20
    copy = copy_bandwidth(copy_bytes)
    log(f"copy bandwidth: {copy['gb_per_s']:.1f} GB/s ({copy['bytes'] / 2**20:.0f} MiB device to device)")
    rows: list[dict] = []
    for name in cfg.workloads if not cfg.hf_only else ():
        for invariant in cfg.invariance_modes:  # on, then off, back to back on the same requests
            engines.set_batch_invariant(invariant)
            log(f"tinyvllm {name}" + (f", batch invariance {on_off(invariant)}" if len(cfg.invariance_modes) > 1
                                      else ""))
            runs = TINYVLLM_WORKLOADS[name](engines, workloads, cfg, log)
            rows += [dict(r, batch_invariant=engines.ran_batch_invariant()) for r in runs]
    engines.release()
    hf_version = None
    if cfg.compare == "hf":
        hf = HFBaseline(model_dir, cfg.hf_device, log)
        hf_version = hf.version
        if cfg.warmup:
            hf.warm_up(log)
        for name in cfg.workloads:
            if name in HF_WORKLOADS:
                log(f"HF {name}")
                rows += HF_WORKLOADS[name](hf, workloads, cfg, log)
        del hf
    wbytes = weight_bytes(c, model.weights.embed_tokens.dtype.itemsize)  # bf16 bits or float32
    add_roofline(rows, wbytes, copy)
    report = {
        "format": "tinyvllm-bench/1",
        "command": command_line(cfg),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment(hf_version),
        "model": {"dir": str(model_dir), "layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
                  "vocab_size": c.vocab_size, "weight_bytes": wbytes},
        "config": dataclasses.asdict(cfg),
        "engine_config": dataclasses.asdict(engines.config),
        "copy_bandwidth": copy,
        "results": rows,
        "comparisons": comparisons(rows),
        "invariance_ratios": invariance_ratios(rows),
        "notes": report_notes(rows, cfg),
        "wall_seconds": time.perf_counter() - t0,
    }
    written = write_outputs(report, Path(cfg.out), cfg.plot, log)
    print(format_report(report))
    log("wrote " + ", ".join(map(str, written)))
    return 1 if any(r.get("num_errored") for r in rows) else 0


def _announce(model_config, engine_config, workloads: Workloads, cfg: BenchConfig) -> None:
    """The simulator's notice for the selected workloads, each run at most --max-seconds (the prefill lengths share
    one run; arrival times and the warm-up are not counted)."""
    from tinyvllm.cli.formatting import count
    from tinyvllm.runtime_estimate import Work, announce, estimate_seconds

    def seconds(requests, new_tokens: int | None = None) -> float:
        work = Work(tuple(len(r.prompt_ids) for r in requests),
                    tuple(new_tokens or r.max_tokens for r in requests),
                    engine_config.max_num_seqs, engine_config.max_num_batched_tokens)
        return min(estimate_seconds(model_config, work), cfg.max_seconds)
    runs = {"latency": [seconds(workloads.latency)],
            "prefill": [min(sum(seconds([r]) for rs in workloads.prefill.values() for r in rs), cfg.max_seconds)],
            "throughput": [seconds(workloads.throughput)] * len(cfg.batching),
            "serving": [seconds(workloads.serving)],
            "kernels": [seconds(workloads.latency[:1], KERNEL_STEPS)]}
    selected = [t for name in cfg.workloads for t in runs[name]] * len(cfg.invariance_modes)
    announce(sum(selected), f"{count(len(selected), 'bench run')} of at most --max-seconds {cfg.max_seconds:g} each")
