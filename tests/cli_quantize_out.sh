#!/usr/bin/env bash
# `gerbil quantize` checks OUT before converting: a missing folder, a folder given for a
# GGUF file, or an MLX folder that exists fail at once (exit 2), before IN's weights are
# read (IN here has weights that cannot be read: its error would come first otherwise).
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
FX=tests/fixtures
[ -f $FX/qwen2-f32/config.json ] || { echo "SKIPPED: fixtures absent"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }
mkdir -p "$T/in" && cp $FX/qwen2-f32/*.json "$T/in/" && head -c 100000 $FX/qwen2-f32/model.safetensors > "$T/in/model.safetensors"
"$G" quantize "$T/in" "$T/out.gguf" --type q8_0 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -q "model.safetensors" "$T/err"; ok $? "IN's weights fail when OUT is fine ($rc)"
"$G" quantize "$T/in" "$T/nope/out.gguf" --type q8_0 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "the folder $T/nope does not exist" "$T/err"; ok $? "OUT in a missing folder ($rc: $(cat "$T/err"))"
"$G" quantize "$T/in" "$T" --type q8_0 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "a GGUF output is a file path" "$T/err"; ok $? "OUT a folder for a GGUF ($rc)"
mkdir -p "$T/mlx"
"$G" quantize "$T/in" "$T/mlx" --type mlx4 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "remove it first" "$T/err"; ok $? "MLX OUT exists ($rc)"
if [ "$(id -u)" != 0 ]; then
    mkdir -p "$T/ro" && chmod a-w "$T/ro"
    "$G" quantize "$T/in" "$T/ro/out.gguf" --type q8_0 >/dev/null 2>"$T/err"; rc=$?
    [ $rc = 2 ] && grep -q "cannot write" "$T/err"; ok $? "OUT in a read-only folder ($rc)"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
