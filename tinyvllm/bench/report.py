"""The HBM roofline, tinyvllm/HF ratios, the table, JSON/CSV/PNG outputs, and merging two runs' reports."""
from __future__ import annotations

import csv
import json
import math
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from tinyvllm.errors import TinyVLLMError
from tinyvllm.bench.config import LATENCIES, WORKLOADS, BenchConfig
from tinyvllm.bench.engine_runs import synced_clock


def weight_bytes(config, bytes_per_weight: int = 2) -> int:
    """Bytes of weights one decode step reads: every tensor once (a tied lm_head is the embedding); 2 bytes a
    weight for bf16, 4 for an F32 checkpoint's float32."""
    from tinyvllm.model.weights import expected_tensor_shapes
    return sum(bytes_per_weight * math.prod(shape) for shape in expected_tensor_shapes(config).values())


def copy_bandwidth(nbytes: int, repeats: int = 5) -> dict:
    """Device-to-device copy bandwidth, counting bytes read + written (2 x size), best of `repeats`, timed
    with CUDA events (synchronised wall clock in the simulator, which has no event timing)."""
    from kernels_numba.common import SIMULATOR, cuda
    n = max(1, nbytes // 4)
    src = cuda.to_device(np.arange(n, dtype=np.uint32))   # not zeros: never time a copy of zeros
    dst = cuda.device_array(n, np.uint32)
    dst.copy_to_device(src)                                 # first touch
    times = []
    for _ in range(repeats):
        if SIMULATOR:
            start = synced_clock()
            dst.copy_to_device(src)
            times.append(synced_clock() - start)
        else:
            begin, end = cuda.event(), cuda.event()
            begin.record()
            dst.copy_to_device(src)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
    best = min(times)
    return {"bytes": 4 * n, "bytes_moved": 8 * n, "seconds": best, "gb_per_s": 8 * n / best / 1e9,
            "method": "numba DeviceNDArray.copy_to_device (cuMemcpyDtoD), best of %d" % repeats}


def add_roofline(rows: list[dict], weights: int, copy: dict) -> None:
    """Latency rows: weight bytes per decode step / TPOT, and that as a fraction of the copy bandwidth."""
    for row in rows:
        if row["workload"] == "latency" and row.get("tpot_ms"):
            achieved = weights / (row["tpot_ms"] / 1e3)
            row["decode_weight_gb_s"] = achieved / 1e9
            row["hbm_roofline_fraction"] = achieved / (copy["gb_per_s"] * 1e9)

HEADLINES = {   # workload -> (label, key); every row's table lines
    "latency": [("TTFT (ms)", "ttft_ms"), ("TPOT (ms)", "tpot_ms"), ("output tok/s", "output_tok_s"),
                ("decode weights GB/s", "decode_weight_gb_s"), ("HBM roofline fraction", "hbm_roofline_fraction")],
    "prefill": [("TTFT (ms)", "ttft_ms"), ("prefill tok/s", "prefill_tok_s")],
    "throughput": [("output tok/s", "output_tok_s"), ("requests done", "num_finished")],
    "serving": [(f"{name} {q} (ms)", f"{key}_{q}_ms") for name, key in (("TTFT", "ttft"), ("ITL", "itl"),
                                                                        ("E2E", "e2e"))
                for q in ("p50", "p95", "p99")] + [("output tok/s", "output_tok_s")],
    "kernels": [("ms (all layers)", "ms"), ("useful GB/s", "gb_s"), ("TFLOP/s", "tflop_s")],
}


CHART_METRICS = {"latency": ("output tok/s", "output_tok_s"), "prefill": ("TTFT (ms)", "ttft_ms"),
                 "throughput": ("output tok/s", "output_tok_s"), "serving": ("TTFT p50 (ms)", "ttft_p50_ms"),
                 "kernels": ("useful GB/s", "gb_s")}


def comparisons(rows: list[dict]) -> list[dict]:
    """tinyvllm / HF for each headline metric both measured on the same compare key (each tinyvllm row: with
    --batch-invariant both, the invariant run and the other)."""
    hf = {(r["workload"], r["compare_key"]): r for r in rows if r["system"] == "hf"}
    out = []
    for r in rows:
        other = hf.get((r["workload"], r["compare_key"])) if r["system"] == "tinyvllm" else None
        for label, key in HEADLINES[r["workload"]] if other else []:
            a, b = r.get(key), other.get(key)
            if a is not None and b is not None:
                out.append({"workload": r["workload"], "variant": r["variant"], "hf_variant": other["variant"],
                            "batch_invariant": r.get("batch_invariant"), "metric": key, "tinyvllm": a, "hf": b,
                            "ratio": a / b if b else None})
    return out


def on_off(invariant: bool | None) -> str:
    return "-" if invariant is None else "on" if invariant else "off"


def is_time_or_rate(key: str) -> bool:
    """The headline metrics an on/off ratio is reported for: times (ms) and token rates."""
    return key == "ms" or key.endswith(("_ms", "tok_s"))


def invariance_partners(rows: list[dict]) -> dict[int, dict]:
    """id(invariant tinyvllm row) -> the row of the same workload and variant run without batch invariance."""
    off = {(r["workload"], r["variant"]): r for r in rows
           if r["system"] == "tinyvllm" and r.get("batch_invariant") is False}
    return {id(r): off[(r["workload"], r["variant"])] for r in rows
            if r["system"] == "tinyvllm" and r.get("batch_invariant") and (r["workload"], r["variant"]) in off}


def invariance_ratios(rows: list[dict]) -> list[dict]:
    """Batch invariance on / off for each timed headline metric of a workload run both ways
    (--batch-invariant both): a time above 1, or a rate below 1, is what invariance costs."""
    partners, out = invariance_partners(rows), []
    for r in rows:
        other = partners.get(id(r))
        for label, key in HEADLINES[r["workload"]] if other else []:
            a, b = r.get(key), other.get(key)
            if is_time_or_rate(key) and a is not None and b is not None:
                out.append({"workload": r["workload"], "variant": r["variant"], "metric": key, "on": a, "off": b,
                            "ratio": a / b if b else None})
    return out


def format_report(report: dict) -> str:
    rows = report["results"]
    ratios = {(c["workload"], c["variant"], c.get("batch_invariant"), c["metric"]): c for c in report["comparisons"]}
    hf_on = any(r["system"] == "hf" for r in rows)
    partners = invariance_partners(rows)
    both = bool(partners)   # the invariance column, and on/off ratios on each "off" line
    on_off_ratios = {(c["workload"], c["variant"], c["metric"]): c["ratio"] for c in invariance_ratios(rows)}
    m, copy = report["model"], report.get("copy_bandwidth")
    lines = [f"tinyvllm bench: {m['dir']} ({m['layers']} layers, hidden {m['hidden_size']}, "
             f"{m['weight_bytes'] / 1e9:.4g} GB of weights) on {report['environment']['device']}"]
    if copy:
        lines.append(f"copy bandwidth {copy['gb_per_s']:.1f} GB/s -> batch-1 decode roofline "
                     f"{copy['gb_per_s'] * 1e9 / m['weight_bytes']:.1f} tok/s")
    modes = {r["batch_invariant"] for r in rows if r["system"] == "tinyvllm" and "batch_invariant" in r}
    if len(modes) == 1:
        lines.append(f"batch invariance {on_off(modes.pop())}")
    header = f"{'workload':<11}{'variant':<22}{'metric':<24}"
    header += f"{'invariant':>10}{'tinyvllm':>12}{'on/off':>9}" if both else f"{'tinyvllm':>12}"
    header += f"{'HF':>12}{'tinyvllm/HF':>13}" if hf_on else ""
    if any(r["system"] != "http" for r in rows):
        lines += [header, "-" * len(header)]
    cell = lambda v, width=12: f"{'-':>{width}}" if v is None else (f"{v:>{width}.4g}" if isinstance(v, float)
                                                                     else f"{v:>{width}}")
    hf_only = hf_on and not any(r["system"] == "tinyvllm" for r in rows)  # --hf-only: its rows in the HF column
    paired_off = {id(r) for r in partners.values()}   # printed beside their invariant run
    for r in rows:
        if r["system"] == "http" or (r["system"] != "tinyvllm" and not hf_only) or id(r) in paired_off:
            continue
        variant = r["variant"] + (" *" if r.get("stopped_early") else "")
        if hf_only:
            lines += [f"{r['workload']:<11}{variant:<22}{label:<24}{cell(None)}{cell(r.get(key))}{'-':>13}"
                      for label, key in HEADLINES[r["workload"]]]
            continue
        for label, key in HEADLINES[r["workload"]]:
            for run in [r, partners[id(r)]] if id(r) in partners else [r]:
                run_variant = run["variant"] + (" *" if run.get("stopped_early") else "")
                line = f"{r['workload']:<11}{run_variant:<22}{label:<24}"
                if both:
                    ratio = on_off_ratios.get((r["workload"], r["variant"], key)) if run is not r else None
                    line += f"{on_off(run.get('batch_invariant')):>10}{cell(run.get(key))}{cell(ratio, 9)}"
                else:
                    line += cell(run.get(key))
                if hf_on:
                    c = ratios.get((r["workload"], r["variant"], run.get("batch_invariant"), key))
                    line += cell(c and c["hf"]) + (f"{c['ratio']:>13.3g}" if c and c["ratio"] else f"{'-':>13}")
                lines.append(line)
    for r in rows:
        if r["system"] == "http":
            lines += format_http_result(r)
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def format_http_result(r: dict) -> list[str]:
    """One --base-url run, laid out as `vllm bench serve` prints its result."""
    def line(label, value, digits=2):
        text = "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)
        return f"{label + ':':<40}{text:<10}"
    title = f" {r['workload']} over HTTP, {r['variant']} "
    out = ["", f"{title:=^50}", line("Server", r["base_url"]), line("Successful requests", r["num_finished"]),
           line("Failed requests", r["num_errored"])]
    if r["num_not_sent_or_cut"]:
        out.append(line("Not sent or cut at --max-seconds", r["num_not_sent_or_cut"]))
    out += [line("Maximum request concurrency", r["max_concurrency"]),
            line("Benchmark duration (s)", r["elapsed_s"]), line("Total input tokens", r["prompt_tokens"]),
            line("Total generated tokens", r["output_tokens"]),
            line("Request throughput (req/s)", r["request_throughput"]),
            line("Output token throughput (tok/s)", r["output_tok_s"]),
            line("Total Token throughput (tok/s)", r["total_token_throughput"]),
            line("Peak concurrent requests", r["max_concurrent_requests"])]
    for key, short, long in LATENCIES:
        out.append(f"{long:-^50}")
        out += [line(f"{name.capitalize()} {short} (ms)", r[f"{stat}_{key}_ms"])
                for name, stat in (("mean", "mean"), ("median", "median"), ("P99", "p99"))]
    if "greedy_check" in r:
        g = r["greedy_check"]
        out += [f"{'Greedy outputs vs offline':-^50}", line("Identical to LLM.generate", f"{g['identical']}/{g['compared']}")]
    if r["token_count_mismatches"]:
        out.append(line("Outputs not of max_tokens tokens", r["token_count_mismatches"]))
    out += [f"error: {count} x {message}" for message, count in r["error_samples"].items()]
    out.append("=" * 50)
    return out


def report_notes(rows: list[dict], cfg: BenchConfig) -> list[str]:
    notes = []
    for r in rows:
        if r.get("stopped_early"):
            notes.append(f"* {r['system']} {r['workload']} {r['variant']}: stopped at --max-seconds "
                         f"{cfg.max_seconds:g}: {r['num_finished']}/{r['num_requests']} requests done, "
                         f"{r.get('output_tokens', '-')} tokens")
    if any(r["system"] == "hf" for r in rows):
        notes.append(f"HF throughput: static batches of {cfg.hf_batch_size} in request order, left padded, each "
                     "batch runs to its longest request; only requested tokens count")
        if "serving" in cfg.workloads:
            notes.append("HF serving: not run (generate has no request-arrival API)")
    return notes


def write_outputs(report: dict, out_dir: Path, plot: bool, log) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / "bench.json", out_dir / "bench.csv"
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    flat = [{k: (";".join(f"{x:.6g}" for x in v) if isinstance(v, list) else v)
             for k, v in r.items() if not isinstance(v, dict)} for r in report["results"]]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(flat)
    written = [json_path, csv_path]
    if plot:
        png = draw_chart(report, out_dir / "bench.png", log)
        written += [png] if png else []
    return written


def draw_chart(report: dict, path: Path, log) -> Path | None:
    """One bar panel per workload (its CHART_METRICS entry, per variant and system); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in report["results"])]
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        label, key = CHART_METRICS[workload]
        rows = [r for r in report["results"] if r["workload"] == workload and r.get(key) is not None]
        ax.bar(range(len(rows)), [r[key] for r in rows],
               color=["tab:blue" if r["system"] == "tinyvllm" else "tab:orange" for r in rows])
        ax.set_xticks(range(len(rows)), [f"{r['variant']}\n{r['system']}"
                                         + ("" if r.get("batch_invariant") is not False else " (not inv.)")
                                         for r in rows], fontsize=7)
        ax.set_title(f"{workload}: {label}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    log(f"chart: {path}")
    return path


def environment(hf_version: str | None) -> dict:
    import numba
    from kernels_numba.common import SIMULATOR, cuda
    if SIMULATOR:
        device = "numba CUDA simulator"
    else:
        name = cuda.get_current_device().name
        device = name.decode() if isinstance(name, bytes) else str(name)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"device": device, "simulator": SIMULATOR, "python": platform.python_version(),
            "numba": numba.__version__, "numpy": np.__version__, "hf": hf_version, "git_commit": commit}


def merge_reports(paths: list[Path], out_dir: Path, plot: bool = True, log=None) -> int:
    """One report from several runs' bench.json (e.g. tinyvllm on one GPU and --hf-only on an identical
    second GPU of the same host, run at the same time): results joined, ratios and notes recomputed."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        reports = [json.loads(p.read_text()) for p in paths]
    except (OSError, ValueError) as e:
        raise TinyVLLMError(f"cannot read a report to merge: {e}") from e
    rows = [r for report in reports for r in report["results"]]
    merged = dict(reports[0], results=rows, comparisons=comparisons(rows),
                  invariance_ratios=invariance_ratios(rows),
                  notes=list(dict.fromkeys(n for report in reports for n in report["notes"])),
                  merged_from=[{"path": str(p), "command": r["command"], "environment": r["environment"],
                                "copy_bandwidth": r.get("copy_bandwidth")} for p, r in zip(paths, reports)])
    merged["environment"] = dict(reports[0]["environment"],
                                 hf=next((r["environment"]["hf"] for r in reports if r["environment"]["hf"]), None))
    written = write_outputs(merged, out_dir, plot, log)
    print(format_report(merged))
    log("wrote " + ", ".join(map(str, written)))
    return 0
