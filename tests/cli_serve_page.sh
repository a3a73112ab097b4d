#!/usr/bin/env bash
# The chat page of gerbil serve in a headless Chromium (tests/node/page.test.mjs): needs node,
# `npm ci --prefix tests/node` and Debian's chromium (.ci/run installs them); skipped (77) without.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GERBIL:?GERBIL must name the gerbil binary}"
[ -d ../shared/data/models/stories260K/hf ] || { echo "SKIPPED: stories260K not found"; exit 77; }
command -v node >/dev/null || { echo "SKIPPED: node is not installed"; exit 77; }
[ -d tests/node/node_modules/playwright-core ] || { echo "SKIPPED: run 'npm ci --prefix tests/node' first"; exit 77; }
command -v chromium >/dev/null || [ -n "${CHROMIUM:-}" ] || { echo "SKIPPED: no chromium (apt-get install chromium)"; exit 77; }
GERBIL="$GERBIL" SCREENSHOT="${SCREENSHOT:-$(dirname "$GERBIL")/serve-page.png}" node tests/node/page.test.mjs
