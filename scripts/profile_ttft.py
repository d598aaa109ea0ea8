"""Where a prompt's time to first token goes, host and GPU, as the bench measures it.

    python scripts/profile_ttft.py [--model-dir /tmp/llama-1b-random] [--tokens 1024,4096] [--repeats 5]

The engine is configured as `tinyvllm bench` configures it (256 sequences, 8,192 tokens a step, prefix caching on, the KV pool sized
from free memory, max model len 4,097, the fast precision on a GPU); one request of each length first captures that
length's prefill CUDA graph and compiles its kernels (the bench captures every graph up front instead). For each
prompt length: the median TTFT of `repeats` one-token requests of fresh random tokens (the engine's own metrics,
arrival to first token, as the bench reports it), and the same request's phases timed from outside: add_request,
then each engine.step() until the token is out. Then one request of the first length under cProfile: the functions
with the most own time and the most cumulative time, so host work shows apart from the wait for the GPU (the
synchronize that fetches the sampled token).
"""
import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_request(engine, ids, params) -> dict:
    start = time.perf_counter()
    request_id = engine.add_request(ids, params)
    added = time.perf_counter()
    steps = []
    done = False
    while not done:
        t0 = time.perf_counter()
        outputs = engine.step()
        steps.append(time.perf_counter() - t0)
        done = any(o.request_id == request_id and o.finished for o in outputs)
    while engine.has_unfinished_requests():
        engine.step()
    metrics = engine.metrics.request_metrics(request_id)
    return {"add_s": added - start, "steps_s": steps, "total_s": time.perf_counter() - start, "metrics": metrics}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--tokens", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-model-len", type=int, default=4097)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.runner.kernel_plan import resolve_precision
    from tinyvllm.model.loader import load_model
    from tinyvllm.engine.sampling_params import SamplingParams
    model = load_model(Path(args.model_dir), log=print)
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192,  # the bench's defaults: one prefill step
                          max_model_len=min(args.max_model_len, model.config.max_position_embeddings),
                          precision=resolve_precision("auto", model.weights.embed_tokens.dtype))
    engine = LLMEngine(model, config, log=print)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0)
    lengths = [int(t) for t in args.tokens.split(",")]
    vocab = min(model.config.vocab_size, 20000)

    def fresh_ids(length):
        return rng.integers(1, vocab, length).tolist()

    for length in lengths:  # warm: first use of each size
        one_request(engine, fresh_ids(length), params)
    print("\n| prompt | TTFT (engine metrics, median) | add_request | steps to the token | first step | total |")
    print("|---:|---:|---:|---:|---:|---:|")
    for length in lengths:
        runs = []
        for _ in range(args.repeats):
            runs.append(one_request(engine, fresh_ids(length), params))
        ttfts = [r["metrics"].ttft for r in runs if r["metrics"].ttft is not None]

        def med(values):
            return 1e3 * statistics.median(values)
        print(f"| {length} | {med(ttfts) if ttfts else float('nan'):.2f} ms | {med([r['add_s'] for r in runs]):.3f} ms "
              f"| {statistics.median(len(r['steps_s']) for r in runs)} | {med([r['steps_s'][0] for r in runs]):.2f} ms "
              f"| {med([r['total_s'] for r in runs]):.2f} ms |", flush=True)
    profiler = cProfile.Profile()
    ids = fresh_ids(lengths[0])
    profiler.enable()
    one_request(engine, ids, params)
    profiler.disable()
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(args.top)
        print(f"\n== one {lengths[0]}-token request under cProfile, by {key}")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
