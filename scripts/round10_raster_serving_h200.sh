#!/usr/bin/env bash
# Round 10, second call on one H200 (~5 minutes): gemm_tc's block order (gemm_tc.RASTER) and the serving checks left
# over from Round 9. After GPU.md's preamble, with the serving wheels too (carry [".whl", "gpuwheels/srv"]:
#   pip install ... --target /tmp/site .whl/*.whl gpuwheels/srv/*.whl), from the repository root:
#   bash scripts/round10_raster_serving_h200.sh          logs under $OUT (or ./out)
# 1. test_gemm_tc on the GPU (the model shapes run either block order: N > M or not);
# 2. the sweep of the planned tiles at 1,024 / 4,096 rows in both orders (raster n: Rounds 7-9; m: M-tiles fastest);
# 3. the serving tests over real HTTP (the logprob test's offline side one request at a time; serve capturing every
#    CUDA graph at start).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
TINYVLLM_TEST_GPU=1 timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_tc.py > "$OUT/gemm_tc_tests.log" 2>&1
echo "== GPU test_gemm_tc: rc=$?"; tail -2 "$OUT/gemm_tc_tests.log"
timeout 120 python3 scripts/sweep_tc_gemm.py --tokens 1024,4096 --shapes qkv,o_proj,gate_up,down --tiles 11,16 \
  --raster n,m > "$OUT/sweep_tc_gemm_raster.log" 2>&1
echo "== sweep, both block orders: rc=$?"; grep -E "^(qkv|o_proj|gate_up|down) [0-9]+ gemm_tc|^best|^correctness" "$OUT/sweep_tc_gemm_raster.log"
TINYVLLM_TEST_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_serving_http.py \
  tests/test_serving_process.py > "$OUT/serving_tests.log" 2>&1
echo "== GPU serving tests: rc=$?"; tail -6 "$OUT/serving_tests.log"
