#!/usr/bin/env bash
# POST /v1/audio/transcriptions (src/serve/audio.c) on `gerbil serve --stt-model`: a multipart
# form (file, model, response_format) built with Python's standard library; json, text and
# verbose_json answers (verbose_json's tokens are transformers' greedy ids of the Moonshine
# fixture on jfk.wav, as tests/cli_transcribe.sh checks for the CLI); 400s for bad audio, a
# missing file, an unknown format, a body that is not multipart; 400 naming --stt-model on a
# server without one.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
FX=tests/fixtures/moonshine-f32
TXT=../shared/data/models/stories260K/hf
JFK=../shared/data/audio/jfk.wav
for f in "$FX/expected.safetensors" "$TXT/config.json" "$JFK"; do [ -e "$f" ] || { echo "SKIP: $f missing"; exit 77; }; done
T=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill -TERM $p 2>/dev/null; done; rm -rf "$T"' EXIT
start() { # start NAME ARGS...: a server, its URL in $T/NAME.url
    local name=$1; shift
    "$G" serve --model "$TXT" --port 0 --parallel 2 "$@" >"$T/$name.out" 2>"$T/$name.err" &
    pids="$pids $!"
    for _ in $(seq 300); do grep -q 'listening on' "$T/$name.out" && break; sleep 0.1; done
    grep -o 'http://[^ ]*' "$T/$name.out" >"$T/$name.url" || { echo "FAIL: $name did not start"; cat "$T/$name.err"; exit 1; }
}
start stt --stt-model "$FX"
start plain
python3 - "$(cat "$T/stt.url")" "$(cat "$T/plain.url")" "$JFK" "$FX/expected.safetensors" <<'PY'
import json, struct, sys, urllib.request, urllib.error
url, plain, wav, exp = sys.argv[1:5]
b = open(exp, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); m = h["greedy_ids"]
s, e = m["data_offsets"]; greedy = list(struct.unpack("<%di" % ((e - s) // 4), b[8 + n + s:8 + n + e]))
audio = open(wav, "rb").read()
fails = 0
def post(base, fields, files, ctype=None, raw=None):
    bd = "----gerbil-test-boundary"
    body = b""
    for k, v in fields.items():
        body += ("--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n" % (bd, k, v)).encode()
    for k, (fn, data) in files.items():
        body += ("--%s\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s\"\r\n"
                 "Content-Type: application/octet-stream\r\n\r\n" % (bd, k, fn)).encode() + data + b"\r\n"
    body += ("--%s--\r\n" % bd).encode()
    req = urllib.request.Request(base + "/v1/audio/transcriptions", data=raw if raw is not None else body,
                                 headers={"Content-Type": ctype or "multipart/form-data; boundary=" + bd})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type"), err.read().decode()
def check(name, cond, detail=""):
    global fails
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else ": " + detail))
    fails += not cond
st, ct, body = post(url, {"model": "moonshine", "response_format": "json"}, {"file": ("jfk.wav", audio)})
check("json", st == 200 and ct.startswith("application/json") and json.loads(body) == {"text": ""}, "%d %s" % (st, body[:200]))
st, ct, body = post(url, {"model": "moonshine"}, {"file": ("jfk.wav", audio)})
check("default format json", st == 200 and "text" in json.loads(body), body[:200])
st, ct, body = post(url, {"response_format": "text"}, {"file": ("jfk.wav", audio)})
check("text", st == 200 and ct.startswith("text/plain") and body == "\n", repr(body[:100]))
st, ct, body = post(url, {"response_format": "verbose_json"}, {"file": ("jfk.wav", audio)})
j = json.loads(body) if st == 200 else {}
check("verbose_json", st == 200 and j.get("task") == "transcribe" and j.get("duration") == 11 and
      len(j.get("segments", [])) == 1 and j["segments"][0]["tokens"][:24] == greedy, body[:300])
st, ct, body = post(url, {}, {"file": ("x.wav", b"this is not audio at all")})
check("bad audio 400", st == 400 and json.loads(body)["error"]["code"] == "invalid_audio", "%d %s" % (st, body))
print("     ", body)
st, ct, body = post(url, {}, {"file": ("x.wav", audio[:30000])})
check("truncated audio 400", st == 400 and "truncated" in body, "%d %s" % (st, body))
st, ct, body = post(url, {"model": "m"}, {})
check("no file 400", st == 400 and json.loads(body)["error"]["param"] == "file", "%d %s" % (st, body))
st, ct, body = post(url, {"response_format": "srt"}, {"file": ("jfk.wav", audio)})
check("bad format 400", st == 400 and json.loads(body)["error"]["param"] == "response_format", "%d %s" % (st, body))
st, ct, body = post(url, {}, {}, ctype="application/json", raw=b'{"file": "jfk.wav"}')
check("not multipart 400", st == 400 and "multipart" in body, "%d %s" % (st, body))
st, ct, body = post(plain, {}, {"file": ("jfk.wav", audio)})
check("no stt model 400", st == 400 and "--stt-model" in body, "%d %s" % (st, body))
sys.exit(1 if fails else 0)
PY
rc=$?
expect=$("$G" serve --model "$TXT" --port 0 --stt-model "$TXT" 2>&1 >/dev/null | grep -c "not a speech-to-text model")
[ "$expect" = 1 ] || { echo "FAIL: --stt-model with a text model"; rc=1; }
exit $rc
