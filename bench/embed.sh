#!/usr/bin/env bash
# Embedding throughput: texts/s for 128-token texts through `gerbil embed` on a Qwen3-Embedding-0.6B-shaped
# model (Qwen3Model, last-token pooling, normalised; random bf16 weights from bench_make_model, the real
# Qwen3 tokenizer). texts/s = (N - 1) / (t(N texts) - t(1 text)), so loading is not counted.
# Usage: bash bench/embed.sh [BUILD_DIR]   (N=64 THREADS="1 2" by default; not part of CI)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
N="${N:-64}"
THREADS="${THREADS:-1 2}"
SRC="${MODEL_DIR:-/tmp/gerbil-bench/qwen3-0.6b-bf16}"
TOK=../shared/data/tokenizers/qwen3
[ -f $TOK/tokenizer.json ] || { echo "embed.sh: $TOK not found" >&2; exit 1; }
if [ ! -f "$SRC/model.safetensors" ]; then
    echo "== creating $SRC (random bf16 weights, ~1.2 GB)" >&2
    "$BUILD/bench_make_model" "$SRC" --shape qwen3-0.6b --dtype bf16 --seed 1
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
M="$W/qwen3-embedding-0.6b"
mkdir "$M"
ln -s "$(realpath "$SRC/model.safetensors")" "$M/model.safetensors"
sed 's/"Qwen3ForCausalLM"/"Qwen3Model"/' "$SRC/config.json" >"$M/config.json"
ln -s "$(realpath $TOK/tokenizer.json)" "$M/tokenizer.json"
ln -s "$(realpath $TOK/tokenizer_config.json)" "$M/tokenizer_config.json"
# 127 tokens of text (" word N" pieces) + the <|endoftext|> gerbil appends = 128
python3 - "$W" "$N" <<'EOF'
import sys
w, n = sys.argv[1], int(sys.argv[2])
with open(f"{w}/texts.txt", "w") as f:
    for i in range(n):
        f.write("".join(f" w{(i * 7 + k) % 10}" for k in range(127 // 2)) + " end\n")
head = open(f"{w}/texts.txt").readline().rstrip("\n")
open(f"{w}/one.txt", "w").write(head + "\n")
EOF
NT=$("$BUILD/gerbil" tokenize --model "$M" "$(head -1 "$W/texts.txt")" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["ids"]) + 1)')
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== Qwen3-Embedding-0.6B shape (bf16, random), $NT tokens per text, N=$N"
for t in $THREADS; do
    # the peer, in the same command: plain prefill of one 128-token prompt on the same weights (causal LM)
    "$BUILD/gerbil" bench --model "$SRC" -p "$NT" -n 1 -r 2 --threads "$t" 2>/dev/null | grep -E "^\| *[0-9]|pp" | head -3
    s0=$(date +%s.%N); "$BUILD/gerbil" embed --model "$M" --threads "$t" - <"$W/one.txt" >/dev/null; s1=$(date +%s.%N)
    "$BUILD/gerbil" embed --model "$M" --threads "$t" - <"$W/texts.txt" >/dev/null; s2=$(date +%s.%N)
    python3 -c "import sys; a,b,c,n,t,nt=map(float,sys.argv[1:]); d=(c-b)-(b-a); print(f'threads {int(t)}: {(n-1)/d:.2f} texts/s ({(n-1)*nt/d:.0f} tokens/s; 1 text {b-a:.2f} s, {int(n)} texts {c-b:.2f} s)')" "$s0" "$s1" "$s2" "$N" "$t" "$NT"
done
