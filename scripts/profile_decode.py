"""Where a decode step's time goes on the GPU: CUDA graphs vs eager launches, per batch size, per stage.

    python scripts/profile_decode.py [--model-dir /tmp/llama-1b-random] [--steps 20] [--batches 1,16,64]
For each batch size (128-token prompts): the wall time of one engine step with the decode replayed from a
CUDA graph and launched eagerly; the GPU time of the graph alone (CUDA events, no host work); and each
stage captured as a graph of its own and replayed, so its time is the kernels' alone (no launch overhead):
the sum of those against the whole graph shows what the gaps between kernels cost.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--batch-invariant", choices=("on", "off", "auto"), default="auto",
                        help="the engine's batch invariance (auto: EngineConfig's default)")
    args = parser.parse_args()
    from kernels_numba.common import cuda
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams
    batches = [int(b) for b in args.batches.split(",")]
    blocks_per_seq = (args.prompt_len + 3 * args.steps + 16) // 16 + 1
    engine = LLMEngine(args.model_dir, EngineConfig(pipeline_decode=False, num_blocks=max(batches) * blocks_per_seq + 64, max_model_len=max(1024, 16 * blocks_per_seq),
                                                    max_num_seqs=max(batches), max_num_batched_tokens=16384,
                                                    cuda_graphs=True,
                                                    batch_invariant={"on": True, "off": False}.get(args.batch_invariant)))
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    graphs = engine.runner.decode_graphs
    for batch in batches:
        vocab = engine.model.config.vocab_size
        ids = [engine.add_request([(1000 + i + j) % vocab for j in range(args.prompt_len)], params)
               for i in range(batch)]
        while engine.scheduler.num_waiting or any(not engine.request(i).seq.output_token_ids for i in ids):
            engine.step()
        for mode in ("graph", "eager"):
            engine.runner.decode_graphs = graphs if mode == "graph" else None
            for _ in range(3):  # warm-up: capture / compile
                engine.step()
            cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            cuda.synchronize()
            ms = (time.perf_counter() - start) / args.steps * 1e3
            print(f"decode step, batch {batch:3d}, {mode:5s}: {ms:7.2f} ms  ({batch / ms * 1e3:8.1f} tok/s)", flush=True)
        try:
            gpu_stage_profile(engine, graphs, batch, args.steps)
        except Exception as e:  # a profiling aid: report and go on with the rest
            print(f"  stage profile failed: {type(e).__name__}: {e}")
        if batch == batches[0]:
            per_stage = {}
            for stage in engine.step_stages(synchronize=True):
                if stage.launched:
                    per_stage.setdefault(stage.name.split(".")[-1], []).append((stage.seconds, stage.kernel))
            print(f"one eager step at batch {batch}, every stage synchronised (ms per stage kind, all layers):")
            for name, runs in per_stage.items():
                print(f"  {name:<14} {sum(s for s, _ in runs) * 1e3:8.2f}  ({len(runs)}x)  {runs[0][1]}")
        for i in ids:
            engine.abort_request(i)
        engine.step()
    engine.runner.decode_graphs = graphs
    print(f"captured buckets: {graphs.captured_buckets}")


def gpu_stage_profile(engine, graphs, batch_size: int, repeats: int) -> None:
    """The decode graph of this batch's bucket timed alone, then each stage captured and timed alone."""
    from tinyvllm.bench.graph_stages import stage_times, time_graph
    bucket = graphs.bucket_for(batch_size)
    captured = graphs._captured[bucket]
    whole = time_graph(captured._graph, repeats)
    captured._arena.rewind()
    per_kind = stage_times(engine.runner.forward_pass.device_forward_stages(captured._batch, synchronize=False),
                           captured._arena, repeats)
    total = sum(ms for ms, _, _ in per_kind.values())
    print(f"  GPU time, bucket {bucket}: whole decode graph {whole:.3f} ms; its stages one graph each, summed: "
          f"{total:.3f} ms")
    for kind, (ms, n, kernel) in per_kind.items():
        print(f"    {kind:<14} {ms:8.3f} ms ({n}x)  {kernel}")


if __name__ == "__main__":
    main()
