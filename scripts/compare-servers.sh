#!/usr/bin/env bash
# Developer-only (never in CI): this crate's OpenAI server (examples/serve)
# beside llama.cpp's (llama-cpp-python[server] in the cached peer venv) on
# the default model, same machine, one run: for each concurrency level the
# load generator runs against ours, then against llama.cpp's, so both see
# the same machine state. Prints the markdown rows of docs/performance.md.
#
# Usage: scripts/compare-servers.sh [CONCURRENCY,..] [MAX_TOKENS] [REQUESTS_PER_CLIENT]
# Env:   THREADS (default 2): llama.cpp's n_threads and MLX_BACKEND_THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."

LEVELS="${1:-1,8,32,64}"
MAX_TOKENS="${2:-64}"
PER_CLIENT="${3:-2}"
THREADS="${THREADS:-2}"
OURS_PORT=18080
PEER_PORT=18081

VENV="$(bash scripts/llama-cpp-venv.sh)"
"$VENV/bin/python" -m pip install --quiet uvicorn fastapi sse-starlette starlette-context pydantic-settings >&2
MODEL="$(bash scripts/fetch-default-model.sh)"
cargo build --release --example serve --example loadgen >&2
BIN=target/release/examples

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

MLX_BACKEND_THREADS="$THREADS" "$BIN/serve" --model "$MODEL" --port "$OURS_PORT" >/tmp/compare-ours.log 2>&1 &
pids+=($!)
"$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --host 127.0.0.1 --port "$PEER_PORT" \
  --n_threads "$THREADS" --n_ctx 8192 --interrupt_requests False >/tmp/compare-llama.log 2>&1 &
pids+=($!)

for port in "$OURS_PORT" "$PEER_PORT"; do
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
    sleep 1
  done
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null || { echo "server on $port did not start" >&2; exit 1; }
done

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "command: scripts/compare-servers.sh $LEVELS $MAX_TOKENS $PER_CLIENT (THREADS=$THREADS)"
header=1
IFS=',' read -ra levels <<<"$LEVELS"
for c in "${levels[@]}"; do
  for side in ours llama.cpp; do
    port=$OURS_PORT; [[ $side == llama.cpp ]] && port=$PEER_PORT
    out="$("$BIN/loadgen" --url "http://127.0.0.1:$port" --concurrency "$c" \
      --max-tokens "$MAX_TOKENS" --requests-per-client "$PER_CLIENT" --label "$side")"
    if [[ $header == 1 ]]; then echo "$out" | head -2; header=0; fi
    echo "$out" | tail -n +3
  done
done
