#!/bin/bash
# Round 15 on the H200 (docs/bench-h200.md): the device tool's calls, each run as `bash round15_h200.sh CALL` from
# the repository root with .whl carried (docs/gpu.md). The MMLU run needs real words: TOKENIZER_DIR holds Meta's Llama
# 3 tokenizer.json / tokenizer_config.json, written beforehand on a machine with llama-models by
# tinyvllm.model.fixtures.random_model.write_llama3_tokenizer_if_available and carried untracked.
# CALL: profiles (start, decode traces, throughput, MMLU vs HF), argmax (GPU tests, sweeps, traces), sweep (the
# per-row kernels), rmsnorm (GPU tests, the bench with HF, traces), prefill (row kernels at prefill sizes, the prefill
# profile), flash (flash_decode_warps' partitions timed and the fastest kept, GPU tests, the bench with HF, a trace).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export XDG_CACHE_HOME=/tmp/gpu-cache PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
write_model() {
  mkdir -p $MODEL && { [ -z "$TOKENIZER_DIR" ] || cp "$TOKENIZER_DIR"/* $MODEL/; }
  python3 scripts/write_random_1b.py $MODEL > $OUT/write.log 2>&1 || { tail $OUT/write.log; exit 1; }
}
BENCH="python3 -m tinyvllm.bench --random-1b $MODEL --precision fast --workload latency,prefill,throughput --prefill-lens 128,1024,4096 --max-num-seqs 256 --batching continuous --compare hf --max-seconds 60 --out $OUT/bench"
case "$1" in
profiles)
write_model
timeout 60 python3 scripts/startup_profile.py --model $MODEL --cache /tmp/cold1 > $OUT/startup-cold.log 2>&1; echo cold rc $?
timeout 30 python3 scripts/startup_profile.py --model $MODEL --cache /tmp/cold1 > $OUT/startup-warm.log 2>&1; echo warm rc $?
timeout 120 python3 scripts/trace_decode.py --batches 1,64,256 > $OUT/trace-decode.log 2>&1; echo trace rc $?
timeout 100 python3 scripts/profile_throughput.py > $OUT/profile-throughput.log 2>&1; echo thr rc $?
timeout 230 python3 scripts/eval_bench.py --model $MODEL --fewshot-limit 0 --max-seconds 100 --out $OUT/eval-bench > $OUT/eval-bench.log 2>&1; echo eval rc $?
;;
argmax)
write_model
TINYVLLM_TEST_GPU=1 timeout 200 python3 -m pytest -q -x tests/test_sampling.py tests/test_cuda_graphs.py tests/test_prefill_graphs.py > $OUT/gpu-tests.log 2>&1; echo tests rc $?
timeout 150 python3 scripts/trace_decode.py --batches 1,256 > $OUT/trace-decode.log 2>&1; echo trace rc $?
timeout 100 python3 scripts/trace_decode.py --batches 256 --prompt-len 700 > $OUT/trace-decode-700.log 2>&1; echo trace700 rc $?
timeout 100 python3 scripts/profile_throughput.py > $OUT/profile-throughput.log 2>&1; echo thr rc $?
;;
sweep)
timeout 150 python3 scripts/sweep_row_kernels.py > $OUT/sweep-row-kernels.log 2>&1; echo sweep rc $?
;;
rmsnorm)
write_model
TINYVLLM_TEST_GPU=1 timeout 230 python3 -m pytest -q tests/test_rmsnorm.py tests/test_sampling.py tests/test_cuda_graphs.py tests/test_prefill_graphs.py tests/test_batch_invariance.py tests/test_engine.py tests/test_kernel_plan.py > $OUT/gpu-tests.log 2>&1; echo tests rc $?
timeout 230 $BENCH > $OUT/bench.log 2>&1; echo bench rc $?
timeout 90 python3 scripts/trace_decode.py --batches 1,256 > $OUT/trace-decode.log 2>&1; echo trace rc $?
;;
prefill)
timeout 60 python3 scripts/sweep_row_kernels.py --rows 1024,4096,16384 --threads 128,256,512 --per-thread 8 > $OUT/sweep-rows-prefill.log 2>&1
timeout 100 python3 scripts/profile_prefill.py --tokens 4096,1024,128 > $OUT/profile-prefill.log 2>&1; echo prof rc $?
;;
flash)
write_model &
timeout 100 python3 scripts/time_flash_decode.py > $OUT/time-flash-decode.log 2>&1; echo timing rc $?
# the partition size with the least time over the cases goes into decode_warps.FLASH_PARTITION_KEYS for the rest
P=$(python3 - $OUT/time-flash-decode.log <<'PY'
import collections, re, sys
total = collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"\s+flash_decode_warps (\d+): \|diff\| \S+, +([\d.]+) us", line)
    if m:
        total[int(m.group(1))] += float(m.group(2))
print(min(total, key=total.get))
PY
)
sed -i "s/^FLASH_PARTITION_KEYS = 64 if SIMULATOR else [0-9]*/FLASH_PARTITION_KEYS = 64 if SIMULATOR else $P/" kernels_numba/attention/decode_warps.py
wait
TINYVLLM_TEST_GPU=1 timeout 110 python3 -m pytest -q -x tests/test_decode_warps.py tests/test_cuda_graphs.py tests/test_engine.py > $OUT/gpu-tests.log 2>&1; echo tests rc $?
timeout 215 $BENCH > $OUT/bench.log 2>&1; echo bench rc $?
timeout 45 python3 scripts/trace_decode.py --batches 1 > $OUT/trace-decode.log 2>&1; echo trace rc $?
;;
*) echo "usage: bash $0 profiles | argmax | sweep | rmsnorm | prefill | flash"; exit 2 ;;
esac
