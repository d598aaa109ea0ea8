#!/usr/bin/env bash
# One H200: the GPU tests, the decode profile (graph vs eager, per stage), then the throughput workload in
# static batching to completion (issue 3 item 8).   bash docs/bench/scripts/h200_static.sh   (logs under $OUT)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
  > "$OUT/random_model.log" 2>&1 || { echo "random model failed"; tail "$OUT/random_model.log"; exit 1; }
TINYVLLM_TEST_GPU=1 timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_matmul.py tests/test_cuda_graphs.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/gpu_tests.log" | tail -5
timeout 60 python3 scripts/profile_decode.py --steps 10 --batches 1,64,256 > "$OUT/profile_decode.log" 2>&1
echo "profile rc=$?"; cat "$OUT/profile_decode.log"
timeout 400 python3 -m tinyvllm.bench --random-1b $MODEL --workload throughput --batching static --max-num-seqs 256 \
  --max-seconds ${STATIC_SECONDS:-330} --no-plot --out "$OUT/bench-static" > "$OUT/bench-static.log" 2>&1
echo "static bench rc=$?"; grep -vE "^kernels" "$OUT/bench-static.log" | tail -30
tar czf /tmp/all-results.tgz -C "$OUT" . && mv /tmp/all-results.tgz "$OUT"/
