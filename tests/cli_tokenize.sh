#!/usr/bin/env bash
# gerbil tokenize: encode / decode through the command line, stdin, JSON escaping, errors.
# Expected ids are Hugging Face tokenizers' (see tests/tokenizer/expected.json).
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
Q=../shared/data/tokenizers/qwen3
GM=../shared/data/tokenizers/gemma3
S=../shared/data/models/stories260K/hf
[ -f $Q/tokenizer.json ] || { echo "SKIPPED: $Q not found"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0

check() { # NAME EXPECTED-STDOUT CMD...: exit 0 and exactly this output
    local name=$1 want=$2; shift 2
    local got; got=$("$@" 2>"$T/err"); local rc=$?
    if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; echo "  got:  $got"; echo "  want: $want"; sed 's/^/  stderr: /' "$T/err" | head -3; fi
}
expect_fail() { # NAME RC PATTERN CMD...
    local name=$1 want_rc=$2 pat=$3; shift 3
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -eq "$want_rc" ] && grep -qE -- "$pat" "$T/err"; then pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; sed 's/^/  stderr: /' "$T/err" | head -3; fi
}

# qwen3 (byte-level BPE, 11 MB): encode paths
check "encode" '{"ids": [9707, 1879]}' "$G" tokenize --model $Q "Hello world"
check "special inline" '{"ids": [151644, 872, 198, 6023, 151645]}' "$G" tokenize --model $Q $'<|im_start|>user\nhi<|im_end|>'
check "stdin" '{"ids": [9707, 1879]}' bash -c "printf 'Hello world' | '$G' tokenize --model $Q -"
check "decode skip special" '{"text": "user\nhi"}' "$G" tokenize --model $Q --decode 151644,872,198,6023,151645 --skip-special
[ -f $GM/tokenizer.json ] && check "gemma --special adds <bos>" '{"ids": [2, 9259, 1902]}' "$G" tokenize --model $GM --special "Hello world"

# stories260K (tiny SentencePiece-style BPE): the rest, cheap to load
if [ -f $S/tokenizer.json ]; then
    check "folder load = AutoTokenizer" '{"ids": [1, 346, 306, 414, 263, 304, 341]}' "$G" tokenize --model $S --special "Hello world"
    check "file load = tokenizers" '{"ids": [1, 410, 346, 306, 414, 263, 304, 341]}' "$G" tokenize --model $S/tokenizer.json --special " Hello world"
    check "empty" '{"ids": []}' "$G" tokenize --model $S ""
    check "decode" '{"text": "<s> Hell</s>"}' "$G" tokenize --model $S --decode 1,346,306,2
    check "decode skip special" '{"text": "Hell"}' "$G" tokenize --model $S --decode 1,346,306,2 --skip-special
    check "decode escapes" '{"text": "a\"b\\\n\t"}' "$G" tokenize --model $S --decode 100,37,101,95,13,12
    check "decode NUL" '{"text": "\u0000"}' "$G" tokenize --model $S --decode 3
    "$G" tokenize --help | grep -q "usage: gerbil tokenize" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: help text"; }
    expect_fail "no model" 2 "--model is required" "$G" tokenize "x"
    expect_fail "no text" 2 "TEXT" "$G" tokenize --model $S
    expect_fail "bad ids" 2 "comma-separated" "$G" tokenize --model $S --decode 1,x
    expect_fail "id out of range" 2 "outside the vocabulary" "$G" tokenize --model $S --decode 99999999
    expect_fail "unknown flag" 2 'unknown option "--frob"' "$G" tokenize --model $S --frob x
fi
expect_fail "missing model" 1 "no such file" "$G" tokenize --model /nonexistent "x"
printf '{"model": {"type": "Nope"}}' > "$T/tokenizer.json"
expect_fail "unknown model type" 1 'unknown model type "Nope"' "$G" tokenize --model "$T" "x"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
