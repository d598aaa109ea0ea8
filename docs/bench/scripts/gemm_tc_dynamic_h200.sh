#!/usr/bin/env bash
# gemm_tc from dynamic shared memory (tiles past 48 KB), on one H200, in one call of ~6 minutes: after GPU.md's
# preamble (carry [".whl"]; PYTHONPATH=/tmp/site:$PWD), from the repository root:
#   bash docs/bench/scripts/gemm_tc_dynamic_h200.sh          logs under $OUT (or ./out)
# 1. the GPU tests of gemm_tc, mma and the kernel cache (tiles past 48 KB launched and checked against the bound);
# 2. check_tc_sass (HMMA / LDSM / LDGSTS present, no spills in the tiles tile_for picks);
# 3. the sweep at 1,024 and 4,096 tokens over today's tiles 0 and 5 and the ten new ones (10-19).
# Pass: pytest all passed, "sass check: PASS", "correctness: PASS"; tiles 0 and 5 within a few percent of Round 7's
# rows (docs/bench/h200-round7-sweep_tc_gemm.log: qkv at 4,096 tokens 225 and 190 TFLOP/s); the new rows are the result.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
TINYVLLM_TEST_GPU=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_tc.py tests/test_mma.py \
  tests/test_kernel_cache.py > "$OUT/gemm_tc_dynamic_tests.log" 2>&1
echo "== GPU tests: rc=$?"; tail -3 "$OUT/gemm_tc_dynamic_tests.log"
timeout 100 python3 scripts/check_tc_sass.py > "$OUT/check_tc_sass.log" 2>&1
echo "== check_tc_sass: rc=$?"; tail -15 "$OUT/check_tc_sass.log"
timeout 260 python3 scripts/sweep_tc_gemm.py --tokens 1024,4096 --shapes qkv,o_proj,gate_up,down \
  --tiles 0,5,10,11,12,13,14,15,16,17,18,19 > "$OUT/sweep_tc_gemm_dynamic.log" 2>&1
echo "== sweep: rc=$?"; tail -40 "$OUT/sweep_tc_gemm_dynamic.log"
