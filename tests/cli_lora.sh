#!/usr/bin/env bash
# --lora on the command line: `gerbil logits --lora A --all` against peft's logits
# (tests/fixtures/lora-*, scripts/gen_lora_fixtures.py), summed adapters, the scale, the
# layouts (PEFT, mlx-lm, GGUF), and every refusal with a message naming the cause.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed to read the expected logits"; exit 77; }
FX=tests/fixtures
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0

expect_fail() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pat" "$T/err"; then
        pass=$((pass+1))
    else
        fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; sed 's/^/  stderr: /' "$T/err" | head -5
    fi
}
ok() { if "$@"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $*"; fi; }

# compare LOGITS_JSON EXPECTED.safetensors NAME TOL: max |diff| over every position <= TOL
compare() {
    python3 - "$@" <<'PY'
import json, struct, sys
got, path, name, tol = json.load(open(sys.argv[1]))["logits"], sys.argv[2], sys.argv[3], float(sys.argv[4])
b = open(path, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def tensor(k):
    s, e = h[k]["data_offsets"]
    fmt = "<%d%s" % ((e - s) // 4, "f" if h[k]["dtype"] == "F32" else "i")
    return list(struct.unpack(fmt, b[8 + n + s:8 + n + e])), h[k]["shape"]
want, shape = tensor(name)
d = max(abs(got[t][v] - want[t * shape[1] + v]) for t in range(shape[0]) for v in range(shape[1]))
print(f"{name}: max |diff| {d:.3g} over {shape[0]} positions")
sys.exit(0 if d <= tol else 1)
PY
}
ids() {
    python3 - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
s, e = h["input_ids"]["data_offsets"]
print(",".join(str(x) for x in struct.unpack("<%di" % ((e - s) // 4), b[8 + n + s:8 + n + e])))
PY
}

for base in qwen3 qwen35; do
    M=$FX/$base-f32 L=$FX/lora-$base E=$FX/lora-$base/expected.safetensors
    I=$(ids "$E")
    "$G" logits --kv-type f32 --model $M --lora $L/a --ids "$I" --all >"$T/a.json" 2>"$T/err"; ok compare "$T/a.json" "$E" logits_a 1e-3
    "$G" logits --kv-type f32 --model $M --lora $L/b --ids "$I" --all >"$T/b.json" 2>"$T/err"; ok compare "$T/b.json" "$E" logits_b 1e-3
    "$G" logits --kv-type f32 --model $M --lora $L/a --lora $L/b:1 --ids "$I" --all >"$T/ab.json"; ok compare "$T/ab.json" "$E" logits_ab 1e-3
    "$G" logits --kv-type f32 --model $M --lora $L/a:0 --ids "$I" --all >"$T/z.json"; ok compare "$T/z.json" "$E" logits_base 1e-3
    "$G" logits --kv-type f32 --model $M --lora $L/a-mlx --ids "$I" --all >"$T/m.json"; ok compare "$T/m.json" "$E" logits_a 1e-3
    "$G" logits --kv-type f32 --backend ref --model $M --lora $L/b --ids "$I" --all >"$T/r.json"; ok compare "$T/r.json" "$E" logits_b 1e-3
done
E=$FX/lora-qwen3/expected.safetensors
"$G" logits --kv-type f32 --model $FX/qwen3-f32 --lora $FX/lora-qwen3/a.gguf --ids "$(ids $E)" --all >"$T/g.json"; ok compare "$T/g.json" "$E" logits_a 1e-3
# run / bench take it too; the adapter changes what is generated
a=$("$G" run --model $FX/qwen3-f32 --lora $FX/lora-qwen3/b --ids 5,6,7 -n 8 --temperature 0 2>/dev/null)
b=$("$G" run --model $FX/qwen3-f32 --ids 5,6,7 -n 8 --temperature 0 2>/dev/null)
ok test -n "$a" -a "$a" != "$b"
ok "$G" bench --model $FX/qwen3-f32 --lora $FX/lora-qwen3/a -p 8 -n 4 -r 1 --json
ok "$G" bench --model $FX/qwen3-f32 --lora $FX/lora-qwen3/a -p 8 -n 4 -r 1 --batch 3 --json
"$G" logits --help | grep -q -- "--lora" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: --help lacks --lora"; }

# refusals
M=$FX/qwen3-f32
A=$FX/lora-qwen3/a
mkd() { rm -rf "$T/$1"; cp -r "$2" "$T/$1"; }
expect_fail "missing" "no such adapter" "$G" logits --kv-type f32 --model $M --lora "$T/nope" --ids 5
expect_fail "bad scale" 'expected PATH or PATH:SCALE' "$G" logits --kv-type f32 --model $M --lora "$A:x" --ids 5
expect_fail "not a folder of an adapter" "not an adapter folder" "$G" logits --kv-type f32 --model $M --lora $FX/qwen3-f32 --ids 5
expect_fail "a model gguf" "not adapter" "$G" logits --kv-type f32 --model $M --lora $FX/qwen3-gguf-f32/model.gguf --ids 5
expect_fail "other model" "does not have|in the model" "$G" logits --model $FX/qwen35-f32 --lora $A --ids 5
expect_fail "serve" "does not apply adapters yet" "$G" serve --model $M --lora $A
mkd dora $A; sed -i 's/"use_dora": false/"use_dora": true/' "$T/dora/adapter_config.json"
expect_fail "dora" "DoRA" "$G" logits --kv-type f32 --model $M --lora "$T/dora" --ids 5
mkd mts $A; sed -i 's/"modules_to_save": null/"modules_to_save": ["lm_head"]/' "$T/mts/adapter_config.json"
expect_fail "modules_to_save" "modules_to_save \(lm_head\)" "$G" logits --kv-type f32 --model $M --lora "$T/mts" --ids 5
mkd bias $A; sed -i 's/"bias": "none"/"bias": "all"/' "$T/bias/adapter_config.json"
expect_fail "bias" 'bias "all"' "$G" logits --kv-type f32 --model $M --lora "$T/bias" --ids 5
mkd rank $A; sed -i 's/"r": 8/"r": 4/' "$T/rank/adapter_config.json"
expect_fail "rank mismatch" "r = 4" "$G" logits --kv-type f32 --model $M --lora "$T/rank" --ids 5
mkd trunc $A; head -c 5000 $A/adapter_model.safetensors >"$T/trunc/adapter_model.safetensors"
expect_fail "truncated" "adapter_model.safetensors" "$G" logits --kv-type f32 --model $M --lora "$T/trunc" --ids 5
mkd nost $A; rm "$T/nost/adapter_model.safetensors"
expect_fail "no safetensors" "adapter_model.safetensors is missing" "$G" logits --kv-type f32 --model $M --lora "$T/nost" --ids 5
mkd badjson $A; echo '{"r": ' >"$T/badjson/adapter_config.json"
expect_fail "bad json" "adapter_config.json" "$G" logits --kv-type f32 --model $M --lora "$T/badjson" --ids 5
mkd mdora $FX/lora-qwen3/a-mlx; sed -i 's/"fine_tune_type": "lora"/"fine_tune_type": "dora"/' "$T/mdora/adapter_config.json"
expect_fail "mlx dora" "DoRA" "$G" logits --kv-type f32 --model $M --lora "$T/mdora" --ids 5
mkd mfull $FX/lora-qwen3/a-mlx; sed -i 's/"fine_tune_type": "lora"/"fine_tune_type": "full"/' "$T/mfull/adapter_config.json"
expect_fail "mlx full" "not a LoRA adapter" "$G" logits --kv-type f32 --model $M --lora "$T/mfull" --ids 5

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
