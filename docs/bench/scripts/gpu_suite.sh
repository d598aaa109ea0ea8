#!/usr/bin/env bash
# The whole test suite on the GPU: TINYVLLM_TEST_GPU=1 makes tests/conftest.py leave the CUDA simulator off.
#   bash docs/bench/scripts/gpu_suite.sh                                # every test under tests/
#   bash docs/bench/scripts/gpu_suite.sh tests/test_bench.py -k kernels # or any pytest arguments
# The full log goes to $OUT/gpu_suite.log (and $OUT/gpu_suite.xml); what is printed last is the failures, the
# slowest tests and pytest's summary line. Compiled kernels are cached under ./.gpu-cache (XDG_CACHE_HOME; ignored
# by git, kept on a warm machine), so a second call compiles nothing. SUITE_TIMEOUT (default 570 s) interrupts
# pytest before a 600 s command limit, and pytest still prints what ran; call again to go on with a warm cache,
# or run it in two halves: bash docs/bench/scripts/gpu_suite.sh tests/test_[a-m]*.py; bash docs/bench/scripts/gpu_suite.sh tests/test_[n-z]*.py
set -uo pipefail
OUT=${OUT:-out/gpu-suite}
mkdir -p "$OUT"
export TINYVLLM_TEST_GPU=1 PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/.gpu-cache}
unset NUMBA_ENABLE_CUDASIM NUMBA_CACHE_DIR TINYVLLM_KERNEL_CACHE_DIR
[ $# -gt 0 ] || set -- tests
python3 -c "from numba import cuda; d = cuda.get_current_device(); print('GPU:', d.name, d.compute_capability)" \
  || { echo "gpu_suite: no CUDA GPU visible to numba"; exit 2; }
start=$(date +%s)
timeout --signal=INT --kill-after=20 "${SUITE_TIMEOUT:-570}" python3 -m pytest -p no:cacheprovider -q -rfE \
  --durations=20 --junitxml="$OUT/gpu_suite.xml" "$@" > "$OUT/gpu_suite.log" 2>&1
rc=$?
echo "gpu_suite: pytest rc=$rc after $(( $(date +%s) - start )) s (124: interrupted by SUITE_TIMEOUT); log $OUT/gpu_suite.log"
grep -E "^(FAILED|ERROR) " "$OUT/gpu_suite.log" | head -40
sed -n '/slowest .*durations/,$p' "$OUT/gpu_suite.log" | tail -n 30
exit $rc
