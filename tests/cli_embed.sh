#!/usr/bin/env bash
# gerbil embed: the JSON contract, input order, stdin, --prompt-name, --dimensions, and the errors.
# The numbers themselves are checked against sentence-transformers by tests/test_embed.c; here the
# command line must give what the library gives (TEXT arguments = stdin lines = one by one).
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
GM=../shared/data/tokenizers/gemma3
Q=../shared/data/tokenizers/qwen3
[ -f $GM/tokenizer.json ] && [ -f $Q/tokenizer.json ] || { echo "SKIPPED: ../shared/data/tokenizers not found"; exit 77; }
command -v python3 >/dev/null || { echo "SKIPPED: python3 not found"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if "$@"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $*"; fi; }
expect_fail() { # NAME RC PATTERN CMD...
    local name=$1 want_rc=$2 pat=$3; shift 3
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -eq "$want_rc" ] && grep -qE -- "$pat" "$T/err"; then pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; sed 's/^/  stderr: /' "$T/err" | head -3; fi
}
for f in embed-gemma3-f32 embed-qwen3-mlx4; do tar xzf tests/fixtures/$f.tar.gz -C "$T"; done
for t in tokenizer.json tokenizer_config.json; do
    ln -s "$(realpath $GM/$t)" "$T/embed-gemma3-f32/$t"
    ln -s "$(realpath $Q/$t)" "$T/embed-qwen3-mlx4/$t"
done
M=$T/embed-qwen3-mlx4   # the lighter tokenizer: every check loads it

"$G" embed --model "$M" "Hello world" "Ünïcödé: café 🙂" "a" >"$T/args.json" 2>"$T/err"; ok test $? -eq 0
printf 'Hello world\r\nÜnïcödé: café 🙂\na\n' | "$G" embed --model "$M" - >"$T/stdin.json" 2>>"$T/err"; ok test $? -eq 0
"$G" embed --model "$M" a >"$T/one.json" 2>>"$T/err"; ok test $? -eq 0
"$G" embed --model "$M" --dimensions 8 --prompt-name query "Hello world" >"$T/d8.json" 2>>"$T/err"; ok test $? -eq 0
"$G" embed --model "$M" --prompt $'Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:' "Hello world" >"$T/p.json" 2>>"$T/err"; ok test $? -eq 0
"$G" embed --model "$M" --prompt-name query "Hello world" >"$T/pn.json" 2>>"$T/err"; ok test $? -eq 0
"$G" embed --model "$T/embed-gemma3-f32" "Hello world" >"$T/q.json" 2>>"$T/err"; ok test $? -eq 0
sed 's/^/  stderr: /' "$T/err" | head -5
python3 - "$T" "$M" <<'EOF' || fail=$((fail+1))
import json, math, sys
T, M = sys.argv[1], sys.argv[2]
L = lambda n: json.load(open(f"{T}/{n}.json"))
a, s, one, d8, p, pn, q = (L(n) for n in ("args", "stdin", "one", "d8", "p", "pn", "q"))
assert list(a) == ["model", "dim", "embeddings"], list(a)
assert a["model"] == M and a["dim"] == 32 and len(a["embeddings"]) == 3, (a["model"], a["dim"])
assert all(len(e) == 32 for e in a["embeddings"])
assert a == s, "stdin lines differ from TEXT arguments"
assert one["embeddings"][0] == a["embeddings"][2], "a batch differs from one by one"
for e in a["embeddings"]:
    assert abs(sum(x * x for x in e) - 1) < 1e-5, "not normalised"
assert d8["dim"] == 8 and abs(sum(x * x for x in d8["embeddings"][0]) - 1) < 1e-5
full = pn["embeddings"][0][:8]; nrm = math.sqrt(sum(x * x for x in full))
assert max(abs(x / nrm - y) for x, y in zip(full, d8["embeddings"][0])) < 1e-6, "dimensions is not truncate + renormalise"
assert p["embeddings"] == pn["embeddings"], "--prompt TEXT differs from the same prompt by name"
assert pn["embeddings"] != a["embeddings"][:1], "the prompt changed nothing"
assert q["dim"] == 24 and len(q["embeddings"]) == 1  # EmbeddingGemma shape: two Dense to 24
print("json checks passed")
EOF
pass=$((pass+1))

expect_fail "unknown prompt name" 2 'unknown prompt name "nope".*query' "$G" embed --model "$M" --prompt-name nope x
expect_fail "dimensions too large" 2 'dimensions 33 is out of range.*32' "$G" embed --model "$M" --dimensions 33 x
expect_fail "dimensions zero" 2 'dimensions' "$G" embed --model "$M" --dimensions 0 x
expect_fail "no text" 2 'TEXT' "$G" embed --model "$M"
expect_fail "text and stdin" 2 'not both' "$G" embed --model "$M" x -
expect_fail "unknown flag" 2 'unknown option' "$G" embed --model "$M" --frobnicate x
expect_fail "empty stdin" 2 'no lines' bash -c "printf '' | '$G' embed --model '$M' -"
mkdir "$T/causal" && cp tests/fixtures/qwen3-f32/config.json tests/fixtures/qwen3-f32/model.safetensors "$T/causal/" &&
    ln -s "$(realpath $Q/tokenizer.json)" "$T/causal/tokenizer.json"
expect_fail "not an embedding model" 1 'not an embedding model' "$G" embed --model "$T/causal" x
expect_fail "run refuses an embedding model" 1 'embedding model' "$G" run --model "$M" hi
"$G" embed --help | grep -q -- '--prompt-name' && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: --help"; }

# POST /v1/embeddings through the openai SDK (when node and tests/node/node_modules are there)
S=../shared/data/models/stories260K/hf
if command -v node >/dev/null && [ -d tests/node/node_modules/openai ] && [ -d $S ]; then
    "$G" embed --model "$M" "Hello world" "a" >"$T/hw.json"
    if GERBIL="$G" node tests/node/embed.test.mjs "$M" $S "$T/hw.json"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: embed.test.mjs"; fi
else
    echo "(node, tests/node/node_modules or stories260K absent: the openai SDK check is skipped)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
