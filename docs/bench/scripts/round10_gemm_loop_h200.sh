#!/usr/bin/env bash
# Round 10, third and fourth calls on one H200 (~5 + ~4 minutes, the second while the machine is warm): gemm_tc with its integer work cut (32-bit shared addresses the
# compiler sees, one-add copy addresses, stage counters: ptxas, 128 x 128 x 32 over 4 stages, main loop 373 -> 208
# instructions a slice for the same 64 HMMA; registers 252 -> 222, 64 x 128 x 64: 244 -> 130), then the bench.
# After GPU.md's preamble (carry [".whl"]; PYTHONPATH=/tmp/site:$PWD), from the repository root:
#   bash docs/bench/scripts/round10_gemm_loop_h200.sh checks   steps 1-4, logs under $OUT (or ./out)
#   bash docs/bench/scripts/round10_gemm_loop_h200.sh bench    step 5
# 1. check_tc_sass (no local memory in the planned tiles, prefill_tc included: its ldmatrix / cp.async changed too);
# 2. the GPU tests of mma, gemm_tc and prefill_tc (and decode_warps, where its test file is present);
# 3. the sweep at 128 / 256 / 1,024 / 4,096 rows over the planned tiles and the candidates the lower register counts
#    open up; 4. decode_warps vs decode_gqa (where present); 5. the bench against HF.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
if [ "${1:-checks}" = checks ]; then
timeout 80 python3 scripts/check_tc_sass.py > "$OUT/check_tc_sass.log" 2>&1
echo "== check_tc_sass: rc=$?"; grep -v "^ok" "$OUT/check_tc_sass.log" | tail -5; grep "registers" "$OUT/check_tc_sass.log" | head -3
TESTS="tests/test_mma.py tests/test_gemm_tc.py tests/test_prefill_tc.py"
[ -f tests/test_decode_warps.py ] && TESTS="$TESTS tests/test_decode_warps.py"
TINYVLLM_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
echo "== GPU tests: rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -8
timeout 130 python3 scripts/sweep_tc_gemm.py --tokens 128,256,1024,4096 --shapes qkv,o_proj,gate_up,down \
  --tiles 5,6,11,12,14,16,17,19 > "$OUT/sweep_tc_gemm.log" 2>&1
echo "== sweep: rc=$?"; grep -E "^best|^correctness" "$OUT/sweep_tc_gemm.log"
if [ -f scripts/time_decode_warps.py ]; then
  timeout 60 python3 scripts/time_decode_warps.py --warps 2,4 > "$OUT/time_decode_warps.log" 2>&1
  echo "== decode_warps: rc=$?"; tail -14 "$OUT/time_decode_warps.log"
fi
else
timeout 300 python3 -m tinyvllm.bench --random-1b /tmp/llama-1b-random --precision fast --compare hf \
  --workload latency,prefill,throughput --prefill-lens 1024,4096 --prefill-repeats 3 --max-num-seqs 256 \
  --batching continuous --max-seconds 60 --out "$OUT/bench-fast" > "$OUT/bench.log" 2>&1
echo "== bench: rc=$?"; tail -16 "$OUT/bench.log"
fi
