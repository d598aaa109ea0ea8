python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
# Issue 15 (tensor cores), everything to check on one H200 in one call of under 8 minutes (carry [".whl"]):
#   bash docs/bench/scripts/tc_gpu_check.sh          logs under $OUT (or ./out); a short summary last
# 1. GPU tests of mma.py's intrinsics, gemm_tc (every model projection shape) and the tensor-core prefill attention
#    (attention/prefill_tc.py), and, beside them, of every kernel
#    test the layout / epilogue commits touched (matmul, attention, paged attention, rope, CUDA graphs, demo goldens);
# 2. the SASS of every gemm_tc tile and of prefill_tc: HMMA, LDSM (and LDGSTS in gemm_tc) present, no LDL/STL
#    (scripts/check_tc_sass.py);
# 3. the tile sweep against gemm_blocked (fp32) and torch bf16 (scripts/sweep_tc_gemm.py);
# 4. prefill_tc against prefill_gqa at 1024 and 4096 tokens (scripts/time_prefill_attention.py).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.log" 2>&1
TINYVLLM_TEST_GPU=1 timeout 160 python3 -m pytest -q -p no:cacheprovider --durations=10 tests/test_mma.py \
  tests/test_gemm_tc.py tests/test_prefill_tc.py > "$OUT/gpu_tests_tc.log" 2>&1 &
TC_TESTS=$!
TINYVLLM_TEST_GPU=1 timeout 160 python3 -m pytest -q -p no:cacheprovider tests/test_matmul.py tests/test_attention.py \
  tests/test_paged_attention.py tests/test_rope.py tests/test_cuda_graphs.py tests/test_goldens_demo.py \
  > "$OUT/gpu_tests_touched.log" 2>&1
TOUCHED_RC=$?
wait $TC_TESTS
TC_RC=$?
timeout 60 python3 scripts/check_tc_sass.py > "$OUT/check_tc_sass.log" 2>&1
SASS_RC=$?
timeout 180 python3 scripts/sweep_tc_gemm.py --tokens 128,512,4096 > "$OUT/sweep_tc_gemm.log" 2>&1
SWEEP_RC=$?
timeout 120 python3 scripts/time_prefill_attention.py --tokens 1024,4096 > "$OUT/time_prefill_attention.log" 2>&1
ATTN_RC=$?
echo "== gpu tests (mma, gemm_tc, prefill_tc): rc=$TC_RC"; tail -1 "$OUT/gpu_tests_tc.log"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_tc.log" | head -10
echo "== gpu tests (touched kernels): rc=$TOUCHED_RC"; tail -1 "$OUT/gpu_tests_touched.log"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_touched.log" | head -10
echo "== sass: rc=$SASS_RC"; cat "$OUT/check_tc_sass.log" | tail -14
echo "== sweep: rc=$SWEEP_RC"; grep -E "^best|^correctness|to_bf16|gemm_blocked|torch bf16" "$OUT/sweep_tc_gemm.log" | tail -40
echo "== prefill attention: rc=$ATTN_RC"; cat "$OUT/time_prefill_attention.log"
