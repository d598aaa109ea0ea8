#!/usr/bin/env bash
# tinyvllm eval on the H200 (issue 14, items 4 and 5). Run after GPU.md's preamble (the numpy wheel and
# PYTHONPATH=/tmp/site:$PWD), from the repository root, one case per GPU call (each takes up to ~10 minutes):
#   bash docs/bench/scripts/eval_bench_h200.sh compare-smollm2   # item 4: tinyvllm vs HF float32, same questions/prompts
#   bash docs/bench/scripts/eval_bench_h200.sh compare-1b
#   bash docs/bench/scripts/eval_bench_h200.sh bench-smollm2     # item 5: full MMLU 0-shot vs HF bf16; 5-shot caching
#   bash docs/bench/scripts/eval_bench_h200.sh bench-1b
# Models:
#   SmolLM2-135M-Instruct: $SMOLLM2, a .gguf or an HF directory (default /tmp/smollm2.gguf, joined from
#     .gguf/smollm2.part.* when those were carried: the file is 98 MB, over one call's 64 MiB carry; see
#     docs/gguf.md for carrying it in two parts over two warm calls; the `gguf` wheel must be in .whl).
#     tinyvllm and HF transformers (its own GGUF reader, goldens/hf_gguf.py) both read the .gguf; the HF
#     weights are rounded to bf16, the values tinyvllm computes with.
#   the random Llama-3.2-1B-shaped model: /tmp/llama-1b-random, written if missing, with Meta's Llama 3 tokenizer
#     when llama-models is importable, else SmolLM2's tokenizer from the GGUF (its ids fit the 128k
#     vocabulary), else a placeholder word-level one (speed only: every word is one token).
# Logs and results go to $OUT (or ./out). Each run prints a markdown table last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
SMOLLM2=${SMOLLM2:-/tmp/smollm2.gguf}
RANDOM_1B=/tmp/llama-1b-random

prepare_smollm2() {
  if [ ! -e "$SMOLLM2" ] && ls .gguf/smollm2.part.* >/dev/null 2>&1; then
    cat .gguf/smollm2.part.* > "$SMOLLM2"
  fi
  [ -e "$SMOLLM2" ] || { echo "no SmolLM2 at $SMOLLM2: skipping it"; return 1; }
}

prepare_random_1b() {
  python3 - "$RANDOM_1B" "$SMOLLM2" <<'PY'
import json, sys
from pathlib import Path
from tinyvllm.model.fixtures.random_model import write_llama3_tokenizer_if_available, prepare_random_model
from tinyvllm.model.gguf import GGUFModelFiles, find_gguf_file
out, smol = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
if not (out / "tokenizer.json").is_file() and not write_llama3_tokenizer_if_available(out, 128256):
    gguf = find_gguf_file(smol) if smol.exists() else None
    if gguf is not None:
        files = GGUFModelFiles.read(gguf)
        files.tokenizer()
        for name, obj in (("tokenizer.json", files.tokenizer_json), ("tokenizer_config.json", files.tokenizer_config)):
            (out / name).write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
        print("random 1B: SmolLM2's tokenizer")
prepare_random_model(out)
PY
}

compare() {  # item 4
  local name=$1 model=$2 limit=$3
  python3 scripts/eval_compare_hf.py --model "$model" --tasks mmlu,gpqa_diamond --limit "$limit" \
    --out "$OUT/eval-compare-$name" > "$OUT/eval-compare-$name.log" 2>&1
  echo "eval_compare_hf $name rc=$?"; grep -E "^\|| differ|PASS|FAIL|Error|error" "$OUT/eval-compare-$name.log" | tail -20
}

bench() {  # item 5
  local name=$1 model=$2; shift 2
  python3 scripts/eval_bench.py --model "$model" --out "$OUT/eval-bench-$name" "$@" \
    > "$OUT/eval-bench-$name.log" 2>&1
  echo "eval_bench $name rc=$?"; grep -vE "^\[|^mmlu \(" "$OUT/eval-bench-$name.log" | tail -12
}

case "${1:-}" in
  compare-smollm2) prepare_smollm2 && compare smollm2 "$SMOLLM2" 1000 ;;
  compare-1b) prepare_random_1b && compare random-1b "$RANDOM_1B" 300 ;;
  bench-smollm2) prepare_smollm2 && bench smollm2 "$SMOLLM2" --fewshot-limit 3000 ;;
  bench-1b) prepare_random_1b && bench random-1b "$RANDOM_1B" --fewshot-limit 1000 --max-seconds 200 ;;
  *) echo "usage: bash $0 compare-smollm2 | compare-1b | bench-smollm2 | bench-1b"; exit 2 ;;
esac
