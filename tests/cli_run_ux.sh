#!/usr/bin/env bash
# `gerbil run` as Ollama and llama.cpp users expect it (issue 24), on the real stories260K
# model: a random seed by default (--seed -1), printed and reusable; MODEL "prompt";
# -f FILE; --chat-template FILE; the raw-prompt warning; numeric flags checked before the
# weights load; --flag=value and -n5; "did you mean"; GERBIL_MODEL named in errors;
# "pass the folder"; -q/-v; version forms; the template of a GGUF seen by `template`.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
D=../shared/data/models/stories260K
M=$D/hf
if [ ! -f $M/tokenizer.json ]; then echo "SKIPPED: $D absent (shared test data)"; exit 77; fi
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed to read JSON"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }
# jget FILE EXPR: a field of a JSON file, printed by python (j is the object)
jget() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
P="Once upon a time"

# a model folder whose weights cannot load: what is checked before the load must fail first
mkdir -p "$T/broken" && cp $M/*.json "$T/broken/" && head -c 1000 $M/model.safetensors > "$T/broken/model.safetensors"
"$G" run --model "$T/broken" "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "model.safetensors" "$T/err"; ok $? "the broken folder fails at the load ($rc: $(head -c 200 "$T/err"))"

# 1. the seed: random by default and with --seed -1, printed by --json and -v, reusable
for k in 1 2 3; do "$G" run --model $M "$P" -n 24 --temperature 1 --json > "$T/r$k.json" 2>/dev/null; done
"$G" run --model $M "$P" -n 24 --temperature 1 --seed -1 --json > "$T/r4.json" 2>/dev/null
python3 - "$T"/r1.json "$T"/r2.json "$T"/r3.json "$T"/r4.json <<'PY'
import json, sys
js = [json.load(open(f)) for f in sys.argv[1:]]
seeds = [j["seed"] for j in js]
assert all(isinstance(s, int) and s >= 0 for s in seeds), seeds
assert len(set(seeds)) == 4, seeds
assert len({tuple(j["token_ids"]) for j in js}) >= 2, "four random seeds, one text"
PY
ok $? "no --seed and --seed -1: four different seeds and texts"
s1=$(jget "$T/r1.json" 'j["seed"]')
"$G" run --model $M "$P" -n 24 --temperature 1 --seed "$s1" --json > "$T/again.json" 2>/dev/null
[ "$(jget "$T/r1.json" 'j["token_ids"]')" = "$(jget "$T/again.json" 'j["token_ids"]')" ]
ok $? "the printed seed reproduces the random run"
"$G" run --model $M "$P" -n 24 --temperature 1 --seed 42 --json > "$T/s42a.json" 2>/dev/null
"$G" run --model $M "$P" -n 24 --temperature 1 --seed 42 --json > "$T/s42b.json" 2>/dev/null
[ "$(jget "$T/s42a.json" 'j["seed"], j["token_ids"]')" = "$(jget "$T/s42b.json" 'j["seed"], j["token_ids"]')" ] &&
    [ "$(jget "$T/s42a.json" 'j["seed"]')" = 42 ]; ok $? "--seed 42 twice: the same tokens, seed 42 printed"
"$G" run --model $M "$P" -n 4 --temperature 1 -v --json > "$T/v.json" 2>"$T/v.err"
grep -q "seed $(jget "$T/v.json" 'j["seed"]')\$" "$T/v.err"; ok $? "-v names the seed used: $(cat "$T/v.err")"
"$G" run --model $M "$P" --seed -2 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--seed: expected an integer >= 0, or -1" "$T/err"; ok $? "--seed -2 refused ($rc)"

# 2. MODEL "prompt": a folder, a .gguf file, a repo id; the same as --model
"$G" run --model $M "$P" -n 30 --temperature 0 --json > "$T/ref.json" 2>/dev/null
"$G" run $M "$P" -n 30 --temperature 0 --json > "$T/pos.json" 2>/dev/null
[ "$(jget "$T/ref.json" 'j["token_ids"]')" = "$(jget "$T/pos.json" 'j["token_ids"]')" ]; ok $? "run FOLDER \"prompt\""
"$G" run $D/gguf/stories260K-f32.gguf "$P" -n 30 --temperature 0 --json > "$T/posg.json" 2>/dev/null
[ "$(jget "$T/ref.json" 'j["token_ids"]')" = "$(jget "$T/posg.json" 'j["token_ids"]')" ]; ok $? "run FILE.gguf \"prompt\""
mkdir -p "$T/cache"
HF_HUB_OFFLINE=1 HF_HUB_CACHE="$T/cache" "$G" run no-such-org/no-such-model "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "no-such-org/no-such-model" "$T/err" && ! grep -q "more than one prompt" "$T/err"
ok $? "run org/name \"prompt\" resolves org/name as the model ($rc: $(head -c 200 "$T/err"))"
"$G" run "hello there" "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "more than one prompt" "$T/err"; ok $? "two prompts, the first no model: refused"
"$G" run --model $M $M "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "more than one prompt" "$T/err"; ok $? "--model and a positional model: refused"
"$G" run $M >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "no prompt after the model" "$T/err"; ok $? "run FOLDER alone: no prompt ($(cat "$T/err"))"
"$G" run $M --ids 1,403,407 -n 3 --temperature 0 > "$T/ids.out" 2>/dev/null; ok $? "run FOLDER --ids"

# 3. -f FILE and stdin: one trailing newline dropped, the same prompt as the argument
printf '%s\n' "$P" > "$T/p.txt"
"$G" run --model $M -f "$T/p.txt" -n 30 --temperature 0 --json > "$T/f.json" 2>/dev/null
[ "$(jget "$T/ref.json" 'j["prompt_ids"], j["token_ids"]')" = "$(jget "$T/f.json" 'j["prompt_ids"], j["token_ids"]')" ]
ok $? "-f FILE: the prompt ids and tokens of the argument"
echo "$P" | "$G" run --model $M - -n 30 --temperature 0 --json > "$T/in.json" 2>/dev/null
[ "$(jget "$T/ref.json" 'j["prompt_ids"]')" = "$(jget "$T/in.json" 'j["prompt_ids"]')" ]
ok $? "stdin's trailing newline stripped: $(jget "$T/in.json" 'j["prompt_ids"]')"
"$G" run $M -f "$T/nope.txt" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "cannot read $T/nope.txt" "$T/err"; ok $? "-f missing file: named"
"$G" run --model $M -f "$T/p.txt" "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "give one prompt" "$T/err"; ok $? "-f and a text prompt: refused"

# 4. --chat-template FILE, and the warning when the prompt goes raw
printf 'Q: {{ messages[0].content }}\nA:' > "$T/qa.jinja"
"$G" run --model $M --chat-template "$T/qa.jinja" hi -n 4 --temperature 0 --json > "$T/ct.json" 2>"$T/ct.err"
"$G" tokenize --model $M "$(printf 'Q: hi\nA:')" > "$T/ct.ids"
[ "$(jget "$T/ct.json" 'j["prompt_ids"]')" = "$(jget "$T/ct.ids" 'j["ids"]')" ] && ! grep -q "no chat template" "$T/ct.err"
ok $? "--chat-template FILE renders the prompt: $(jget "$T/ct.json" 'j["prompt_ids"]')"
"$G" run --model $D/gguf/stories260K-f32.gguf --chat-template "$T/qa.jinja" hi -n 4 --temperature 0 --json > "$T/ctg.json" 2>/dev/null
[ "$(jget "$T/ct.json" 'j["prompt_ids"]')" = "$(jget "$T/ctg.json" 'j["prompt_ids"]')" ]; ok $? "--chat-template FILE on a GGUF"
"$G" run --model $M --chat-template "$T/nope.jinja" hi >/dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "chat-template: cannot read" "$T/err"; ok $? "--chat-template missing file: named"
"$G" run --model $M "$P" -n 2 >/dev/null 2>"$T/err"
grep -q "has no chat template, so the prompt is sent as is" "$T/err"; ok $? "warning: no template, raw prompt"
"$G" run --model $M "$P" -n 2 --raw >/dev/null 2>"$T/err"
! grep -q "no chat template" "$T/err"; ok $? "--raw: no warning"

# 5. numeric flags checked before the weights load: exit 2 and the flag named
for f in "--top-p 2" "--top-p 0" "--temperature -1" "--min-p 1.5" "--repeat-penalty 0" "-n -3" "--ctx-size 0" \
         "--threads 0" "--top-k x"; do
    "$G" run --model "$T/broken" "$P" $f >/dev/null 2>"$T/err"; rc=$?
    [ $rc = 2 ] && grep -q -- "${f%% *}" "$T/err" && ! grep -q "safetensors" "$T/err"; ok $? "$f: exit 2 before the load ($rc: $(cat "$T/err"))"
done
"$G" chat --model "$T/broken" --top-p 2 </dev/null >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q -- "top-p must be in (0, 1]" "$T/err"; ok $? "chat --top-p 2: exit 2 ($rc)"

# 6. --model=X, --temperature=0, -n5; a value given to a flag taking none; did you mean
"$G" run --model=$M "$P" -n5 --temperature=0 --json > "$T/eq.json" 2>/dev/null
python3 -c "
import json,sys; a=json.load(open('$T/ref.json')); b=json.load(open('$T/eq.json'))
sys.exit(0 if b['token_ids'] == a['token_ids'][:5] else 1)"; ok $? "--model=X -n5 --temperature=0"
"$G" run --model $M "$P" --json=1 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "option --json takes no value" "$T/err"; ok $? "--json=1: takes no value"
"$G" run --model $M "$P" --temprature 0 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q 'unknown option "--temprature"; did you mean --temperature?' "$T/err"; ok $? "did you mean --temperature"
"$G" run --model $M "$P" --max-token 3 >/dev/null 2>"$T/err"
grep -q "did you mean --max-tokens?" "$T/err"; ok $? "did you mean --max-tokens"
"$G" chat --model $M --sytem x </dev/null >/dev/null 2>"$T/err"
grep -q "did you mean --system?" "$T/err"; ok $? "chat: did you mean --system"
"$G" chta >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q 'unknown command "chta"; did you mean chat?' "$T/err"; ok $? "did you mean chat"

# 7. where the model came from, files of a folder
GERBIL_MODEL="$T/nope" "$G" run "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q 'GERBIL_MODEL' "$T/err"; ok $? "GERBIL_MODEL named in the error ($(cat "$T/err"))"
GERBIL_MODEL="$T/broken" "$G" run "$P" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q 'GERBIL_MODEL' "$T/err"; ok $? "GERBIL_MODEL named in a load error"
for f in config.json model.safetensors; do
    "$G" run --model $M/$f "$P" >/dev/null 2>"$T/err"; rc=$?
    [ $rc = 1 ] && grep -q "pass the folder: --model $M\$" "$T/err"; ok $? "--model .../$f: pass the folder ($(cat "$T/err"))"
done

# 8. -q, stats after a newline, warnings for --threads and --ctx-size
"$G" run --model $M "$P" -n 5 --temperature 0 > "$T/out" 2>"$T/err"
[ "$(tail -c 1 "$T/out" | od -An -c | tr -d ' ')" = '\n' ] && grep -q "^\[prompt: 5 tokens" "$T/err"
ok $? "the text ends with a newline, the stats line on stderr"
"$G" run --model $M "$P" -n 5 --temperature 0 -q > "$T/out" 2>"$T/err"
[ ! -s "$T/err" ] && [ -s "$T/out" ]; ok $? "-q: nothing on stderr ($(cat "$T/err"))"
n_cpu=$(getconf _NPROCESSORS_ONLN)
"$G" run --model $M "$P" -n 1 --raw --threads $((n_cpu + 1)) >/dev/null 2>"$T/err"
grep -q "warning: --threads $((n_cpu + 1)) exceeds the $n_cpu CPUs" "$T/err"; ok $? "--threads over the CPUs: warned"
"$G" run --model $M "$P" -n 1 --raw --threads $n_cpu >/dev/null 2>"$T/err"
! grep -q "warning: --threads" "$T/err"; ok $? "--threads = the CPUs: no warning"
"$G" run --model $M "$P" -n 1 --raw --threads $((n_cpu + 1)) -q >/dev/null 2>"$T/err"
[ ! -s "$T/err" ]; ok $? "-q: no warning either ($(cat "$T/err"))"
"$G" run --model $M "$P" -n 1 --raw --ctx-size 1024 >/dev/null 2>"$T/err"
grep -q "warning: --ctx-size 1024 exceeds the 512 tokens the model was trained on" "$T/err"; ok $? "--ctx-size over training: warned"

# 9. version forms agree
a=$("$G" --version); b=$("$G" version); c=$("$G" -v)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; ok $? "--version, version, -v: \"$a\" \"$b\" \"$c\""

# 10. `template` reads a GGUF's tokenizer.chat_template as run does (phi-3's vocabulary file has one)
V=../shared/data/tokenizers/llamacpp_vocab_tests/ggml-vocab-phi-3.gguf
if [ -f $V ]; then
    echo '[{"role": "user", "content": "hi"}]' > "$T/m.json"
    "$G" template --model $V --messages "$T/m.json" --add-generation-prompt > "$T/tpl.out" 2>"$T/err"
    grep -q "<|assistant|>" "$T/tpl.out"; ok $? "template on a GGUF with a template: $(cat "$T/tpl.out" "$T/err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
