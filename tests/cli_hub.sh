#!/usr/bin/env bash
# Models by name: gerbil pull / list / rm and repo ids in --model, against a local
# stand-in for the Hugging Face hub (scripts/hub_server.py), never the network.
# Serves a copy of stories260K as the repo tiny/stories and checks: a full pull that
# run/info/tokenize then use; resume after a dropped connection (HTTP Range); checksum
# failures; 401/403/404 messages; HF_HUB_OFFLINE; a cache written in the
# huggingface_hub layout by this script; two pulls at once; GGUF choice; disk full;
# list and rm.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
S=../shared/data/models/stories260K
if [ ! -f $S/hf/model.safetensors ] || [ ! -f $S/gguf/stories260K-f32.gguf ]; then
    echo "SKIPPED: $S absent (shared test data)"; exit 77
fi
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed for the hub stand-in"; exit 77; }
T=$(mktemp -d)
SERVER_PID=
trap '[ -n "$SERVER_PID" ] && kill $SERVER_PID 2>/dev/null; rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }
# expect_fail NAME PATTERN CMD...: exit status 1..127 and stderr matching PATTERN
expect_fail() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pat" "$T/err" && ! grep -qE "Sanitizer|runtime error" "$T/err"; then
        pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; sed 's/^/  stderr: /' "$T/err" | head -5; fi
}

# the repos the stand-in serves
R=$T/root
mkdir -p $R/tiny/stories $R/tiny/gated $R/tiny/gguf $R/tiny/docs
cp $S/hf/config.json $S/hf/generation_config.json $S/hf/model.safetensors $S/hf/tokenizer.json \
   $S/hf/tokenizer_config.json $S/hf/special_tokens_map.json $R/tiny/stories/
echo "# not needed by gerbil" > $R/tiny/stories/README.md
mkdir -p $R/tiny/stories/onnx && echo junk > $R/tiny/stories/onnx/model.onnx
cp $S/hf/config.json $S/hf/model.safetensors $R/tiny/gated/
echo secret > $R/tiny/gated/.token
cp $S/gguf/stories260K-f32.gguf $R/tiny/gguf/stories-Q4_K_M.gguf
cp $S/gguf/stories260K-f32.gguf $R/tiny/gguf/stories-Q8_0.gguf
echo "# docs only" > $R/tiny/docs/README.md
# the default model's repo id, holding the Qwen3.5 MLX 4-bit fixture (mlx-lm layout)
mkdir -p "$R/mlx-community/Qwen3.5-0.8B-4bit"
cp tests/fixtures/qwen35-mlx4/* "$R/mlx-community/Qwen3.5-0.8B-4bit/"
chmod -R u+w $R

python3 scripts/hub_server.py $R --port-file $T/port --log $T/log --mode-file $T/mode &
SERVER_PID=$!
for _ in $(seq 300); do [ -f $T/port ] && break; sleep 0.1; done  # a loaded CI machine starts python slowly
[ -f $T/port ] || { echo "FAIL: the hub stand-in did not start"; exit 1; }
export HF_ENDPOINT=http://127.0.0.1:$(cat $T/port) HF_HUB_CACHE=$T/cache
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_HUB_OFFLINE GERBIL_MODEL
export HF_TOKEN_PATH=$T/no-saved-token  # a token saved by `hf auth login` must not leak in
mode() { echo "$1" > $T/mode; }
CLOSED=http://127.0.0.1:9  # nothing listens there: any network use fails
SNAP=$T/cache/models--tiny--stories/snapshots/$(python3 -c "import hashlib; print(hashlib.sha1(b'tiny/stories').hexdigest())")
cmp_repo() { # every file gerbil fetched equals the served one
    for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json special_tokens_map.json; do
        cmp -s "$SNAP/$f" "$R/tiny/stories/$f" || return 1
    done
}

# --help
for c in pull list rm; do
    "$G" $c --help > $T/out 2>&1; grep -q "usage: gerbil $c" $T/out; ok $? "$c --help"
done

# 1. a full pull: only what gerbil needs, verified, laid out as huggingface_hub does
"$G" pull tiny/stories > $T/out 2> $T/err
ok $? "pull exits 0: $(cat $T/err)"
[ "$(cat $T/out)" = "$SNAP" ]; ok $? "pull prints the snapshot path ($(cat $T/out))"
grep -q "pulling tiny/stories@main (commit [0-9a-f]\{12\}): 6 files, 1.0 MiB" $T/err; ok $? "pull says what and how big: $(head -1 $T/err)"
cmp_repo; ok $? "pulled files equal the served ones"
[ ! -e "$SNAP/README.md" ] && [ ! -e "$SNAP/onnx" ]; ok $? "files gerbil does not need are not fetched"
[ "$(readlink $SNAP/model.safetensors)" = "../../blobs/$(sha256sum $R/tiny/stories/model.safetensors | cut -c1-64)" ]
ok $? "safetensors linked to blobs/SHA256 (relative)"
[ "$(readlink $SNAP/config.json)" = "../../blobs/$(git hash-object $R/tiny/stories/config.json 2>/dev/null || python3 -c "
import hashlib,sys; d=open(sys.argv[1],'rb').read(); print(hashlib.sha1(b'blob %d\0' % len(d) + d).hexdigest())" $R/tiny/stories/config.json)" ]
ok $? "small files linked to blobs/GIT-BLOB-SHA1"
[ "$(cat $T/cache/models--tiny--stories/refs/main)" = "$(basename $SNAP)" ]; ok $? "refs/main holds the commit"

# 2. the repo id works wherever a model does, from the cache, without the network
HF_ENDPOINT=$CLOSED "$G" info tiny/stories > $T/out 2> $T/err
grep -q "architecture: *LlamaForCausalLM" $T/out; ok $? "info tiny/stories: $(cat $T/err)"
"$G" run --model $S/hf "Once upon a time" -n 24 --temperature 0 --json > $T/local.json 2>/dev/null
HF_ENDPOINT=$CLOSED "$G" run --model tiny/stories "Once upon a time" -n 24 --temperature 0 --json > $T/hub.json 2> $T/err
ok $? "run --model tiny/stories: $(cat $T/err)"
python3 -c "
import json,sys; a=json.load(open('$T/local.json')); b=json.load(open('$T/hub.json'))
sys.exit(0 if a['token_ids']==b['token_ids'] and a['text']==b['text'] and b['text'] else 1)"
ok $? "run on the repo id == run on the folder"
GERBIL_MODEL=tiny/stories HF_ENDPOINT=$CLOSED "$G" run "Once upon a time" -n 24 --temperature 0 --json > $T/env.json 2>/dev/null
cmp -s $T/hub.json $T/env.json || python3 -c "
import json,sys; sys.exit(0 if json.load(open('$T/env.json'))['token_ids']==json.load(open('$T/hub.json'))['token_ids'] else 1)"
ok $? "GERBIL_MODEL picks the model of run"
HF_ENDPOINT=$CLOSED "$G" tokenize --model tiny/stories "Once upon a time" > $T/out 2>&1
grep -q '"ids": \[' $T/out; ok $? "tokenize --model tiny/stories: $(cat $T/out)"
n_before=$(wc -l < $T/log)
"$G" pull tiny/stories > /dev/null 2>&1; ok $? "second pull"
[ "$(tail -n +$((n_before+1)) $T/log | grep -c resolve)" = 0 ]; ok $? "a second pull fetches nothing"
"$G" pull tiny/stories 2>&1 >/dev/null | grep -q "tiny/stories is up to date"; ok $? "a second pull says up to date"
HF_ENDPOINT=$CLOSED "$G" quantize tiny/stories $T/q8.gguf --type q8_0 > /dev/null 2> $T/err && \
    "$G" run --model $T/q8.gguf --ids 1 -n 4 > /dev/null 2>&1; ok $? "quantize takes a repo id: $(tail -2 $T/err)"

# 3. a dropped connection: the pull fails clearly, keeps the part, and the next pull resumes with a Range
"$G" rm tiny/stories > /dev/null
SIZE=$(stat -c %s $R/tiny/stories/model.safetensors); HALF=$((SIZE / 2))
mode cut
expect_fail "cut transfer" "connection dropped.*run the same command again to resume" "$G" pull tiny/stories
PART=$(ls $T/cache/models--tiny--stories/blobs/*.incomplete 2>/dev/null | head -1)
[ -n "$PART" ] && [ "$(stat -c %s "$PART")" = $HALF ]; ok $? "the first half is kept in blobs/*.incomplete"
[ ! -e $SNAP/model.safetensors ]; ok $? "no partial file in the snapshot"
mode normal; : > $T/log
"$G" pull tiny/stories > /dev/null 2> $T/err; ok $? "resumed pull: $(cat $T/err)"
grep -q "GET /cdn/.* range=bytes=$HALF- .* -> 206 $((SIZE - HALF))" $T/log; ok $? "resume asked for bytes $HALF- and got the rest: $(grep cdn $T/log)"
cmp_repo; ok $? "resumed file is intact"
! ls $T/cache/models--tiny--stories/blobs/ | grep -q incomplete; ok $? "no .incomplete left"

# 3b. a hub without ?blobs=true metadata: ETags and sizes from HEAD requests, still verified
"$G" rm tiny/stories > /dev/null
mode noblobs; : > $T/log
"$G" pull tiny/stories > /dev/null 2> $T/err; ok $? "pull without blobs metadata: $(cat $T/err)"
mode normal
[ "$(grep -c '^HEAD /tiny/stories/resolve/' $T/log)" = 6 ] && cmp_repo; ok $? "HEAD per file, files intact"

# 4. wrong bytes: a checksum error and nothing in the snapshot
"$G" rm tiny/stories > /dev/null
mode corrupt
expect_fail "corrupt transfer" "checksum mismatch for .* expected (sha256|git blob sha1)" "$G" pull tiny/stories
[ -z "$(ls -A $SNAP 2>/dev/null)" ] && [ -z "$(ls $T/cache/models--tiny--stories/blobs/ 2>/dev/null | grep -v incomplete)" ]
ok $? "nothing from a corrupt transfer enters the cache"
mode normal

# 5. access and existence errors
expect_fail "gated without token" "HTTP 401.*set HF_TOKEN" "$G" pull tiny/gated
HF_TOKEN=wrong expect_fail "gated, wrong token" "HTTP 403.*check that your token" "$G" pull tiny/gated
: > $T/log
"$G" pull --token secret tiny/gated > /dev/null 2> $T/err; ok $? "gated with --token: $(cat $T/err)"
grep -q "api/models/tiny/gated.* auth=yes -> 200" $T/log; ok $? "the token is sent as Authorization"
if getent hosts localhost > /dev/null 2>&1; then  # the CDN is another host: the token stays with the hub
    "$G" rm tiny/gated > /dev/null; mode cdnhost; : > $T/log
    "$G" pull --token secret tiny/gated > /dev/null 2> $T/err; ok $? "gated, blobs on another host: $(cat $T/err)"
    mode normal
    grep -q "resolve/.*model.safetensors.* auth=yes -> 302" $T/log && grep -q "GET /cdn/.* auth=no -> 200" $T/log
    ok $? "the token is not sent to the redirect's host: $(grep -E 'safetensors|cdn' $T/log)"
fi
HF_TOKEN=secret "$G" info tiny/gated > /dev/null 2>&1; ok $? "HF_TOKEN works for info on a gated repo"
printf 'secret\n' > $T/saved-token; "$G" rm tiny/gated > /dev/null
HF_TOKEN_PATH=$T/saved-token "$G" pull tiny/gated > /dev/null 2>&1; ok $? "the token saved by hf auth login is used"
expect_fail "no such repo" "no repo tiny/nope on .*HTTP 404" "$G" pull tiny/nope
expect_fail "no such revision" 'tiny/stories has no revision "v9"' "$G" pull tiny/stories@v9
expect_fail "no such gguf" 'no GGUF file matching "Q2_K".*stories-Q4_K_M.gguf' "$G" pull tiny/gguf:Q2_K
expect_fail "nothing to run" "tiny/docs@main has no weights gerbil can run.*README.md" "$G" pull tiny/docs
expect_fail "bad reference" "expected a folder, a .gguf file or a Hugging Face repo id" "$G" pull "a/b/c"
expect_fail "no network" "cannot reach $CLOSED.*HF_HUB_OFFLINE=1" env HF_ENDPOINT=$CLOSED "$G" pull tiny/gguf
expect_fail "DNS failure" "DNS lookup failed" env HF_ENDPOINT=http://no-such-host.invalid "$G" pull tiny/gguf

# 6. GGUF repos: one file, Q4_K_M by default among several, or the one asked for
"$G" pull tiny/gguf > $T/out 2> $T/err; ok $? "pull a GGUF repo: $(cat $T/err)"
grep -q "several GGUF files; using stories-Q4_K_M.gguf" $T/err; ok $? "the default GGUF choice is said"
[ "$(basename "$(cat $T/out)")" = stories-Q4_K_M.gguf ] && [ ! -e "$(dirname "$(cat $T/out)")/stories-Q8_0.gguf" ]
ok $? "only the chosen GGUF is fetched"
"$G" run --model tiny/gguf:Q8_0 --ids 1 -n 4 --temperature 0 > $T/out 2> $T/err; ok $? "run --model tiny/gguf:Q8_0: $(cat $T/err)"
HF_ENDPOINT=$CLOSED "$G" info tiny/gguf:stories-Q8_0.gguf > $T/out 2>&1; grep -q "Q8_0.gguf" $T/out; ok $? "repo:FILE.gguf from the cache"

# 7. offline: the cache or a clear failure, never the network
: > $T/log
HF_HUB_OFFLINE=1 "$G" run --model tiny/gated --ids 1 -n 4 --temperature 0 > /dev/null 2> $T/err; ok $? "offline run from the cache: $(cat $T/err)"
HF_HUB_OFFLINE=1 "$G" pull tiny/gated > /dev/null 2> $T/err; ok $? "offline pull of a cached repo"
expect_fail "offline, not cached" "not \(completely\) in the cache .*HF_HUB_OFFLINE=1" env HF_HUB_OFFLINE=1 "$G" info tiny/docs
expect_fail "offline pull, not cached" "HF_HUB_OFFLINE=1 forbids downloading" env HF_HUB_OFFLINE=1 "$G" pull tiny/nope
[ ! -s $T/log ]; ok $? "offline commands sent no request"

# 8. a cache written in the huggingface_hub layout (as Python tools leave it) is used as is
PY=$T/cache/models--py--written; C=0123456789abcdef0123456789abcdef01234567
mkdir -p $PY/blobs $PY/snapshots/$C $PY/refs
for f in config.json model.safetensors tokenizer.json; do
    h=$(sha256sum $S/hf/$f | cut -c1-64); cp $S/hf/$f $PY/blobs/$h; ln -s ../../blobs/$h $PY/snapshots/$C/$f
done
printf %s $C > $PY/refs/main
HF_ENDPOINT=$CLOSED "$G" run --model py/written "Once upon a time" -n 24 --temperature 0 --json > $T/py.json 2> $T/err
ok $? "run on a Python-written cache: $(cat $T/err)"
python3 -c "
import json,sys; sys.exit(0 if json.load(open('$T/py.json'))['token_ids']==json.load(open('$T/local.json'))['token_ids'] else 1)"
ok $? "same tokens as the local folder"
HF_ENDPOINT=$CLOSED "$G" info py/written@$C > /dev/null 2>&1; ok $? "org/name@COMMIT resolves from the cache"

# 9. two pulls of one repo at once: both succeed, each file crosses the network once
"$G" rm tiny/stories > /dev/null
mode slow; : > $T/log
"$G" pull tiny/stories > $T/p1 2> $T/e1 & P1=$!
"$G" pull tiny/stories > $T/p2 2> $T/e2 & P2=$!
wait $P1; r1=$?; wait $P2; r2=$?
mode normal
[ $r1 = 0 ] && [ $r2 = 0 ]; ok $? "concurrent pulls succeed ($r1, $r2): $(cat $T/e1 $T/e2 | grep -v pull)"
cmp_repo; ok $? "files intact after concurrent pulls"
[ "$(grep -c 'GET /cdn/' $T/log)" = 1 ]; ok $? "the weights were downloaded once: $(grep -c 'GET /cdn/' $T/log)"

# 10. list and rm
"$G" list > $T/out 2> $T/err; ok $? "list: $(cat $T/err)"
grep -Eq "^tiny/stories +main +[0-9a-f]{12} +safetensors +1\.0 MiB" $T/out; ok $? "list shows tiny/stories: $(cat $T/out)"
grep -Eq "^py/written +main +0123456789ab +safetensors" $T/out; ok $? "list shows the Python-written repo"
grep -Eq "^tiny/gguf .* gguf " $T/out; ok $? "list shows the GGUF repo"
"$G" rm tiny/stories > $T/out 2>&1; grep -q "removed tiny/stories (1.0 MiB freed)" $T/out; ok $? "rm: $(cat $T/out)"
[ ! -e $T/cache/models--tiny--stories ] && ! "$G" list | grep -q tiny/stories; ok $? "rm removes the repo"
expect_fail "rm twice" "tiny/stories is not in the cache" "$G" rm tiny/stories
expect_fail "rm a bad id" "not a repo id" "$G" rm ../etc

# 11. disk full: a clear message (the partial file is a link to /dev/full)
if [ -w /dev/full ]; then
    "$G" rm tiny/gguf > /dev/null
    H=$(sha256sum $R/tiny/gguf/stories-Q4_K_M.gguf | cut -c1-64)
    mkdir -p $T/cache/models--tiny--gguf/blobs && ln -s /dev/full $T/cache/models--tiny--gguf/blobs/$H.incomplete
    expect_fail "disk full" "disk full .*HF_HUB_CACHE" "$G" pull tiny/gguf
fi

# The default model end to end: no --model, nothing cached -> gerbil run pulls
# mlx-community/Qwen3.5-0.8B-4bit (here the Qwen3.5 MLX fixture) and generates exactly what the
# local folder generates (greedy, token ids: the fixture has no tokenizer).
unset GERBIL_MODEL
"$G" run --ids 5,17,42,99 -n 6 --temperature 0 --ignore-eos -t 1 > $T/def.out 2> $T/def.err
ok $? "run with the default model: $(tail -2 $T/def.err)"
grep -q "pulling mlx-community/Qwen3.5-0.8B-4bit@main" $T/def.err; ok $? "run says it pulls the default model"
"$G" run --model tests/fixtures/qwen35-mlx4 --ids 5,17,42,99 -n 6 --temperature 0 --ignore-eos -t 1 > $T/loc.out 2>/dev/null
[ -s $T/def.out ] && cmp -s $T/def.out $T/loc.out; ok $? "default model output equals the local folder's ($(cat $T/def.out) vs $(cat $T/loc.out))"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
