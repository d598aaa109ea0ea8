#!/usr/bin/env bash
# Round 11 on one H200, two calls on a warm machine (carry [".whl"], GPU.md's preamble first):
#   bash docs/bench/scripts/round11_h200.sh checks   (~4.5 min) GPU tests of every kernel this round touched (rmsnorm's bf16 copy,
#       rope_qkv and to_bf16_rows in rows, gemm_tc's SwiGLU epilogue and 32-bit shared addresses, prefill_tc's
#       32-bit key-tile loop), then timings: gate|up fused vs unfused, prefill attention (and capped at 128
#       registers), gemm_tc at the plan's tiles with to_bf16 beside it
#   bash docs/bench/scripts/round11_h200.sh bench    (~6 min) scripts/fast_path_compare.py on the random 1B model against HF
#       bf16 / fp32, then the bench against HF (latency, prefill 1,024 / 4,096, the 256-request workload)
# Logs under $OUT (or ./out); a short summary last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/xdg}
MODEL=/tmp/llama-1b-random
case "${1:-checks}" in
checks)
  SUITE_TIMEOUT=210 OUT=$OUT bash docs/bench/scripts/gpu_suite.sh tests/test_rmsnorm.py tests/test_rope.py tests/test_gemm_tc.py \
    tests/test_prefill_tc.py tests/test_mma.py tests/test_precision.py tests/test_prefill_graphs.py \
    tests/test_debugger_precision.py tests/test_kernel_cache.py 2>&1 | tail -25
  timeout 30 python3 scripts/check_tc_sass.py > "$OUT/check_tc_sass.log" 2>&1
  echo "== check_tc_sass: rc=$?"; tail -3 "$OUT/check_tc_sass.log"
  timeout 40 python3 scripts/time_swiglu_gemm.py --tokens 1024,4096 > "$OUT/time_swiglu_gemm.log" 2>&1
  echo "== time_swiglu_gemm: rc=$?"; tail -8 "$OUT/time_swiglu_gemm.log"
  timeout 50 python3 scripts/time_prefill_attention.py --kv-dtype bfloat16 --tokens 1024,4096 --max-registers 128 \
    > "$OUT/time_prefill_attention.log" 2>&1
  echo "== time_prefill_attention: rc=$?"; tail -14 "$OUT/time_prefill_attention.log"
  timeout 60 python3 scripts/sweep_tc_gemm.py --tokens 1024,4096 --tiles default > "$OUT/sweep_tc_gemm.log" 2>&1
  echo "== sweep_tc_gemm (plan's tiles): rc=$?"; grep -E "^[a-z_]+ [0-9]+x|to_bf16|gemm_tc|torch" "$OUT/sweep_tc_gemm.log" | head -40
  ;;
bench)
  python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
    > "$OUT/random_model.log" 2>&1 || { echo "random model failed"; tail "$OUT/random_model.log"; exit 1; }
  timeout 170 python3 scripts/fast_path_compare.py --model random-1b --model-dir "$MODEL" --out "$OUT" \
    > "$OUT/fast_path_compare-random-1b.log" 2>&1
  echo "== fast_path_compare random-1b: rc=$?"; grep -E "^\| [0-9] \| [0-9]|^Result" "$OUT/fast_path_compare-random-1b.log"
  timeout 230 python3 -m tinyvllm.bench --random-1b "$MODEL" --precision fast --compare hf \
    --workload latency,prefill,throughput --prefill-lens 1024,4096 --prefill-repeats 3 --max-num-seqs 256 \
    --batching continuous --max-seconds 60 --out "$OUT/bench-fast" > "$OUT/bench.log" 2>&1
  echo "== bench: rc=$?"; tail -16 "$OUT/bench.log"
  ;;
*) echo "usage: $0 checks|bench"; exit 2 ;;
esac
