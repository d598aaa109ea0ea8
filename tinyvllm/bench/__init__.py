"""`tinyvllm bench`: measure the engine the way inference engines are measured, optionally beside HF transformers.

    tinyvllm bench [--model DIR | --random-1b DIR] [--workload latency,prefill,throughput,serving]
                   [--compare hf] [--out DIR] [--max-seconds S] ...      (python -m tinyvllm.bench: the same)

Every request is random token ids from a fixed seed, greedy, ignore_eos, so it produces exactly the tokens it
asks for (and tinyvllm and HF get the very same prompts):
  latency     batch 1, a 128-token prompt, 256 new tokens: TTFT, TPOT, output tok/s, and the decode step against
              the HBM roofline: weight bytes read per step / TPOT, as a fraction of the copy bandwidth measured
              in the same run (a device-to-device copy)
  prefill     TTFT of one 128 / 1024 / 4096-token prompt (capped to the context), median of --prefill-repeats
  throughput  nano-vllm's workload: 256 requests, prompt and output lengths uniform in 100..1024, all queued at
              once: output tok/s with continuous and with static batching (batches of --max-num-seqs)
  serving     requests arriving as a Poisson process at --request-rate: TTFT / ITL / E2E p50 p95 p99 from the
              engine's MetricsCollector; TTFT and E2E count from each request's scheduled arrival time
  kernels     the latency prompt's prefill step and one batch-1 decode step, every stage synchronised: time,
              useful GB/s and TFLOP/s per kernel against what the stage must move and do (stage_costs.py)
Timing: a warm-up generate first (numba compiles kernels at their first launch), a fresh engine per run (empty
KV pool and prefix cache, fresh metrics), cuda.synchronize() before every clock read that ends a run. A run
stops at --max-seconds and reports how far it got. Output: OUT/bench.json, OUT/bench.csv, a table on stdout,
progress on stderr, and OUT/bench.png when matplotlib is installed.

--batch-invariant auto|on|off|both sets the engine's EngineConfig.batch_invariant (docs/batch-invariance.md; auto,
the default: the engine's own, on except the fast precision on a GPU); both runs
every tinyvllm workload twice, invariance on then off, on the same requests: each row records which (its engine's
kernel plan), and invariance_ratios (JSON) / the table's on/off column give on / off per time and token rate.

--compare hf runs latency, prefill and throughput through HF transformers (LlamaForCausalLM in bf16, sdpa, on
the same GPU and weights; serving is not run: `generate` has no request-arrival API): greedy `generate` with
min_new_tokens = max_new_tokens, throughput in static batches of --hf-batch-size with left padding, counting
only the tokens each request asked for. The table then shows tinyvllm/HF ratios. torch and transformers are
imported only then. Without a CUDA GPU it stops with a message, unless --hf-device cpu (a slow dry run).

--base-url URL sends the serving workload (Poisson arrivals at --request-rate) and / or the throughput workload
(all at once) to a running OpenAI-compatible server (tinyvllm serve, vLLM) as streamed /v1/completions, at most
--max-concurrency in flight, after a warm-up burst, and reports what `vllm bench serve` reports: successful and
failed requests, duration, request / output / total token throughput, peak concurrency, and mean / median / p99
of TTFT, TPOT, ITL and E2E latency (http_client.py, http_runs.py). --check-greedy then runs offline
LLM.generate on the same prompts (--model: the server's model) and compares every served output with it.
"""
from tinyvllm.bench.command import run, run_bench
from tinyvllm.bench.config import BATCHING_MODES, WORKLOADS, BenchConfig, add_arguments, config_from_args
from tinyvllm.bench.report import comparisons, format_report, merge_reports, weight_bytes
from tinyvllm.model.fixtures.random_model import prepare_random_model, write_placeholder_tokenizer
from tinyvllm.bench.workloads import Workloads, poisson_arrivals

__all__ = ["BATCHING_MODES", "WORKLOADS", "BenchConfig", "Workloads", "add_arguments", "comparisons",
           "config_from_args", "format_report", "merge_reports", "poisson_arrivals",
           "prepare_random_model", "run", "run_bench", "weight_bytes", "write_placeholder_tokenizer"]
