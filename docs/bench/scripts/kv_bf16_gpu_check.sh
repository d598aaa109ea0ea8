python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
# Issue 15, the bf16 KV pool, on one H200 in one call of under 8 minutes (carry [".whl"]):
#   bash docs/bench/scripts/kv_bf16_gpu_check.sh          logs under $OUT (or ./out); a short summary last
# 1. the GPU tests of every kernel that writes or reads the pool, both pool dtypes (tests parametrized over
#    float32 / uint16): write_kv_paged, rope_qkv, the RoPE + K/V epilogue of gemv_fused, per_query, decode_gqa,
#    flash_decode, prefill_gqa, prefill_tc (cp.async copies of bf16 rows), the KV pool, the demo model end to end
#    with a bf16 cache (one test is simulator-only and skips), and the CUDA-graph decode and goldens beside them;
# 2. decode attention at batch 1 / 64 / 256 x 1024-token contexts, Llama-3.2-1B shape, float32 vs bf16 pool
#    (scripts/time_kv_dtype_decode.py).
# Pass: both pytest runs end "N passed" with no FAILED / ERROR lines (the SKIPPED lines listed are simulator-only
# tests, e.g. test_kv_cache_bf16's float32-cache-written-in-bf16 one), and the timing ends "PASS: bf16 pool = float32
# math on the rounded K/V" (one line per batch: float32 and bf16 x1 / x2* / x4 elements per load, us and GB/s, the
# default's speedup; bf16 reads half the bytes, so up to 2x where decode attention is bandwidth-bound).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TINYVLLM_TEST_GPU=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/.gpu-cache}
unset NUMBA_ENABLE_CUDASIM NUMBA_CACHE_DIR TINYVLLM_KERNEL_CACHE_DIR
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.log" 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=10 tests/test_paged_attention.py \
  tests/test_prefill_tc.py tests/test_rope.py tests/test_kv_pool.py tests/test_kv_cache_bf16.py \
  tests/test_stage_costs.py tests/test_attention.py > "$OUT/gpu_tests_kv_attention.log" 2>&1
ATTN_RC=$?
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_matmul.py tests/test_cuda_graphs.py \
  tests/test_goldens_demo.py > "$OUT/gpu_tests_kv_matmul_graphs.log" 2>&1
MATMUL_RC=$?
unset TINYVLLM_TEST_GPU
timeout 150 python3 scripts/time_kv_dtype_decode.py > "$OUT/time_kv_dtype_decode.log" 2>&1
TIME_RC=$?
echo "== gpu tests (paged attention, prefill_tc, rope, pool, end to end): rc=$ATTN_RC"; tail -1 "$OUT/gpu_tests_kv_attention.log"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/gpu_tests_kv_attention.log" | head -10
echo "== gpu tests (matmul epilogue, CUDA graphs, goldens): rc=$MATMUL_RC"; tail -1 "$OUT/gpu_tests_kv_matmul_graphs.log"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_kv_matmul_graphs.log" | head -10
echo "== decode attention, float32 vs bf16 pool: rc=$TIME_RC"; cat "$OUT/time_kv_dtype_decode.log" | tail -8
