"""Where a prefill step's time goes on the GPU: one prompt's captured prefill graph timed alone (CUDA events, no
host work), then each stage captured as a graph of its own and timed alone, each against its floor (its FLOPs at
the dense bf16 peak, its bytes at the copy bandwidth measured here as tinyvllm bench does: tinyvllm.bench.stage_costs,
tinyvllm.bench.report.copy_bandwidth).

    python scripts/profile_prefill.py [--model-dir /tmp/llama-1b-random] [--tokens 1024,4096] [--precision fast]
                                      [--max-num-seqs 256]

The stages' sum against the whole graph shows what the gaps between kernels cost; each stage's ms against its
floor what its kernel leaves. GPU only.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DENSE_BF16_TFLOPS = 989.0  # sm_90 SXM parts' dense bf16 peak (NVIDIA's datasheet)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/llama-1b-random")
    parser.add_argument("--tokens", default="1024,4096", help="prompt lengths, comma-separated")
    parser.add_argument("--precision", choices=("fast", "fp32"), default="fast")
    parser.add_argument("--repeats", type=int, default=10, help="graph launches a timing averages")
    parser.add_argument("--max-num-seqs", type=int, default=1,
                        help="the engine's sequences (the bench runs 256: more padding tiles in the attention grid)")
    args = parser.parse_args()
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.engine.sampling_params import SamplingParams
    lens = [int(n) for n in args.tokens.split(",")]
    engine = LLMEngine(args.model_dir, EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=max(lens),
                                                    max_model_len=max(lens) + 16, cuda_graphs=True,
                                                    prefill_graphs=True, compile_workers=0, enable_prefix_caching=False,
                                                    precision=args.precision))
    from tinyvllm.bench.config import BenchConfig
    from tinyvllm.bench.report import copy_bandwidth
    copy_gb_s = copy_bandwidth(BenchConfig().copy_mib << 20)["gb_per_s"]
    vocab = engine.model.config.vocab_size
    for n in lens:
        engine.add_request([(1000 + 7 * j) % vocab for j in range(n)], SamplingParams(temperature=0.0, max_tokens=1))
        batch = None
        while engine.has_unfinished_requests():
            engine.step()
            batch = batch or engine.last_batch
        graphs = engine.runner.prefill_graphs
        captured = graphs._captured[graphs.bucket_for(n)]
        profile(engine, captured, batch, n, args.repeats, copy_gb_s)


def profile(engine, captured, batch, n: int, repeats: int, copy_gb_s: float) -> None:
    from tinyvllm.bench.graph_stages import stage_times, time_graph
    from tinyvllm.bench.stage_costs import stage_costs
    whole = time_graph(captured._graph, repeats)
    costs = stage_costs(engine.model.config, batch, 0, weight_bytes=2,
                        kv_element_bytes=engine.kv_pool.layer(0)[0].dtype.itemsize)
    captured._arena.rewind()
    per_kind = stage_times(captured.forward.device_hidden_stages(captured._batch, synchronize=False),
                           captured._arena, repeats)
    total = sum(ms for ms, _, _ in per_kind.values())
    print(f"prefill of {n} tokens (bucket {captured.bucket}): whole graph {whole:.2f} ms (GPU time); its stages one "
          f"graph each, summed: {total:.2f} ms")
    print(f"  {'stage':<14} {'ms':>7} {'floor':>7} {'TFLOP/s':>8} {'GB/s':>7}  kernel")
    floor_total = 0.0
    for kind, (ms, count, kernel) in per_kind.items():
        cost = costs.get(kind)
        flops, moved = (cost.flops * count, cost.bytes * count) if cost else (0, 0)
        floor = max(flops / DENSE_BF16_TFLOPS / 1e9, moved / copy_gb_s / 1e6)
        floor_total += floor
        print(f"  {kind:<14} {ms:7.3f} {floor:7.3f} {flops / ms / 1e9:8.1f} {moved / ms / 1e6:7.0f}  ({count}x) {kernel}")
    print(f"  floor of the stages: {floor_total:.2f} ms (FLOPs at {DENSE_BF16_TFLOPS:.0f} TFLOP/s, bytes at "
          f"{copy_gb_s:.0f} GB/s, measured)", flush=True)


if __name__ == "__main__":
    main()
