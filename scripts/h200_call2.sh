#!/usr/bin/env bash
# One device call: GPU tests of the GEMV passes + graphs, the decode profile per batch size, the
# nano-vllm throughput workload to completion (continuous, static, HF), then latency/prefill.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
(python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
  > "$OUT/random_model.log" 2>&1; echo "random model rc=$?") &
TINYVLLM_TEST_GPU=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_matmul.py tests/test_cuda_graphs.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/gpu_tests.log" | tail -5
wait
timeout 100 python3 scripts/profile_decode.py --steps 10 --batches 1,16,64,256 > "$OUT/profile_decode.log" 2>&1; echo "profile rc=$?"; grep "decode step" "$OUT/profile_decode.log"
timeout 480 python3 -m tinyvllm.bench --random-1b "$MODEL" --workload throughput --compare hf --max-num-seqs 256 \
  --max-seconds ${MAX_SECONDS:-170} --out "$OUT/bench-throughput" > "$OUT/bench-throughput.log" 2>&1
echo "throughput rc=$?"; grep -E "throughput|stopped|finished|requests" "$OUT/bench-throughput.log" | tail -25
