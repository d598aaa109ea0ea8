#!/bin/bash
# Round 14 on the H200 (docs/bench-h200.md): three calls of the device tool, each run as `bash round14_h200.sh CALL`
# from the repository root, with .whl carried (docs/gpu.md). CALL: before (round 13 code: bench, profiles, start),
# probe (the TTFT breakdown, ncu, phase-timed start, GPU tests), after (this round: start, tests, bench, profiles).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export XDG_CACHE_HOME=/tmp/gpu-cache PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
case "$1" in
before)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
python3 scripts/write_random_1b.py /tmp/llama-1b-random > $OUT/write.log 2>&1 || { tail $OUT/write.log; exit 1; }
timeout 90 python3 scripts/startup_profile.py --model /tmp/llama-1b-random --cache /tmp/cold1 > $OUT/startup-cold.log 2>&1; echo cold rc $?
timeout 40 python3 scripts/startup_profile.py --model /tmp/llama-1b-random --cache /tmp/cold1 > $OUT/startup-warm.log 2>&1; echo warm rc $?
tail -5 $OUT/startup-cold.log $OUT/startup-warm.log
timeout 330 python3 -m tinyvllm.bench --random-1b /tmp/llama-1b-random --precision fast --workload latency,prefill,throughput --prefill-lens 128,1024,4096 --max-num-seqs 256 --batching continuous --compare hf --max-seconds 60 --out $OUT/bench > $OUT/bench.log 2>&1; echo bench rc $?
tail -40 $OUT/bench.log
timeout 100 python3 scripts/profile_prefill.py --tokens 4096,1024,128 > $OUT/profile-prefill.log 2>&1; echo prof rc $?
tail -60 $OUT/profile-prefill.log
timeout 80 python3 scripts/profile_ttft.py --tokens 128,1024 > $OUT/profile-ttft.log 2>&1; echo ttft rc $?
head -60 $OUT/profile-ttft.log
;;
probe)
python3 scripts/write_random_1b.py /tmp/llama-1b-random > $OUT/write.log 2>&1 || { tail $OUT/write.log; exit 1; }
timeout 90 python3 scripts/startup_profile.py --model /tmp/llama-1b-random --cache /tmp/cold2 > $OUT/startup-cold.log 2>&1; echo cold rc $?
grep -E "compil|slowest|ready" $OUT/startup-cold.log | head
timeout 150 python3 docs/bench/scripts/round14_ttft_breakdown.py > $OUT/ttft-breakdown.log 2>&1; echo ttft rc $?
grep tokens: $OUT/ttft-breakdown.log
NCU=/usr/local/cuda/bin/ncu
timeout 200 $NCU --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats python3 scripts/ncu_wgmma_kernels.py > $OUT/ncu.log 2>&1; echo ncu rc $?
grep -E "kernel|Duration|Throughput|Issued|Stall|Eligible|Warp Cycles|Achieved Occ|Registers" $OUT/ncu.log | head -80
TINYVLLM_TEST_GPU=1 timeout 200 python3 -m pytest -q -x tests/test_wgmma.py tests/test_prefill_wgmma.py tests/test_compile_workers.py tests/test_kernel_plan.py > $OUT/gpu-tests.log 2>&1; echo tests rc $?
tail -5 $OUT/gpu-tests.log
TINYVLLM_TEST_GPU=1 timeout 100 python3 -m pytest -q tests/test_batch_invariance.py -k wgmma > $OUT/gpu-tests-inv.log 2>&1; echo inv rc $?
tail -3 $OUT/gpu-tests-inv.log
;;
after)
python3 scripts/write_random_1b.py /tmp/llama-1b-random > $OUT/write.log 2>&1
timeout 50 python3 scripts/startup_profile.py --model /tmp/llama-1b-random --cache /tmp/cold3 > $OUT/startup-cold.log 2>&1; echo cold rc $?
timeout 25 python3 scripts/startup_profile.py --model /tmp/llama-1b-random --cache /tmp/cold3 > $OUT/startup-warm.log 2>&1; echo warm rc $?
grep -E "compil|slowest|ready" $OUT/startup-cold.log $OUT/startup-warm.log | head
TINYVLLM_TEST_GPU=1 timeout 140 python3 -m pytest -q -x tests/test_prefill_graphs.py tests/test_compile_workers.py tests/test_prefill_wgmma.py tests/test_cuda_graphs.py > $OUT/gpu-tests.log 2>&1; echo tests rc $?
tail -4 $OUT/gpu-tests.log
timeout 210 python3 -m tinyvllm.bench --random-1b /tmp/llama-1b-random --precision fast --workload latency,prefill,throughput --prefill-lens 128,1024,4096 --max-num-seqs 256 --batching continuous --compare hf --max-seconds 60 --out $OUT/bench > $OUT/bench.log 2>&1; echo bench rc $?
grep -A16 "^workload" $OUT/bench.log
timeout 45 python3 scripts/profile_prefill.py --tokens 4096,1024,128 > $OUT/profile-prefill-1seq.log 2>&1; echo prof1 rc $?
grep -E "whole graph|^  attn " $OUT/profile-prefill-1seq.log
timeout 45 python3 scripts/profile_ttft.py --tokens 128,1024,4096 > $OUT/profile-ttft.log 2>&1; echo ttft rc $?
grep -A5 "| prompt" $OUT/profile-ttft.log
timeout 40 python3 scripts/profile_prefill.py --tokens 4096,128 --max-num-seqs 256 > $OUT/profile-prefill-256.log 2>&1; echo prof256 rc $?
grep -E "whole graph|^  attn " $OUT/profile-prefill-256.log
;;
esac
