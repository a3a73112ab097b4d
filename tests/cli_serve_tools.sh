#!/usr/bin/env bash
# Structured output and tool calling in gerbil serve through the openai npm SDK
# (tests/node/tools.test.mjs: response_format validated with ajv, forced tool calls under every
# template family that defines tools, a tool result round trip). Needs node, `npm ci --prefix
# tests/node` and tests/grammar-node's ajv (.ci/run installs both); skipped (77) without them.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GERBIL:?GERBIL must name the gerbil binary}"
[ -d ../shared/data/models/stories260K/hf ] || { echo "SKIPPED: stories260K not found"; exit 77; }
command -v node >/dev/null || { echo "SKIPPED: node is not installed"; exit 77; }
[ -d tests/node/node_modules/openai ] || { echo "SKIPPED: run 'npm ci --prefix tests/node' first"; exit 77; }
[ -d tests/grammar-node/node_modules/ajv ] || { echo "SKIPPED: run 'npm ci' in tests/grammar-node first"; exit 77; }
GERBIL="$GERBIL" node tests/node/tools.test.mjs
