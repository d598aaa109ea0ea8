#!/usr/bin/env bash
# One device call: GPU kernel tests of the new kernels + graph capture, the GEMV sweep, the decode profile.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
(python3 -m tinyvllm.random_model /tmp/llama-1b-random > "$OUT/random_model.log" 2>&1; echo "random model rc=$?") &
TINYVLLM_TEST_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_rmsnorm.py tests/test_rope.py tests/test_matmul.py tests/test_cuda_graphs.py} > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/gpu_tests.log" | tail -8
timeout 200 python3 scripts/sweep_gemv.py > "$OUT/sweep_gemv.log" 2>&1; echo "sweep rc=$?"; head -12 "$OUT/sweep_gemv.log"
wait
timeout 200 python3 scripts/profile_decode.py --steps 20 > "$OUT/profile_decode.log" 2>&1; echo "profile rc=$?"; tail -22 "$OUT/profile_decode.log"
