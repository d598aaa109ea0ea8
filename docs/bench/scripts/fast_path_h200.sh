python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
# Issue 15, the fast path (--precision fast) on one H200, in one call of under 8 minutes (carry [".whl"], and the
# SmolLM2 GGUF as /tmp/gg/smol.gguf or as .gguf/smollm2.part.* pieces, see docs/gguf.md):
#   bash docs/bench/scripts/fast_path_h200.sh [compare|bench|all]      logs under $OUT (or ./out); a short summary last
# 1. scripts/fast_path_compare.py on the random Llama-3.2-1B-shaped model and on SmolLM2: the fast path against HF
#    transformers bf16, beside HF bf16's own spread from HF float32, per stage and in greedy tokens;
# 2. tinyvllm bench --precision fast --compare hf: prefill TTFT at 1,024 and 4,096 tokens and the nano-vllm
#    256-request workload (continuous batching, max-num-seqs 256), HF beside it in the same run.
# Pass: both compare runs end "Result: PASS"; the bench prints its table (targets: prefill 4096 <= 40 ms, 1024
# <= 15 ms; throughput >= 15,000 output tok/s and >= 15x HF; HF's throughput run is cut at --max-seconds 60, its
# rate is over what it finished).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
MODEL=/tmp/llama-1b-random
SMOLLM2=${SMOLLM2:-/tmp/gg/smol.gguf}
WHAT=${1:-all}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.log" 2>&1
python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
  > "$OUT/random_model.log" 2>&1 || { echo "random model failed"; tail "$OUT/random_model.log"; exit 1; }
if [ ! -e "$SMOLLM2" ] && ls .gguf/smollm2.part.* >/dev/null 2>&1; then
  mkdir -p "$(dirname "$SMOLLM2")" && cat .gguf/smollm2.part.* > "$SMOLLM2"
fi

if [ "$WHAT" != bench ]; then
  timeout 170 python3 scripts/fast_path_compare.py --model random-1b --model-dir "$MODEL" --out "$OUT" \
    > "$OUT/fast_path_compare-random-1b.log" 2>&1
  echo "== fast_path_compare random-1b: rc=$?"; grep -E "^\| |^Result" "$OUT/fast_path_compare-random-1b.log" | tail -30
  if [ -e "$SMOLLM2" ]; then
    timeout 110 python3 scripts/fast_path_compare.py --model "$SMOLLM2" --out "$OUT" > "$OUT/fast_path_compare-smollm2.log" 2>&1
    echo "== fast_path_compare SmolLM2: rc=$?"; grep -E "^\| |^Result" "$OUT/fast_path_compare-smollm2.log" | tail -30
  else
    echo "== no SmolLM2 GGUF at $SMOLLM2: its comparison skipped"
  fi
fi
if [ "$WHAT" != compare ]; then
  timeout 280 python3 -m tinyvllm.bench --random-1b "$MODEL" --precision fast --compare hf --workload prefill,throughput \
    --prefill-lens 1024,4096 --prefill-repeats 3 --max-num-seqs 256 --batching continuous --max-seconds 60 \
    --out "$OUT/bench-fast" > "$OUT/bench-fast.log" 2>&1
  echo "== bench --precision fast --compare hf: rc=$?"
  grep -E "precision|stopped" "$OUT/bench-fast.log" | head -6
  grep -vE "^\[|^kernels" "$OUT/bench-fast.log" | tail -30
fi
