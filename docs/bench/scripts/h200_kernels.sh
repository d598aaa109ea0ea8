#!/usr/bin/env bash
# One H200, kernels only: the GPU tests of the kernels that changed, the linear crossover (gemv vs gemm,
# split-K, 8x8), and the decode profile per stage.   bash docs/bench/scripts/h200_kernels.sh   (logs under $OUT)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
  > "$OUT/random_model.log" 2>&1 &
TINYVLLM_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_matmul.py tests/test_paged_attention.py \
  tests/test_cuda_graphs.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/gpu_tests.log" | tail -8
timeout 120 python3 scripts/crossover_linear.py --tokens ${TOKENS:-16,32,64,128,256,512,2048} > "$OUT/crossover.log" 2>&1
echo "crossover rc=$?"; cat "$OUT/crossover.log"
wait
timeout 90 python3 scripts/profile_decode.py --steps 10 --batches 1,64,256 > "$OUT/profile_decode.log" 2>&1
echo "profile rc=$?"; grep -vE "^  (embedding|input_norm) " "$OUT/profile_decode.log"
