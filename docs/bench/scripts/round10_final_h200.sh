#!/usr/bin/env bash
# Round 10, last call on one H200 (~6 minutes): the engine on decode_warps vs decode_gqa (greedy tokens), the bench
# against HF with Round 10's plan (LARGE_TILE 128 x 128 x 64, decode_warps from batch 64), then where a 1,024- and a
# 4,096-token prompt's time to first token goes. After GPU.md's preamble (carry [".whl"]), from the repository root:
#   bash docs/bench/scripts/round10_final_h200.sh          logs under $OUT (or ./out)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
python3 -c "from tinyvllm.bench import prepare_random_model; from pathlib import Path; prepare_random_model(Path('/tmp/llama-1b-random'))" > "$OUT/prepare.log" 2>&1
timeout 70 python3 scripts/check_decode_warps_engine.py > "$OUT/check_decode_warps_engine.log" 2>&1
echo "== decode_warps in the engine: rc=$?"; tail -2 "$OUT/check_decode_warps_engine.log"
timeout 260 python3 -m tinyvllm.bench --random-1b /tmp/llama-1b-random --precision fast --compare hf \
  --workload latency,prefill,throughput --prefill-lens 1024,4096 --prefill-repeats 3 --max-num-seqs 256 \
  --batching continuous --max-seconds 60 --out "$OUT/bench-fast" > "$OUT/bench.log" 2>&1
echo "== bench: rc=$?"; tail -16 "$OUT/bench.log"
timeout 35 python3 scripts/profile_ttft.py --tokens 1024,4096 --repeats 3 > "$OUT/profile_ttft.log" 2>&1
echo "== profile_ttft: rc=$?"; grep -A4 "^| prompt" "$OUT/profile_ttft.log"
