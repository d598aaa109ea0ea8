"""Where a decode step's time goes on the GPU: CUDA graphs vs eager launches, per batch size, per stage.

    python scripts/profile_decode.py [--model-dir /tmp/llama-1b-random] [--steps 20] [--batches 1,16,64]
For each batch size: the wall time of one decode step (128-token prompts) replayed from a CUDA graph and
launched eagerly, then, at batch 1, one step with per-stage synchronisation (ms per stage kind).
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
    args = parser.parse_args()
    from kernels_numba.common import cuda
    from tinyvllm.engine import EngineConfig, LLMEngine
    from tinyvllm.sampling_params import SamplingParams
    batches = [int(b) for b in args.batches.split(",")]
    blocks_per_seq = (args.prompt_len + 3 * args.steps + 16) // 16 + 1
    engine = LLMEngine(args.model_dir, EngineConfig(num_blocks=max(batches) * blocks_per_seq + 64, max_model_len=1024,
                                                    max_num_seqs=max(batches), max_num_batched_tokens=16384,
                                                    cuda_graphs=True))
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    graphs = engine.decode_graphs
    for batch in batches:
        vocab = engine.model.config.vocab_size
        ids = [engine.add_request([(1000 + i + j) % vocab for j in range(args.prompt_len)], params)
               for i in range(batch)]
        while engine.scheduler.num_waiting or any(not engine.request(i).seq.output_token_ids for i in ids):
            engine.step()
        for mode in ("graph", "eager"):
            engine.decode_graphs = graphs if mode == "graph" else None
            for _ in range(3):  # warm-up: capture / compile
                engine.step()
            cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            cuda.synchronize()
            ms = (time.perf_counter() - start) / args.steps * 1e3
            print(f"decode step, batch {batch:3d}, {mode:5s}: {ms:7.2f} ms  ({batch / ms * 1e3:8.1f} tok/s)", flush=True)
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
    engine.decode_graphs = graphs
    print(f"captured buckets: {graphs.captured_buckets}")


if __name__ == "__main__":
    main()
