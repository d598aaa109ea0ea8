#!/usr/bin/env bash
# lm-evaluation-harness against `tinyvllm serve` on a GPU with SmolLM2-135M-Instruct:
# scripts/lm_eval_check.py --limit 200, the same questions scored by `tinyvllm eval` and by
# `lm_eval --model local-completions` through the server; PASS when answers, accuracy and scores agree.
#
# The GPU image has no registry and lacks lm-eval and part of what it needs (datasets, evaluate, pytablewriter,
# sqlitedict, ...; it has torch, transformers, pyarrow, pandas, aiohttp, scikit-learn, sacrebleu). Two steps:
#   here, once (any machine with pip and PyPI):   bash scripts/lm_eval_gpu.sh prepare [DIR]
#       downloads those wheels (pure Python, ~13 MB) into DIR (default gpuwheels/lmeval, keep it out of git);
#   on the GPU, carrying DIR and .whl (GPU.md):   bash scripts/lm_eval_gpu.sh run [DIR]
#       installs them (and .whl's numpy) into /tmp/site, converts /tmp/gg/smol.gguf (or $SMOLLM2) with
#       `tinyvllm convert`, runs the check, prints a summary; logs and results under $OUT (or ./out).
set -uo pipefail
WHEELS=${2:-gpuwheels/lmeval}
LM_EVAL_WHEELS=(lm-eval==0.4.13 datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19
  pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 tabledata==1.3.5
  tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1 pytz==2026.6 nltk==3.10.4 more-itertools==11.2.1
  tenacity==9.2.1 gguf==0.19.0)   # gguf: `tinyvllm convert` (the image has numpy, pyyaml, requests, tqdm)
SDIST_ONLY=(sqlitedict==2.1.0 word2number==1.1 rouge-score==0.1.2)   # built here into py3-none-any wheels

prepare() {
  mkdir -p "$WHEELS"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${LM_EVAL_WHEELS[@]}" || exit 1
  python3 -m pip wheel -q --no-deps -w "$WHEELS" "${SDIST_ONLY[@]}" || exit 1
  ls -1 "$WHEELS"; du -sh "$WHEELS"
}

run() {
  OUT=${OUT:-out}; mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore HF_HOME=/tmp/hf HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
  local pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site)
  # two installs: a wheel in both folders (gguf) would stop a single one ("double requirement")
  if ls .whl/*.whl >/dev/null 2>&1; then "${pip[@]}" .whl/*.whl || exit 1; fi
  "${pip[@]}" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  python3 -c "import pyarrow, fsspec, datasets, lm_eval; print('pyarrow', pyarrow.__version__, 'fsspec',
fsspec.__version__, 'datasets', datasets.__version__, 'lm_eval imports')" || {
    echo "lm-eval does not import with this image's packages (datasets 5.2 wants pyarrow >= 24, fsspec <= 2026.9)"; exit 1; }
  local gguf=${SMOLLM2:-/tmp/gg/smol.gguf} model=/tmp/smollm2-hf
  [ -e "$gguf" ] || { echo "no SmolLM2 GGUF at $gguf"; exit 1; }
  if [ ! -f "$model/config.json" ]; then
    python3 -m tinyvllm.cli convert "$gguf" "$model" > "$OUT/lm-eval-convert.log" 2>&1 \
      || { tail -5 "$OUT/lm-eval-convert.log"; exit 1; }
  fi
  local start=$SECONDS
  python3 scripts/lm_eval_check.py --model "$model" --limit "${LIMIT:-200}" --out "$OUT/lm-eval-check" \
    --score-tol 2e-2 --margin 5e-3 --serve-args "--gpu-memory-fraction 0.3" > "$OUT/lm-eval-check.log" 2>&1
  local rc=$?
  echo "lm_eval_check rc=$rc in $((SECONDS - start)) s (log: $OUT/lm-eval-check.log)"
  grep -E "^\|" "$OUT/lm-eval-check.log" | tail -4       # lm-eval's own table
  grep -E "^  accuracy|prompt tok/s" "$OUT/lm-eval-check.log" | head -2   # tinyvllm eval's summary
  [ -f "$OUT/lm-eval-check/lm_eval_check.json" ] && cat "$OUT/lm-eval-check/lm_eval_check.json"
  tail -1 "$OUT/lm-eval-check.log"
  return $rc
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash $0 prepare [DIR]   (here)  |  bash $0 run [DIR]   (on the GPU)"; exit 2 ;;
esac
