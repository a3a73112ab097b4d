#!/usr/bin/env bash
# gerbil serve against a real client: the openai npm SDK (tests/node/serve.test.mjs). Needs
# node and `npm ci --prefix tests/node` (.ci/run does both); skipped (77) without them.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GERBIL:?GERBIL must name the gerbil binary}"
[ -d ../shared/data/models/stories260K/hf ] || { echo "SKIPPED: stories260K not found"; exit 77; }
command -v node >/dev/null || { echo "SKIPPED: node is not installed"; exit 77; }
[ -d tests/node/node_modules/openai ] || { echo "SKIPPED: run 'npm ci --prefix tests/node' first"; exit 77; }
GERBIL="$GERBIL" node tests/node/serve.test.mjs
