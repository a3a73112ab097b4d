#!/usr/bin/env bash
# Speculative decoding on the command line (issue 22), on the real stories260K model (its GGUF
# f32 conversion as the draft) and a golden hybrid fixture: `run --spec ngram|draft` prints the
# text of the plain greedy run, `--ids ... --json` the same token_ids, with the acceptance in
# "timings"; a seeded sampled run is reproducible; `chat --spec` answers as plain chat turn for
# turn; `bench --spec` reports the speed-up and that the tokens are the same; bad flags
# (dflash, --spec draft without --draft, another vocabulary, --draft-min > --draft-max) fail
# with a message before the weights load (exit 2) or at it (exit 1).
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
D=../shared/data/models/stories260K
M=$D/hf
DR=$D/gguf/stories260K-f32.gguf
H=tests/fixtures/qwen35-f32
if [ ! -f $M/tokenizer.json ] || [ ! -f $DR ]; then echo "SKIPPED: $D absent (shared test data)"; exit 77; fi
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed to read JSON"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }
jget() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
P="Once upon a time, there was a little girl. Once upon a time, there was a little"

# 1. text: the same text as plain greedy, for each drafter and draft lengths
"$G" run --model $M --raw "$P" -n 80 --temperature 0 -q > "$T/plain" 2>/dev/null; ok $? "plain run"
for a in "--spec ngram" "--spec ngram --draft-max 8 --draft-min 8" "--spec draft --draft $DR" "--draft $DR --draft-max 3"; do
    "$G" run --model $M --raw "$P" -n 80 --temperature 0 -q $a > "$T/spec" 2>"$T/err"
    ok $? "run $a: $(head -c 300 "$T/err")"
    cmp -s "$T/plain" "$T/spec"; ok $? "run $a prints the plain run's text"
done

# 2. --ids --json: token_ids equal plain's; timings carry the speculative counters
"$G" run --model $M --ids 1,403,407,261,378,1,403,407,261 -n 60 --temperature 0 --json > "$T/p.json" 2>/dev/null
ok $? "plain --ids --json"
for a in "--spec ngram" "--spec draft --draft $DR"; do
    "$G" run --model $M --ids 1,403,407,261,378,1,403,407,261 -n 60 --temperature 0 --json $a > "$T/s.json" 2>"$T/err"
    ok $? "--ids --json $a: $(head -c 300 "$T/err")"
    [ "$(jget "$T/p.json" "j['token_ids']")" = "$(jget "$T/s.json" "j['token_ids']")" ]; ok $? "$a: token_ids equal plain's"
    jget "$T/s.json" "j['timings']['spec_verify_steps'] > 0 and 0 <= j['timings']['spec_acceptance_rate'] <= 1 and j['timings']['spec_tokens_per_verify'] >= 1" | grep -q True
    ok $? "$a: timings have verify steps, the acceptance rate and tokens per verify step"
done
"$G" run --model $M --ids 1,403,407 -n 30 --temperature 0 --json --draft $M > "$T/s.json" 2>/dev/null
[ "$(jget "$T/s.json" "j['timings']['spec_acceptance_rate']")" = 1.0 ]; ok $? "draft = the model: every draft accepted"

# 3. a hybrid (Gated DeltaNet: state restored and replayed on rejection), ngram and a draft of another format
"$G" run --model $H --ids 5,9,5,9,5,9,12 -n 60 --temperature 0 --ignore-eos --json > "$T/hp.json" 2>/dev/null; ok $? "hybrid plain"
for a in "--spec ngram" "--draft tests/fixtures/qwen35-bf16" "--draft tests/fixtures/qwen35-mlx4 --draft-max 7"; do
    "$G" run --model $H --ids 5,9,5,9,5,9,12 -n 60 --temperature 0 --ignore-eos --json $a > "$T/hs.json" 2>"$T/err"
    ok $? "hybrid $a: $(head -c 300 "$T/err")"
    [ "$(jget "$T/hp.json" "j['token_ids']")" = "$(jget "$T/hs.json" "j['token_ids']")" ]; ok $? "hybrid $a: token_ids equal plain's"
done

# 4. sampled: a seed reproduces the speculative run
for k in 1 2; do
    "$G" run --model $M --raw "$P" -n 40 --temperature 0.8 --seed 7 -q --draft $DR > "$T/samp$k" 2>/dev/null
done
cmp -s "$T/samp1" "$T/samp2" && [ -s "$T/samp1" ]; ok $? "a seeded speculative sampled run is reproducible"

# 5. chat: two turns with --spec answer as plain chat
mkdir -p "$T/m" && cp $M/* "$T/m/" && chmod u+w "$T/m"/*
cat > "$T/m/chat_template.jinja" <<'EOF'
{% for m in messages %}{{ m.content }}
{% endfor %}{% if add_generation_prompt %}Once upon a time{% endif %}
EOF
printf 'Lily had a cat.\nThe cat was big.\n' | "$G" chat "$T/m" --temperature 0 -n 40 -q > "$T/c0" 2>/dev/null; ok $? "plain chat"
for a in "--spec ngram" "--draft $DR"; do
    printf 'Lily had a cat.\nThe cat was big.\n' | "$G" chat "$T/m" --temperature 0 -n 40 -q $a > "$T/c1" 2>"$T/err"
    ok $? "chat $a: $(head -c 300 "$T/err")"
    cmp -s "$T/c0" "$T/c1"; ok $? "chat $a answers as plain chat"
done

# 6. bench --spec: the speed-up, the acceptance and the same tokens
"$G" bench --model $M -p 16 -n 48 -r 1 --spec draft --draft $DR --json > "$T/b.json" 2>"$T/err"; ok $? "bench --spec: $(head -c 300 "$T/err")"
jget "$T/b.json" "j['spec_same_tokens'] and j['spec_speedup'] > 0 and j['spec_acceptance_rate'] > 0.5 and j['spec'] == 'draft'" | grep -q True
ok $? "bench --spec --json: speed-up, acceptance, the same tokens"
"$G" bench --model $M -p 16 -n 32 -r 1 --spec ngram > "$T/b.txt" 2>&1
grep -q "tg32 ngram" "$T/b.txt" && grep -q "the same tokens" "$T/b.txt"; ok $? "bench --spec table row and summary"

# 7. bad flags
"$G" run --model $M --ids 1,2 --spec dflash > /dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "not yet implemented" "$T/err"; ok $? "--spec dflash: not yet implemented ($rc)"
"$G" run --model $M --ids 1,2 --spec draft > /dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "needs --draft MODEL" "$T/err"; ok $? "--spec draft without --draft ($rc)"
"$G" run --model $M --ids 1,2 --spec bogus > /dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "expected ngram, draft or dflash" "$T/err"; ok $? "--spec bogus ($rc)"
"$G" run --model $M --ids 1,2 --spec ngram --draft-max 3 --draft-min 4 > /dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "exceeds --draft-max" "$T/err"; ok $? "--draft-min > --draft-max ($rc)"
"$G" run --model $M --ids 1,2 --spec ngram --draft-max 33 > /dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ]; ok $? "--draft-max 33 out of range ($rc)"
"$G" run --model $M --ids 1,2 --draft-max 4 > /dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "need --spec" "$T/err"; ok $? "--draft-max without --spec ($rc)"
"$G" run --model $M --ids 1,2 --draft $H > /dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "vocabulary has 256 tokens, the model's 512" "$T/err"; ok $? "a draft of another vocabulary ($rc: $(head -c 200 "$T/err"))"
"$G" run --model $M --ids 1,2 --draft "$T/none" > /dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "draft model" "$T/err"; ok $? "a missing draft model is named ($rc)"
"$G" run --model $M "$P" --spec ngram --regex 'a+' > /dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "does not combine" "$T/err"; ok $? "--spec with a constraint ($rc)"
"$G" run --help | grep -q -- "--draft-max K"; ok $? "run --help lists the speculative flags"
"$G" chat --help | grep -q -- "--spec ngram|draft|dflash"; ok $? "chat --help lists them"
"$G" bench --help | grep -q -- "--spec ngram|draft"; ok $? "bench --help lists them"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
