#!/usr/bin/env bash
# `gerbil chat` without a terminal (messages on stdin), on the real stories260K model with
# a chat template beside it: the /commands (/help lists them, /bye and /exit quit, unknown
# ones are said and not sent), chat MODEL, template-less models refused before their
# weights load, and a conversation that outgrows a small --ctx-size: answers cut by the
# context are said, the oldest turns dropped (the system message kept), failed turns
# never kept. (tests/cli_tty.sh drives chat through a pseudo-terminal.)
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
D=../shared/data/models/stories260K
if [ ! -f $D/hf/tokenizer.json ]; then echo "SKIPPED: $D absent (shared test data)"; exit 77; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }

# the model with a template: every message on a line, then a story start; the template
# raises when the system message is missing or when any message is "boom"
mkdir -p "$T/m" && cp $D/hf/* "$T/m/" && chmod u+w "$T/m"/*
cat > "$T/m/chat_template.jinja" <<'EOF'
{% if messages[0].role != 'system' %}{{ raise_exception('the system message is gone') }}{% endif %}
{% for m in messages %}{% if m.content == 'boom' %}{{ raise_exception('boom refused') }}{% endif %}{{ m.content }}
{% endfor %}{% if add_generation_prompt %}Once upon a time{% endif %}
EOF
C=("$G" chat "$T/m" --system "A story." --temperature 0)

# 1. /help lists the chat commands (not the program's usage); unknown commands are said and
# not sent; a path is a message; /bye quits (what follows is not read)
printf 'hello\n/help\n/frob\n/usr/bin is a folder\n/bye\nnever sent\n' | "${C[@]}" -n 6 > "$T/out" 2>"$T/err"
ok $? "chat exits 0: $(cat "$T/err")"
grep -q "/bye, /exit" "$T/out" && grep -q "/reset" "$T/out" && ! grep -q "usage:" "$T/out"; ok $? "/help lists the chat commands"
grep -q "unknown command /frob; /help lists them" "$T/err"; ok $? "/frob: unknown command"
[ "$(grep -c '^\[6 tokens' "$T/err")" = 2 ]; ok $? "two answers: hello and the path, not /frob nor after /bye"
printf 'hello\n/exit\nnever sent\n' | "${C[@]}" -n 6 > /dev/null 2>"$T/err"
[ "$(grep -c '^\[6 tokens' "$T/err")" = 1 ]; ok $? "/exit quits"

# 2. template-less models are refused before the weights load (these weights cannot load)
mkdir -p "$T/broken" && cp $D/hf/*.json "$T/broken/" && head -c 1000 $D/hf/model.safetensors > "$T/broken/model.safetensors"
"$G" chat "$T/broken" </dev/null >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "has no chat template; give one with --chat-template FILE" "$T/err" && ! grep -q safetensors "$T/err"
ok $? "chat without a template: refused before the load ($rc: $(cat "$T/err"))"
echo hello | "$G" chat $D/hf --chat-template "$T/m/chat_template.jinja" --system "A story." -n 6 --temperature 0 >"$T/out" 2>"$T/err"
[ $? = 0 ] && grep -q '^\[6 tokens' "$T/err"; ok $? "chat --chat-template FILE on a template-less folder: $(cat "$T/err")"

# 3. a failed turn is not kept: "boom" makes the template raise; if it stayed in the
# history every later turn would fail too. The answers equal a conversation without it.
printf 'hello\nboom\nagain\nmore\n' | "${C[@]}" -n 8 > "$T/boom.out" 2>"$T/boom.err"
printf 'hello\nagain\nmore\n' | "${C[@]}" -n 8 > "$T/clean.out" 2>/dev/null
grep -q "boom refused" "$T/boom.err" && grep -q "not kept" "$T/boom.err" &&
    [ "$(grep -c '^\[8 tokens' "$T/boom.err")" = 3 ] && cmp -s "$T/boom.out" "$T/clean.out"
ok $? "a failed turn is not kept: $(head -5 "$T/boom.err")"

# 4. a conversation longer than the context (64 tokens): answers cut are said, the oldest
# turns go with the system message kept (the template raises without it), every turn answered
printf 'hello there\nsecond message\nthird one\nfourth\nfifth\nsixth\n' | "${C[@]}" --ctx-size 64 -n 60 > "$T/ctx.out" 2>"$T/ctx.err"
ok $? "small context: exit 0"
grep -q "cut: the context is full" "$T/ctx.err" && grep -q "the answer was cut at the end of the context of 64 tokens" "$T/ctx.err"
ok $? "a cut answer is said"
grep -q "dropped the oldest 1 turn, the system prompt kept; /reset starts over" "$T/ctx.err"; ok $? "oldest turns dropped, said, /reset named"
! grep -q "system message is gone\|not kept\|does not fit\|failed" "$T/ctx.err"; ok $? "no turn failed: $(grep -m2 'gone\|kept\|fit\|failed' "$T/ctx.err")"
[ "$(grep -c '^\[[0-9]* tokens' "$T/ctx.err")" = 6 ] && [ "$(grep -c . "$T/ctx.out")" = 6 ]; ok $? "six turns, six answers"
# a message longer than the whole context is refused and not kept; the chat goes on
long=$(printf 'word %.0s' $(seq 1 80))
printf 'hello\n%s\nagain\n' "$long" | "${C[@]}" --ctx-size 64 -n 8 > "$T/long.out" 2>"$T/long.err"
printf 'hello\nagain\n' | "${C[@]}" --ctx-size 64 -n 8 > "$T/short.out" 2>/dev/null
grep -q "this message does not fit the context" "$T/long.err" && cmp -s "$T/long.out" "$T/short.out"
ok $? "a message longer than the context: refused, not kept ($(grep -m1 fit "$T/long.err"))"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
