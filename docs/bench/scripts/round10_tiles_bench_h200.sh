#!/usr/bin/env bash
# Round 10 on one H200, one call (~8 minutes): the tiles tile_for now picks (DEFAULT_TILE 64 x 128 x 64 over 3 stages,
# LARGE_TILE 128 x 128 x 32 over 4, both past 48 KB of dynamic shared memory), then the bench against HF.
# After GPU.md's preamble (carry [".whl"]; PYTHONPATH=/tmp/site:$PWD), from the repository root:
#   bash docs/bench/scripts/round10_tiles_bench_h200.sh          logs under $OUT (or ./out)
# 1. check_tc_sass: the planned tiles (the residual epilogue and split-K included) without local memory;
# 2. test_gemm_tc on the GPU;
# 3. the sweep at decode-batch sizes (128, 256 rows) over the old and new planned tiles: tile_for's choice at 128 rows
#    was measured with the old DEFAULT_TILE (Round 7);
# 4. the bench: latency, prefill 1,024 / 4,096, the 256-request workload, HF transformers in the same run.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
timeout 80 python3 scripts/check_tc_sass.py > "$OUT/check_tc_sass.log" 2>&1
echo "== check_tc_sass: rc=$?"; grep -v "^ok" "$OUT/check_tc_sass.log" | tail -6
TINYVLLM_TEST_GPU=1 timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_tc.py > "$OUT/gemm_tc_tests.log" 2>&1
echo "== GPU test_gemm_tc: rc=$?"; tail -2 "$OUT/gemm_tc_tests.log"
timeout 80 python3 scripts/sweep_tc_gemm.py --tokens 128,256 --shapes qkv,o_proj,gate_up,down --tiles 0,5,6,11,16 \
  > "$OUT/sweep_tc_gemm_decode_sizes.log" 2>&1
echo "== sweep 128/256 rows: rc=$?"; grep "^best\|correctness" "$OUT/sweep_tc_gemm_decode_sizes.log"
timeout 290 python3 -m tinyvllm.bench --random-1b /tmp/llama-1b-random --precision fast --compare hf \
  --workload latency,prefill,throughput --prefill-lens 1024,4096 --prefill-repeats 3 --max-num-seqs 256 \
  --batching continuous --max-seconds 60 --out "$OUT/bench-fast" > "$OUT/bench.log" 2>&1
echo "== bench: rc=$?"; tail -22 "$OUT/bench.log"
