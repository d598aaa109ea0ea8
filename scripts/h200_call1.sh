#!/usr/bin/env bash
# One device call: GPU kernel tests (new kernels + graph capture), the decode profile, the 1B-shaped
# comparison with HF (graphs on for the greedy continuations), latency/prefill/kernels benchmarks beside HF.
#   bash scripts/h200_call1.sh            (logs under $OUT)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
(python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
  > "$OUT/random_model.log" 2>&1; echo "random model rc=$?") &
TINYVLLM_TEST_GPU=1 timeout 200 python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_paged_attention.py tests/test_matmul.py tests/test_cuda_graphs.py} > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/gpu_tests.log" | tail -8
wait
timeout 150 python3 scripts/profile_decode.py --steps 20 > "$OUT/profile_decode.log" 2>&1; echo "profile rc=$?"; tail -16 "$OUT/profile_decode.log"
timeout 200 python3 scripts/gpu_compare.py --model-dir "$MODEL" --out "$OUT" > "$OUT/gpu_compare.log" 2>&1
echo "gpu_compare rc=$?"; grep -E "^\| [0-9]|Result|greedy" "$OUT/gpu_compare.log" | tail -8
timeout 200 python3 -m tinyvllm.bench --random-1b "$MODEL" --workload latency,prefill,kernels --prefill-repeats 1 \
  --compare hf --max-seconds 100 --out "$OUT/bench-latency" > "$OUT/bench-latency.log" 2>&1
echo "bench rc=$?"; tail -45 "$OUT/bench-latency.log"
