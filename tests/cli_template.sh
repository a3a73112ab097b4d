#!/usr/bin/env bash
# gerbil template: renders identical to Python jinja2 set up as transformers sets it up
# (expectations from scripts/gen_template_expected.py), exit codes and messages.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
TOK=../shared/data/tokenizers
TD=tests/templates
[ -d "$TOK/qwen3" ] || { echo "SKIPPED: $TOK absent"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0

# same NAME EXPECTED_FILE ARGS...: exit 0 and stdout byte-identical to EXPECTED_FILE
same() {
    local name=$1 want=$2; shift 2
    "$G" template "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -eq 0 ] && cmp -s "$T/out" "$want"; then pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; cmp "$T/out" "$want" | head -2; head -3 "$T/err"; fi
}
# fails NAME PATTERN ARGS...: non-zero exit (not a signal), stderr matching PATTERN
fails() {
    local name=$1 pat=$2; shift 2
    "$G" template "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pat" "$T/err"; then pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; head -3 "$T/err"; fi
}

same qwen3_tools_nothink "$TD/cli_qwen3.txt" --model "$TOK/qwen3" --messages "$TD/cli_messages.json" \
    --tools "$TD/cli_tools.json" --add-generation-prompt --var enable_thinking=false
echo '[{"role": "user", "content": "Hello!"}]' >"$T/user.json"
same gemma3_plain "$TD/cli_gemma3.txt" --model "$TOK/gemma3" --messages "$T/user.json"
same llama31_override "$TD/cli_llama31.txt" --model "$TOK/llama3" --template "$TD/meta-llama-Llama-3.1-8B-Instruct.jinja" \
    --messages "$TD/cli_messages.json" --tools "$TD/cli_tools.json" --add-generation-prompt --var date_string='"26 Jul 2024"'
same gemma4_tools "$TD/cli_gemma4.txt" --model "$TOK/gemma3" --template "$TD/google-gemma-4-31B-it.jinja" \
    --messages "$TD/cli_messages.json" --tools "$TD/cli_tools.json" --add-generation-prompt
fails raise_exception 'Conversation roles must alternate' --model "$TOK/gemma3" --messages "$TD/cli_bad_messages.json"
fails no_template 'no chat template' --model "$TOK/llama2_spm" --messages "$T/user.json"
fails bad_var 'JSON' --model "$TOK/qwen3" --messages "$T/user.json" --var enable_thinking=nope
fails bad_var_form 'NAME=JSON' --model "$TOK/qwen3" --messages "$T/user.json" --var enable_thinking
fails missing_messages 'messages' --model "$TOK/qwen3"
fails missing_file "cannot read messages" --model "$TOK/qwen3" --messages "$T/nope.json"
echo '{"role": "user"}' >"$T/obj.json"
fails messages_object 'array' --model "$TOK/qwen3" --messages "$T/obj.json"
echo '{{ x' >"$T/bad.jinja"
fails syntax_error 'template line 1' --template "$T/bad.jinja" --messages "$T/user.json"
fails unknown_option 'unknown option' --model "$TOK/qwen3" --messages "$T/user.json" --frob
"$G" template --help | grep -q -- '--add-generation-prompt' && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: help"; }

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
