#!/usr/bin/env bash
# Text in, text out, end to end on the real stories260K model and its tokenizer:
# `gerbil run "text"` must encode the prompt as the reference does and continue it
# exactly as llama2.c does; stop strings, stdin prompts and `gerbil chat` work.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
D=../shared/data/models/stories260K
if [ ! -f $D/hf/tokenizer.json ]; then echo "SKIPPED: $D absent (shared test data)"; exit 77; fi
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed to read JSON"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }

# 1. the prompt ids and the greedy continuation match llama2.c's published run
"$G" run --model $D/hf "Once upon a time" -n 60 --temperature 0 --json > "$T/run.json" 2>"$T/err"
ok $? "run --json exits 0: $(cat "$T/err")"
python3 - "$T/run.json" $D/expected/prompt_Once_upon_a_time_steps64.json <<'PY'
import json, sys
got = json.load(open(sys.argv[1])); want = json.load(open(sys.argv[2]))
p = want["prompt_ids_with_bos"]; after = want["output_ids_after_bos"]
assert got["prompt_ids"] == p, (got["prompt_ids"], p)
assert got["token_ids"] == after[len(p) - 1:], "greedy ids differ"
assert want["text"] == "Once upon a time" + got["text"], repr(got["text"])
PY
ok $? "prompt ids, greedy ids and text equal llama2.c's"

# 1b. a continuation keeps its leading space: decode(prompt + generated) minus decode(prompt),
# as llama.cpp prints it (token 286 is "▁was")
"$G" run --raw --model $D/hf "The little dog" -n 12 --temperature 0 --json > "$T/cont.json" 2>/dev/null
python3 -c "
import json,sys; j=json.load(open('$T/cont.json'))
sys.exit(0 if j['token_ids'][0] == 286 and j['text'].startswith(' was a little') else 1)"
ok $? "continuation keeps its leading space: $(head -c 120 "$T/cont.json")"
"$G" run --raw --model $D/hf "The little dog" -n 12 --temperature 0 > "$T/cont.txt" 2>/dev/null
python3 -c "import json,sys; t=json.load(open('$T/cont.json'))['text']; s=open('$T/cont.txt').read(); sys.exit(0 if s == t + '\\n' else 1)"
ok $? "streamed continuation == --json text"

# 2. streaming text equals the JSON text
"$G" run --model $D/hf "Once upon a time" -n 60 --temperature 0 > "$T/stream.txt" 2>/dev/null
python3 -c "import json,sys; t=json.load(open('$T/run.json'))['text']; s=open('$T/stream.txt').read(); sys.exit(0 if s == t + '\n' else 1)"
ok $? "streamed text == --json text"

# 3. a stop string is matched across tokens and cut
"$G" run --model $D/hf "Once upon a time" -n 60 --temperature 0 --json --stop "named Lily" > "$T/stop.json" 2>/dev/null
python3 -c "
import json,sys; j=json.load(open('$T/stop.json'))
sys.exit(0 if j['text'] == ', there was a little girl ' and j['stop_reason'] == 'stop_string' else 1)"
ok $? "stop string cut: $(head -c 200 "$T/stop.json")"

# 4. the prompt from stdin
echo -n "Once upon a time" | "$G" run --model $D/hf - -n 60 --temperature 0 --json > "$T/stdin.json" 2>/dev/null
python3 -c "import json,sys; a=json.load(open('$T/run.json')); b=json.load(open('$T/stdin.json')); sys.exit(0 if a['token_ids']==b['token_ids'] else 1)"
ok $? "stdin prompt"

# 4b. the GGUF copy carries its tokenizer in the metadata: the same prompt ids and text
"$G" run --model $D/gguf/stories260K-f32.gguf "Once upon a time" -n 60 --temperature 0 --json > "$T/gguf.json" 2>"$T/err"
python3 -c "
import json,sys; a=json.load(open('$T/run.json')); b=json.load(open('$T/gguf.json'))
sys.exit(0 if a['prompt_ids']==b['prompt_ids'] and a['token_ids']==b['token_ids'] and a['text']==b['text'] else 1)"
ok $? "gguf: run \"text\" equals the HF folder's ($(cat "$T/err"))"

# 5. chat: a template beside the model; answers stream; /reset forgets the conversation
mkdir -p "$T/m" && cp $D/hf/* "$T/m/" && chmod u+w "$T/m"/*
printf '%s' '{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}{% if add_generation_prompt %}Once upon a time{% endif %}' > "$T/m/chat_template.jinja"
printf 'hello\nagain\n/reset\nhello\n' | "$G" chat --model "$T/m" -n 8 --temperature 0 > "$T/chat.out" 2>"$T/chat.err"
ok $? "chat exits 0: $(cat "$T/chat.err")"
lines=$(grep -c . "$T/chat.out")
first=$(sed -n 1p "$T/chat.out"); third=$(sed -n 3p "$T/chat.out")
[ "$lines" = 3 ] && [ -n "$first" ] && [ "$first" = "$third" ]; ok $? "chat: 3 answers, the one after /reset equals the first"
grep -q "conversation reset" "$T/chat.err"; ok $? "chat: /reset acknowledged"
grep -qE "\[8 tokens, [0-9.]+ tok/s\]" "$T/chat.err"; ok $? "chat: tokens/s after each answer"

# 6. chat on a model without a template says what to do
"$G" chat --model $D/hf < /dev/null > /dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "no chat template" "$T/err"; ok $? "chat without a template: clear error"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
