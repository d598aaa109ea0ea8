#!/usr/bin/env bash
# The GPU checks and benchmarks as run on the lent H200 (see /work/shared/GPU.md for the numpy wheel).
#   bash docs/bench/scripts/h200_checks.sh correctness   # kernel tests on the GPU, demo goldens, 1B-shaped vs HF
#   bash docs/bench/scripts/h200_checks.sh bench-latency # tinyvllm bench latency + prefill, beside HF
#   bash docs/bench/scripts/h200_checks.sh bench-throughput
# Logs and results go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
case "${1:-correctness}" in
  correctness)
    TINYVLLM_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_bf16.py tests/test_embedding.py \
      tests/test_rmsnorm.py tests/test_rope.py tests/test_activation.py tests/test_sampling.py \
      tests/test_matmul.py tests/test_attention.py tests/test_paged_attention.py > "$OUT/gpu_kernel_tests.log" 2>&1
    echo "kernel tests rc=$?"; tail -1 "$OUT/gpu_kernel_tests.log"
    python3 -m tinyvllm.cli check-goldens > "$OUT/check_goldens_gpu.log" 2>&1
    echo "check-goldens rc=$?"; tail -1 "$OUT/check_goldens_gpu.log"
    python3 scripts/gpu_compare.py --model-dir "$MODEL" --out "$OUT" > "$OUT/gpu_compare.log" 2>&1
    echo "gpu_compare rc=$?"; grep -E "^\| [0-9]|Result" "$OUT/gpu_compare.log" ;;
  bench-latency)
    python3 -m tinyvllm.bench --random-1b "$MODEL" --workload latency,prefill --prefill-repeats 1 \
      --compare hf --max-seconds 120 --out "$OUT/bench-latency" ;;
  bench-throughput)
    python3 -m tinyvllm.bench --random-1b "$MODEL" --workload throughput --compare hf \
      --max-seconds "${MAX_SECONDS:-150}" --out "$OUT/bench-throughput" ;;
esac
