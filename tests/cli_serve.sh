#!/usr/bin/env bash
# gerbil serve against a real client: the openai npm SDK (tests/node/serve.test.mjs), then a
# 10-second load run (bench/serve_load.mjs). Needs
# node and `npm ci --prefix tests/node` (.ci/run does both); skipped (77) without them.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GERBIL:?GERBIL must name the gerbil binary}"
[ -d ../shared/data/models/stories260K/hf ] || { echo "SKIPPED: stories260K not found"; exit 77; }
command -v node >/dev/null || { echo "SKIPPED: node is not installed"; exit 77; }
[ -d tests/node/node_modules/openai ] || { echo "SKIPPED: run 'npm ci --prefix tests/node' first"; exit 77; }
GERBIL="$GERBIL" node tests/node/serve.test.mjs
TMPDIR_SERVE=$(mktemp -d)
# a short load run: 16 streaming clients for 10 s, every stream equal to its solo greedy run, no
# errors, no request left running and every KV block free at the end (bench/serve_load.mjs)
"$GERBIL" serve --model ../shared/data/models/stories260K/hf --port 0 --parallel 16 >"$TMPDIR_SERVE/out" 2>"$TMPDIR_SERVE/err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; rm -rf "$TMPDIR_SERVE"' EXIT
for _ in $(seq 100); do grep -q 'listening on' "$TMPDIR_SERVE/out" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*' "$TMPDIR_SERVE/out")
node bench/serve_load.mjs --url "$url" --streams 16 --duration 10 --max-tokens 48 --check --pid $pid --json
kill -TERM $pid
wait $pid
trap 'rm -rf "$TMPDIR_SERVE"' EXIT
