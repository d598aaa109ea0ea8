"""Where the nano-vllm throughput workload's time goes: prefill steps vs decode steps, by batch size.

    python scripts/profile_throughput.py [--model-dir /tmp/llama-1b-random] [--num-requests 256]
        [--max-num-seqs 256] [--max-num-batched-tokens 16384] [--precision auto]
Runs `tinyvllm bench`'s throughput workload (the same requests, seed and engine settings as
`tinyvllm bench --workloads throughput`) once after a warm-up, timing every engine step (wall time between
step calls; decode steps are pipelined, so a step's time is the period the engine spends on it). Prints the
total wall time split into steps with prefill chunks and decode-only steps, the decode steps by batch-size
band (count, mean ms, output tokens / s), and the output tok/s of the whole run.
"""
import argparse
import collections
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BANDS = (1, 32, 64, 128, 192, 256, 512)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", default="/tmp/llama-1b-random")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--precision", default="auto")
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--csv", help="write every step (index, start s, kind, tokens, sequences, ms) to this file")
    p.add_argument("--min-len", type=int, default=100, help="prompt and output lengths drawn from [min, max]")
    p.add_argument("--max-len", type=int, default=1024)
    args = p.parse_args()
    from kernels_numba.common import cuda
    from tinyvllm.bench.config import BenchConfig
    from tinyvllm.bench.engine_runs import EngineFactory, drive_engine, warm_up
    from tinyvllm.model.fixtures.random_model import prepare_random_model
    from tinyvllm.bench.workloads import Workloads
    from tinyvllm.engine.engine import EngineConfig
    from tinyvllm.runner.kernel_plan import resolve_precision
    from tinyvllm.model.loader import load_model

    def log(message):
        print(message, file=sys.stderr, flush=True)

    model_dir = Path(args.model_dir)
    model = load_model(model_dir if (model_dir / "config.json").is_file() else prepare_random_model(model_dir, log=log),
                       log=log)
    cfg = BenchConfig(num_requests=args.num_requests, min_len=args.min_len, max_len=args.max_len,
                      max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens)
    max_model_len = min(cfg.needed_model_len(), model.config.max_position_embeddings)
    precision = resolve_precision(args.precision, model.weights.embed_tokens.dtype)
    engine_config = EngineConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                 max_model_len=max_model_len, gpu_memory_fraction=cfg.gpu_memory_fraction,
                                 precision=precision)
    workloads = Workloads.make(cfg, model.config.vocab_size, max_model_len)
    engines = EngineFactory(model, engine_config, log)
    warm_up(engines, log)
    engine = engines.fresh()
    steps = []  # (kind, tokens, sequences, seconds, start)
    plain_step = engine.step
    gc_pauses = []

    def on_gc(phase, info, started=[0.0]):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(on_gc)
    t0 = time.perf_counter()

    def timed_step():
        start = time.perf_counter()
        outputs = plain_step()
        batch = engine.last_batch
        kind = "decode" if batch is not None and batch.is_decode_only else "prefill"
        tokens = batch.num_tokens if batch is not None else 0
        seqs = len(set(batch.query_seq.tolist())) if batch is not None else 0
        steps.append((kind, tokens, seqs, time.perf_counter() - start, start - t0))
        return outputs

    engine.step = timed_step
    record = drive_engine(engine, workloads.throughput, args.max_seconds, log, "throughput")
    cuda.synchronize()
    out_tok_s = record.output_tokens / record.elapsed
    print(f"throughput workload: {record.num_finished}/{record.num_requests} requests, {record.output_tokens} output "
          f"tokens in {record.elapsed:.2f} s = {out_tok_s:.1f} output tok/s ({precision})")
    by_kind = collections.defaultdict(lambda: [0, 0, 0.0])
    gc.callbacks.remove(on_gc)
    for kind, tokens, _, seconds, _ in steps:
        by_kind[kind][0] += 1
        by_kind[kind][1] += tokens
        by_kind[kind][2] += seconds
    for kind, (count, tokens, seconds) in sorted(by_kind.items()):
        print(f"  {kind:8s} steps {count:5d}  tokens {tokens:8d}  wall {seconds:7.2f} s "
              f"({100 * seconds / record.elapsed:4.1f} %)  mean {1e3 * seconds / max(count, 1):7.2f} ms")
    print("  decode steps by batch size:")
    for low, high in zip(BANDS, BANDS[1:]):
        band = [(t, s) for kind, t, _, s, _ in steps if kind == "decode" and low <= t < high]
        if band:
            seconds = sum(s for _, s in band)
            tokens = sum(t for t, _ in band)
            print(f"    batch {low:3d}-{high - 1:3d}: {len(band):5d} steps, mean {1e3 * seconds / len(band):6.2f} ms, "
                  f"wall {seconds:6.2f} s, {tokens / seconds:9.1f} tok/s")
    slowest = sorted(steps, key=lambda step: -step[3])[:8]
    print("  slowest steps: " + ", ".join(f"{kind} {tokens} tok at {at:.2f} s: {1e3 * s:.1f} ms"
                                          for kind, tokens, _, s, at in slowest))
    by_generation = collections.Counter()
    for generation, seconds in gc_pauses:
        by_generation[generation] += seconds
    print(f"  garbage collector: {len(gc_pauses)} collections, {sum(by_generation.values()):.2f} s in all "
          f"({', '.join(f'gen {g}: {s:.2f} s' for g, s in sorted(by_generation.items()))})")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("index,start_s,kind,tokens,sequences,ms\n")
            for i, (kind, tokens, seqs, seconds, at) in enumerate(steps):
                f.write(f"{i},{at:.4f},{kind},{tokens},{seqs},{1e3 * seconds:.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
