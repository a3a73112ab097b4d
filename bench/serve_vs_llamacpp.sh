#!/usr/bin/env bash
# gerbil serve against llama.cpp's llama-server on the same GGUF, the same threads and the same
# context per sequence, in one run: aggregate generation tokens/s and p50/p99 time to first
# token and inter-token latency at 1, 4, 16 and 64 concurrent streams (bench/serve_load.mjs,
# greedy, ignore_eos, max_tokens each).
#
#   bench/serve_vs_llamacpp.sh MODEL.gguf LLAMA_SERVER_BINARY [SECONDS=30] [THREADS=nproc] [MAX_TOKENS=64]
#
# llama-server is built by you, outside this repository (llama.cpp: cmake -DLLAMA_BUILD_SERVER=ON,
# target llama-server); it runs with -np N -cb -c N*CTX. Prints one JSON line per (server, streams).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: $0 MODEL.gguf LLAMA_SERVER [SECONDS] [THREADS] [MAX_TOKENS]}
LLAMA=${2:?usage: $0 MODEL.gguf LLAMA_SERVER [SECONDS] [THREADS] [MAX_TOKENS]}
SECS=${3:-30}
THREADS=${4:-$(nproc)}
MAXTOK=${5:-64}
CTX=512
GERBIL=${GERBIL:-build/gerbil}
PORT=18731
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

wait_up() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { echo "server died: $(tail -5 "$tmp/err")" >&2; return 1; }
    sleep 0.5
  done
  return 1
}

echo "# $(date -u +%FT%TZ) $(uname -n): $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); model $MODEL; threads $THREADS; ctx $CTX per sequence; $SECS s per point; max_tokens $MAXTOK"
for n in 1 4 16 64; do
  for srv in gerbil llama; do
    if [ $srv = gerbil ]; then
      "$GERBIL" serve --model "$MODEL" --port $PORT --threads "$THREADS" --ctx-size $CTX --parallel $n \
        --queue 256 >"$tmp/out" 2>"$tmp/err" &
    else
      "$LLAMA" -m "$MODEL" --port $PORT -t "$THREADS" -c $((CTX * n)) -np $n -cb --no-webui >"$tmp/out" 2>"$tmp/err" &
    fi
    pid=$!
    wait_up
    # one warm-up request, then the measured run
    node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --streams 1 --duration 1 --max-tokens 8 --json >/dev/null || true
    printf '{"server": "%s", ' $srv
    node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --streams $n --duration "$SECS" --max-tokens "$MAXTOK" \
      --prompts 64 --pid $pid --json | sed "s/^{//" || true
    kill -TERM $pid; wait $pid 2>/dev/null || true
    pid=
  done
done
