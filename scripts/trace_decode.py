"""Every kernel of a decode step on the GPU's own clock: their durations and the gaps between them.

    python scripts/trace_decode.py [--model-dir /tmp/llama-1b-random] [--batches 1,256] [--steps 10]
For each batch size (prompts of --prompt-len tokens, greedy, the fast precision, CUDA graphs, pipelined decode as
`tinyvllm bench` runs it) the engine steps under torch's profiler (CUPTI records each kernel a graph replays, its
start and end on the GPU); torch only observes. Per step: the span from one step's first kernel to the next
step's, the kernels' busy time and the idle rest (launch gaps, bubbles between graphs); per kernel name: launches a
step, mean and total time. GPU only; torch comes with the optional `goldens` extra.
"""
import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


STEP_MARKER = "embedding.embedding_kernel"  # a decode step's first launch


def kernel_events(trace_path: Path) -> list[tuple[float, float, str]]:
    """(start us, end us, short_name) of every GPU kernel in a chrome trace, by start."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    kernels = [(e["ts"], e["ts"] + e["dur"], short_name(e["name"])) for e in events
               if e.get("cat") == "kernel" and "dur" in e]
    return sorted(kernels)


def short_name(name: str) -> str:
    """A numba kernel's name as module.function: from CUPTI's demangled form (a::b::<locals>::kernel[abi:..](..))
    or the Itanium-mangled one (_ZN <len><part>... E); closures' <locals> and the generic parts dropped."""
    if name.startswith("_ZN"):
        parts, i = [], 3
        while i < len(name) and name[i].isdigit():
            digits = re.match(r"\d+", name[i:]).group()
            i += len(digits)
            parts.append(name[i:i + int(digits)])
            i += int(digits)
    else:
        parts = re.split(r"[\[(]", name, maxsplit=1)[0].split("::")
    parts = [p for p in parts if p not in ("cudapy", "kernels_numba", "attention", "kernel")
             and "locals" not in p]
    return ".".join(parts[-2:])[:60] or name[:60]


def report(kernels) -> None:
    """Per step (from one STEP_MARKER launch to the next): span, busy and idle time; each launch's mean in step
    order; per kernel name, launches and time a step."""
    starts = [i for i, (_, _, n) in enumerate(kernels) if n == STEP_MARKER]
    if len(starts) < 2:
        print(f"  found {len(starts)} step markers ({STEP_MARKER!r}); raw kernel count {len(kernels)}")
        starts = [0, len(kernels)]
    first, last = starts[0], starts[-1]
    window = kernels[first:last]
    n_steps = len(starts) - 1
    span = kernels[last][0] - kernels[first][0] if last < len(kernels) else window[-1][1] - window[0][0]
    busy = sum(e - s for s, e, _ in window)
    gaps = [max(0.0, window[i + 1][0] - window[i][1]) for i in range(len(window) - 1)]
    gaps.sort()
    median_gap = gaps[len(gaps) // 2] if gaps else 0.0
    print(f"  {n_steps} steps: {span / n_steps:8.1f} us a step, kernels busy {busy / n_steps:8.1f} us, "
          f"idle {(span - busy) / n_steps:7.1f} us ({len(window) / n_steps:.0f} kernels a step, median gap "
          f"{median_gap:.2f} us, gaps over 5 us: {sum(g > 5 for g in gaps) / n_steps:.1f} a step)")
    by_name = collections.defaultdict(list)
    for s, e, n in window:
        by_name[n].append(e - s)
    sequences = [kernels[a:b] for a, b in zip(starts, starts[1:])]
    if len({len(seq) for seq in sequences}) == 1:  # the same launches every step: each one's mean, in order
        count = len(sequences[0])
        shown = list(range(min(count, 12))) + list(range(max(12, count - 4), count))
        print("  launches in step order (mean us): " + ", ".join(
            f"{i}:{sequences[0][i][2].split('.')[-1][:18]} "
            f"{sum(seq[i][1] - seq[i][0] for seq in sequences) / len(sequences):.1f}" for i in shown))
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    print(f"  {'kernel':<44} {'a step':>6} {'mean us':>8} {'us a step':>10} {'share':>6}")
    for name, durations in rows:
        total = sum(durations) / n_steps
        print(f"  {name:<44} {len(durations) / n_steps:6.1f} {sum(durations) / len(durations):8.2f} "
              f"{total:10.1f} {total / (span / n_steps):6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--batches", default="1,256")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=4352)
    parser.add_argument("--out", help="folder for the chrome traces")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from kernels_numba.common import cuda
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams
    batches = [int(b) for b in args.batches.split(",")]
    engine = LLMEngine(args.model_dir, EngineConfig(max_num_seqs=max(batches), max_num_batched_tokens=16384,
                                                    max_model_len=args.max_model_len, precision="fast",
                                                    batch_invariant=False))
    torch.cuda.init()
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    vocab = engine.model.config.vocab_size
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    for batch in batches:
        ids = [engine.add_request([(1000 + i + j) % vocab for j in range(args.prompt_len)], params)
               for i in range(batch)]
        while engine.scheduler.num_waiting or any(not engine.request(i).seq.output_token_ids for i in ids):
            engine.step()
        for _ in range(5):  # warm-up: captures, compiles, the pipeline filled
            engine.step()
        cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps + 2):
                engine.step()
            cuda.synchronize()
        trace = out / f"decode-batch{batch}.json"
        prof.export_chrome_trace(str(trace))
        kernels = kernel_events(trace)
        print(f"batch {batch} ({args.prompt_len}-token prompts), trace {trace}:")
        report(kernels)
        for i in ids:
            engine.abort_request(i)
        engine.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
