#!/usr/bin/env bash
# Two H200s of one host, at the same time: GPU 0 runs tinyvllm (GPU tests, decode profile, bench
# latency/prefill/throughput, the gemv and decode-attention sweeps), GPU 1 runs the 1B-shaped comparison with HF and the
# same bench workloads through HF only; then one merged report (ratios) from both bench.json files.
#   bash docs/bench/scripts/h200_x2_final.sh    (logs under $OUT; SWEEPS=0 skips the two sweeps)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
BENCH_ARGS="--random-1b $MODEL --workload latency,prefill,throughput --prefill-repeats 1 --max-num-seqs 256"
python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
  > "$OUT/random_model.log" 2>&1 || { echo "random model failed"; tail "$OUT/random_model.log"; exit 1; }
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 120 python3 scripts/gpu_compare.py --model-dir "$MODEL" --out "$OUT" > "$OUT/gpu_compare.log" 2>&1
  echo "gpu_compare rc=$?" > "$OUT/gpu1_status.log"
  timeout 380 python3 -m tinyvllm.bench $BENCH_ARGS --compare hf --hf-only --max-seconds 200 \
    --out "$OUT/bench-hf" > "$OUT/bench-hf.log" 2>&1
  echo "hf bench rc=$?" >> "$OUT/gpu1_status.log"
) &
export CUDA_VISIBLE_DEVICES=0
TINYVLLM_TEST_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_matmul.py tests/test_paged_attention.py \
  tests/test_rope.py tests/test_embedding.py tests/test_cuda_graphs.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed" "$OUT/gpu_tests.log" | tail -3
timeout 90 python3 scripts/profile_decode.py --steps 10 --batches 1,64,256 > "$OUT/profile_decode.log" 2>&1
echo "profile rc=$?"; grep -E "decode step|captured" "$OUT/profile_decode.log"
timeout 380 python3 -m tinyvllm.bench $BENCH_ARGS --max-seconds 150 --out "$OUT/bench-tinyvllm" > "$OUT/bench-tinyvllm.log" 2>&1
echo "tinyvllm bench rc=$?"; grep -E "output tok/s|stopped|TTFT|captured" "$OUT/bench-tinyvllm.log" | tail -12
if [ "${SWEEPS:-1}" = 1 ]; then  # SWEEPS=0 skips them
  timeout 100 python3 scripts/sweep_gemv.py --shapes qkv,o_proj,gate_up,down > "$OUT/sweep_gemv.log" 2>&1
  echo "sweep_gemv rc=$?"; grep -E "best|torch" "$OUT/sweep_gemv.log"
  timeout 90 python3 scripts/sweep_decode_attention.py --cases 1x256,1x2048,8x512,32x512,64x512,256x1024 \
    > "$OUT/sweep_decode_attention.log" 2>&1
  echo "sweep_decode_attention rc=$?"; cat "$OUT/sweep_decode_attention.log"
fi
wait
cat "$OUT/gpu1_status.log"; grep -E "^\| [0-9]|Result" "$OUT/gpu_compare.log" | tail -5
grep -E "output tok/s|stopped" "$OUT/bench-hf.log" | tail -6
python3 -m tinyvllm.bench --merge "$OUT/bench-tinyvllm/bench.json" "$OUT/bench-hf/bench.json" --out "$OUT/bench-merged" \
  > "$OUT/bench-merged.log" 2>&1; echo "merge rc=$?"; grep -vE "^kernels" "$OUT/bench-merged.log" | tail -40
# The device tool returns only a few files per call: everything in one archive, plus the four key logs.
tar czf /tmp/all-results.tgz -C "$OUT" . && mv /tmp/all-results.tgz "$OUT"/ && \
  ( cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name all-results.tgz ! -name profile_decode.log \
      ! -name bench-merged.log ! -name bench-tinyvllm.log ! -name gpu_compare.log -exec rm -rf {} + )
ls "$OUT"
