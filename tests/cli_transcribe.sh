#!/usr/bin/env bash
# gerbil transcribe and gerbil logits --audio end to end on the Moonshine fixtures
# (scripts/gen_moonshine_fixtures.py; transformers 5.17 is the reference): the greedy ids of
# jfk.wav, and of a FLAC of it made here with sox, equal transformers' 24 (--max-tokens 24
# reaches them; the fixture's EOS never wins), the logits of the fixed decoder prefix are
# within 1e-3, and bad input ends with a clear message and a non-zero exit (this also runs
# under the sanitizer build). The fixtures have no tokenizer: text is "" and ids compare.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
FX=tests/fixtures/moonshine-f32
JFK=../shared/data/audio/jfk.wav
[ -f "$FX/expected.safetensors" ] || { echo "SKIP: $FX missing"; exit 77; }
[ -f "$JFK" ] || { echo "SKIP: $JFK missing"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
expect_fail() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pat" "$T/err"; then pass=$((pass+1))
    else fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; sed 's/^/  stderr: /' "$T/err" | head -5; fi
}
ok() { if [ "$2" = 1 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $1"; fi; }

# the reference values, read from expected.safetensors with the standard library
python3 - "$FX/expected.safetensors" "$T" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); d = b[8 + n:]
def get(k):
    m = h[k]; s, e = m["data_offsets"]; f = "i" if m["dtype"] == "I32" else "f"
    return list(struct.unpack("<%d%s" % ((e - s) // 4, f), d[s:e])), m["shape"]
g, _ = get("greedy_ids"); ids, _ = get("decoder_ids"); lg, shp = get("logits")
open(sys.argv[2] + "/greedy", "w").write(",".join(map(str, g)))
open(sys.argv[2] + "/dec_ids", "w").write(",".join(map(str, ids)))
json.dump({"shape": shp, "logits": lg}, open(sys.argv[2] + "/logits.json", "w"))
PY

"$G" transcribe --help >"$T/out" 2>&1; ok "transcribe --help" $([ $? -eq 0 ] && grep -q "usage: gerbil transcribe" "$T/out" && echo 1)
"$G" --help | grep -q "transcribe"; ok "transcribe in gerbil --help" $([ $? -eq 0 ] && echo 1)

# --json: the keys, and the ids
"$G" transcribe "$JFK" --model "$FX" --json --max-tokens 24 >"$T/j" 2>"$T/err"
ok "transcribe --json runs" $([ $? -eq 0 ] && echo 1)
python3 - "$T/j" "$T/greedy" <<'PY' && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: transcribe --json content"; head -c 400 "$1"; }
import json, sys
j = json.load(open(sys.argv[1])); want = [int(x) for x in open(sys.argv[2]).read().split(",")]
assert set(j) >= {"text", "token_ids", "segments", "timings"}, j.keys()
assert j["token_ids"] == want, (j["token_ids"], want)
assert len(j["segments"]) == 1 and j["segments"][0]["start"] == 0 and j["segments"][0]["end"] == 11
assert j["timings"]["audio_s"] == 11 and j["timings"]["rtf"] > 0
print("transcribe --json: 24 ids identical to transformers, rtf %.4f" % j["timings"]["rtf"])
PY
# plain text mode prints one (empty: no tokenizer) line and warns
"$G" transcribe "$JFK" --model "$FX" --max-tokens 4 >"$T/out" 2>"$T/err"
ok "transcribe text mode" $([ $? -eq 0 ] && [ "$(wc -l <"$T/out")" = 1 ] && grep -q "no tokenizer.json" "$T/err" && echo 1)
# the same audio as FLAC (lossless) and as a 44.1 kHz stereo WAV resampled back: FLAC gives the same ids
if command -v sox >/dev/null; then
    sox "$JFK" "$T/j.flac"
    "$G" transcribe "$T/j.flac" --model "$FX" --json --max-tokens 24 >"$T/f" 2>/dev/null
    ok "flac ids = wav ids" $(python3 -c "import json,sys; a=json.load(open('$T/j')); b=json.load(open('$T/f')); print(1 if a['token_ids']==b['token_ids'] else 0)")
fi
# windows: 4 s every 3 s over 11 s = 4 segments
"$G" transcribe "$JFK" --model "$FX" --json --window 4 --overlap 1 --max-tokens 6 >"$T/w" 2>/dev/null
ok "windows" $(python3 -c "import json; j=json.load(open('$T/w')); s=j['segments']; print(1 if [x['start'] for x in s]==[0,3,6,9] and s[-1]['end']==11 else 0)")

# logits --audio: every position of the decoder prefix within 1e-3
"$G" logits --model "$FX" --audio "$JFK" --ids "$(cat "$T/dec_ids")" --all >"$T/lg" 2>"$T/err"
ok "logits --audio runs" $([ $? -eq 0 ] && echo 1)
python3 - "$T/lg" "$T/logits.json" <<'PY' && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: logits --audio values"; }
import json, sys
got = json.load(open(sys.argv[1])); ref = json.load(open(sys.argv[2]))
L, V = ref["shape"]; assert got["n_vocab"] == V and len(got["logits"]) == L
d = max(abs(got["logits"][t][i] - ref["logits"][t * V + i]) for t in range(L) for i in range(V))
print("logits --audio: %d x %d, max |diff| to transformers %.2e" % (L, V, d)); assert d <= 1e-3
PY
"$G" logits --model "$FX" --audio "$JFK" --ids 1,5 >"$T/lg1" 2>/dev/null
ok "logits --audio last row" $(python3 -c "import json; j=json.load(open('$T/lg1')); print(1 if len(j['logits'])==1 else 0)")

# bad input
echo "not audio" >"$T/text.wav"
: >"$T/empty.wav"
head -c 30000 "$JFK" >"$T/trunc.wav"
expect_fail "no file" "no audio file" "$G" transcribe --model "$FX"
expect_fail "two files" "one audio file" "$G" transcribe a.wav b.wav --model "$FX"
expect_fail "missing file" "cannot open" "$G" transcribe "$T/nope.wav" --model "$FX"
expect_fail "text file" "not an audio file" "$G" transcribe "$T/text.wav" --model "$FX"
expect_fail "empty file" "empty" "$G" transcribe "$T/empty.wav" --model "$FX"
expect_fail "truncated wav" "truncated" "$G" transcribe "$T/trunc.wav" --model "$FX"
expect_fail "text model" "not a speech-to-text model" "$G" transcribe "$JFK" --model tests/fixtures/llama-f32
expect_fail "bad window" "window" "$G" transcribe "$JFK" --model "$FX" --window 2 --overlap 1.5
expect_fail "bad option" "unknown option" "$G" transcribe "$JFK" --model "$FX" --bogus
expect_fail "logits --audio text model" "speech-to-text" "$G" logits --model tests/fixtures/llama-f32 --audio "$JFK" --ids 1
expect_fail "logits --audio bad id" "outside the vocabulary" "$G" logits --model "$FX" --audio "$JFK" --ids 1,99999
expect_fail "logits --audio bad audio" "not an audio file" "$G" logits --model "$FX" --audio "$T/text.wav" --ids 1
expect_fail "run on a speech model" "speech-to-text" "$G" run --model "$FX" --ids 1,2 -n 2

echo "cli_transcribe: $pass passed, $fail failed"
[ $fail -eq 0 ]
