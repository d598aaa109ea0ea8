#!/usr/bin/env bash
# `tinyvllm serve` measured from outside (`tinyvllm bench --base-url`), beside the offline engine, on the random
# Llama-3.2-1B-shaped model ($MODEL, default /tmp/llama-1b-random) with the same engine options.
#   bash scripts/serve_bench.sh               (~5 min on the H200, never more than 8; logs and results under $OUT)
#   DRY_RUN=1 bash scripts/serve_bench.sh     (the simulator, the demo model, tiny sizes: checks the script)
#   python scripts/gpu.py bench serve         (the same, from the GPU entry point)
# 1. offline: tinyvllm bench --workload throughput --batching continuous (256 requests, prompt and output U[100,1024])
# 2. tinyvllm serve (same engine options) in the background; tinyvllm bench --base-url --workload throughput sends
#    the very same 256 requests, streamed, all at once (request rate inf), after a warm-up burst; --check-greedy
#    then runs offline LLM.generate on them and compares every served token id
# 3. tinyvllm bench --base-url --workload serving: Poisson arrivals at $RATE req/s ($SERVING_N requests)
# Pass: HTTP / offline output tok/s >= 0.9, 0 failed requests, every greedy output identical, server exit 0 on
# SIGTERM. The last lines printed are the summary (also $OUT/summary.json).
# The server needs fastapi, starlette, uvicorn, h11, click, pydantic, pydantic-core, annotated-types,
# typing-inspection, prometheus-client, and the client httpx, httpcore, anyio, sniffio, idna, certifi: wheels for
# Python 3.12 in ./gpuwheels, installed like ./.whl (this script installs them into /tmp/site if they do not import).
set -uo pipefail
OUT=${OUT:-out/serve-bench}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/.gpu-cache}
START=$(date +%s); DEADLINE=$(( START + ${BUDGET_S:-460} ))
cap() { local left=$(( DEADLINE - $(date +%s) )); echo $(( $1 < left ? $1 : (left > 1 ? left : 1) )); }
log() { echo "[$(( $(date +%s) - START )) s] $*"; }

if ! python3 -c "import fastapi, uvicorn, httpx, pydantic, prometheus_client" 2>/dev/null; then
  [ -d gpuwheels ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site gpuwheels/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-$PWD}
  python3 -c "import fastapi, uvicorn, httpx, pydantic, prometheus_client" \
    || { echo "serve_bench: the server's packages do not import (see the header for the wheels)"; exit 2; }
fi

if [ "${DRY_RUN:-0}" = 1 ]; then
  export NUMBA_ENABLE_CUDASIM=1
  MODEL_ARGS=()  # the demo model
  SIZES=(--num-requests 4 --serving-requests "${SERVING_N:-3}" --min-len 4 --max-len 8 --min-output-len 2 --max-output-len 3)
  ENGINE=(--max-num-seqs 4 --max-num-batched-tokens 64 --block-size 4 --num-blocks 64 --max-model-len 16)
  RATE=${RATE:-2}; RUN_S=200; MIN_RATIO=0  # the simulator's ratio means nothing
else
  MODEL=${MODEL:-/tmp/llama-1b-random}
  python3 -c "from pathlib import Path; from tinyvllm.bench import prepare_random_model; prepare_random_model(Path('$MODEL'))" \
    > "$OUT/random_model.log" 2>&1 || { echo "serve_bench: writing the random model failed"; tail "$OUT/random_model.log"; exit 1; }
  MODEL_ARGS=(--model "$MODEL")
  SIZES=(--num-requests 256 --serving-requests "${SERVING_N:-200}" --min-len 100 --max-len 1024)
  ENGINE=(--max-num-seqs 256 --max-num-batched-tokens 8192 --block-size 16 --max-model-len 2048)
  RATE=${RATE:-4}; RUN_S=120; MIN_RATIO=0.9
fi

log "1. offline throughput"
timeout "$(cap 200)" python3 -m tinyvllm.bench "${MODEL_ARGS[@]}" --workload throughput --batching continuous \
  "${SIZES[@]}" "${ENGINE[@]}" --max-seconds "$RUN_S" --no-plot --out "$OUT/offline" > "$OUT/offline.log" 2>&1
log "offline bench rc=$?"; grep -E "output tok/s|requests done|captured|warm-up" "$OUT/offline.log" | tail -4

log "2. tinyvllm serve"
PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
URL=http://127.0.0.1:$PORT
python3 -m tinyvllm.cli serve "${MODEL_ARGS[@]}" "${ENGINE[@]}" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -9 $SERVER 2>/dev/null' EXIT
python3 - "$URL" "$(cap 150)" <<'EOF' || { log "the server did not come up"; tail -20 "$OUT/serve.log"; exit 1; }
import sys, time, httpx
url, limit = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        if httpx.get(url + "/health", timeout=5).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
sys.exit(1)
EOF
log "server up on $URL"

log "3. the same throughput workload over HTTP, then --check-greedy"
timeout "$(cap 300)" python3 -m tinyvllm.bench --base-url "$URL" "${MODEL_ARGS[@]}" --workload throughput \
  "${SIZES[@]}" "${ENGINE[@]}" --check-greedy --max-seconds "$RUN_S" --no-plot --out "$OUT/http-throughput" \
  > "$OUT/http-throughput.log" 2>&1
log "http throughput rc=$?"; grep -E "warm-up|ok,|check-greedy" "$OUT/http-throughput.log" | tail -4

log "4. Poisson arrivals at $RATE req/s over HTTP"
timeout "$(cap 150)" python3 -m tinyvllm.bench --base-url "$URL" "${MODEL_ARGS[@]}" --workload serving \
  --request-rate "$RATE" "${SIZES[@]}" "${ENGINE[@]}" --no-warmup --max-seconds "$RUN_S" --no-plot \
  --out "$OUT/http-poisson" > "$OUT/http-poisson.log" 2>&1
log "http poisson rc=$?"

python3 -c "import httpx; print(httpx.get('$URL/metrics', timeout=10).text)" > "$OUT/metrics.txt" 2>&1
kill -TERM $SERVER; timeout "$(cap 60)" tail --pid=$SERVER -f /dev/null || kill -9 $SERVER; wait $SERVER; SERVER_RC=$?
trap - EXIT
log "server exit status after SIGTERM: $SERVER_RC"; tail -3 "$OUT/serve.log"

python3 - "$OUT" "$SERVER_RC" "$MIN_RATIO" <<'EOF'
import json, sys
from pathlib import Path
out, server_rc, min_ratio = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def rows(name):
    try:
        return json.loads((out / name / "bench.json").read_text())["results"]
    except (OSError, ValueError) as e:
        print(f"{name}: no report ({e})")
        return []
offline = next((r for r in rows("offline") if r["workload"] == "throughput"), None)
http = next(iter(rows("http-throughput")), None)
poisson = next(iter(rows("http-poisson")), None)
s = {"server_exit_status": server_rc}
if offline and http:
    g = http.get("greedy_check", {})
    s.update(offline_output_tok_s=offline["output_tok_s"], http_output_tok_s=http["output_tok_s"],
             http_over_offline=http["output_tok_s"] / offline["output_tok_s"], offline_done=offline["num_finished"],
             http_ok=http["num_finished"], http_failed=http["num_errored"], requests=http["num_requests"],
             greedy_identical=g.get("identical"), greedy_compared=g.get("compared"),
             http_ttft_median_ms=http["median_ttft_ms"], http_peak_concurrency=http["max_concurrent_requests"])
if poisson:
    s.update({f"poisson_{k}": poisson[k] for k in ("request_rate", "num_finished", "num_errored", "output_tok_s",
                                                    "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms",
                                                    "median_e2el_ms", "p99_e2el_ms")})
ok = bool(offline and http and poisson) and s.get("http_over_offline", 0) >= min_ratio and s.get("http_failed") == 0 \
    and s.get("http_ok") == s.get("requests") and s.get("greedy_identical") == s.get("requests") \
    and poisson["num_errored"] == 0 and server_rc == 0
s["pass"] = ok
(out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
print(f"---- summary (target: HTTP/offline >= {min_ratio:g}, 0 failed, greedy all identical, server exit 0) ----")
for k, v in s.items():
    print(f"{k:<26}{v:.4g}" if isinstance(v, float) else f"{k:<26}{v}")
sys.exit(0 if ok else 1)
EOF
RC=$?
# The device tool brings back a few files per call: everything in one archive beside the summary and key logs.
tar czf /tmp/serve-bench-all.tgz -C "$OUT" . && mv /tmp/serve-bench-all.tgz "$OUT"/
log "done, rc=$RC"
exit $RC
