"""Prefill steps eagerly vs replayed from their CUDA graph (tinyvllm/runner/prefill_graphs.py), on one engine.

    python scripts/time_prefill_graphs.py [--model-dir /tmp/llama-1b-random] [--tokens 128,1024,4096] [--precision fast]
    (--model-dir demo: the demo model, e.g. a smoke run in the simulator with --tokens 12,16)

1. Same logits: for each T, a prompt of T tokens (and a mixed step: three prompts of T/2, T/4 and T/8 tokens plus
   padding, in the same bucket) through ModelRunner.forward (eager) and PrefillGraphs.run (the graph) on the same
   KV slots; prints the max |logits difference| and whether each row's argmax agrees. Expected: 0 and equal (the
   graph runs the same kernels on the same rows; padding rows and empty tiles touch no real row).
2. Time: engine.step() of a one-token request with a T-token prompt, median of --repeats, eagerly and from the
   graph: wall time (host, to the token on the host) and GPU time by CUDA events around the step (for the eager
   step the events' span includes the gaps between launches: it is the wall time the GPU saw); and the graph's
   replay alone (the GPU work of embedding .. final_norm).
A line "Result: PASS" when every logits check passed (max diff 0, argmax equal); else "Result: FAIL" and why.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def prompt_batch(engine, lengths, rng, first_block: int):
    """A ForwardBatch of whole prompts of `lengths` tokens on blocks from first_block on, every prompt sampling."""
    from tinyvllm.runner.inputs import ForwardBatch
    bs = engine.block_manager.block_size
    ids, positions, query_seq, slots, rows, tables = [], [], [], [], [], []
    block = first_block
    for row, n in enumerate(lengths):
        table = list(range(block, block + -(-n // bs)))
        block += len(table)
        tables.append(table)
        p = np.arange(n)
        ids += rng.integers(1, min(engine.model.config.vocab_size, 20000), n).tolist()
        positions += p.tolist()
        query_seq += [row] * n
        slots += (np.array(table)[p // bs] * bs + p % bs).tolist()
        rows.append(len(ids) - 1)
    width = max(map(len, tables))
    block_tables = np.array([t + [-1] * (width - len(t)) for t in tables], np.int32)
    i32 = lambda a: np.array(a, np.int32)  # noqa: E731
    return ForwardBatch(ids, i32(positions), i32(query_seq), i32(slots), block_tables, i32(rows))


def check_logits(engine, lengths, rng) -> tuple[float, bool, int]:
    batch = prompt_batch(engine, lengths, rng, first_block=1)
    eager = engine.runner.forward(batch).copy_to_host()
    graphed = engine.runner.prefill_graphs.run(batch)[0].copy_to_host()
    diff = float(np.abs(graphed.astype(np.float64) - eager).max())
    same_argmax = bool((graphed.argmax(axis=1) == eager.argmax(axis=1)).all())
    return diff, same_argmax and np.isfinite(eager).all(), engine.runner.prefill_graphs.bucket_for(batch.num_tokens)


def timed_step(engine, tokens: int, rng) -> tuple[float, float]:
    """(wall seconds, GPU seconds by events) of the engine step that prefills a T-token prompt."""
    from kernels_numba.common import cuda
    from tinyvllm.engine.sampling_params import SamplingParams
    ids = rng.integers(1, min(engine.model.config.vocab_size, 20000), tokens).tolist()
    engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    cuda.synchronize()
    start_event, end_event = cuda.event(), cuda.event()
    start = time.perf_counter()
    start_event.record()
    engine.step()  # reads the token back: the step is over when it returns
    end_event.record()
    end_event.synchronize()
    wall = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return wall, start_event.elapsed_time(end_event) / 1e3


def replay_seconds(engine, tokens: int, repeats: int) -> float:
    """GPU time of the bucket's graph replay alone (events around it), median."""
    from kernels_numba.common import cuda
    step = engine.runner.prefill_graphs._capture(engine.runner.prefill_graphs.bucket_for(tokens))
    times = []
    for _ in range(repeats):
        start_event, end_event = cuda.event(), cuda.event()
        cuda.synchronize()
        start_event.record()
        step._replay()
        end_event.record()
        end_event.synchronize()
        times.append(start_event.elapsed_time(end_event) / 1e3)
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--tokens", default="128,1024,4096")
    parser.add_argument("--precision", default="fast")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    sizes = [int(t) for t in args.tokens.split(",")]
    model_dir = None if args.model_dir == "demo" else Path(args.model_dir)
    if model_dir is not None and not (model_dir / "config.json").is_file():
        from tinyvllm.bench import prepare_random_model
        prepare_random_model(model_dir)
    config = EngineConfig(precision=args.precision, max_model_len=max(sizes) + 8, max_num_batched_tokens=max(sizes),
                          max_num_seqs=8, num_blocks=2 * max(sizes) // 16 + 64, enable_prefix_caching=False,
                          prefill_graphs=True)
    engine = LLMEngine(model_dir, config, log=print)
    graphs = engine.runner.prefill_graphs
    rng = np.random.default_rng(0)
    failures = []
    print(f"\nlogits, graph vs eager (precision {engine.precision}):")
    for tokens in sizes:
        for lengths in ([tokens], [max(1, tokens // 2), max(1, tokens // 4), max(1, tokens // 8)]):
            diff, same, bucket = check_logits(engine, lengths, rng)
            print(f"  prompts {lengths} (bucket {bucket}): max |diff| {diff:.3g}, argmax equal {same}", flush=True)
            if diff != 0 or not same:
                failures.append(f"prompts {lengths}: max diff {diff:.3g}, argmax equal {same}")
    print(f"\n| T | eager step wall | eager step GPU span | graph step wall | graph step GPU span | graph replay GPU |")
    print("|---|---|---|---|---|---|")
    for tokens in sizes:
        results = {}
        for mode in ("eager", "graph"):
            engine.runner.prefill_graphs = graphs if mode == "graph" else None
            timed_step(engine, tokens, rng)  # compile / capture
            runs = sorted(timed_step(engine, tokens, rng) for _ in range(args.repeats))
            results[mode] = runs[len(runs) // 2]
        engine.runner.prefill_graphs = graphs
        replay = replay_seconds(engine, tokens, args.repeats)
        (ew, eg), (gw, gg) = results["eager"], results["graph"]
        print(f"| {tokens} | {ew * 1e3:.1f} ms | {eg * 1e3:.1f} ms | {gw * 1e3:.1f} ms | {gg * 1e3:.1f} ms | "
              f"{replay * 1e3:.1f} ms |", flush=True)
    print(f"\ncaptured buckets {graphs.captured_buckets}, activations {graphs.storage.bytes / 2**20:.0f} MiB")
    print("Result: PASS" if not failures else "Result: FAIL: " + "; ".join(failures))


if __name__ == "__main__":
    main()
