#!/usr/bin/env bash
# `gerbil bench` reports as llama-bench does: the thread count used (the CPUs when -t is not
# given, never 0) and a model column "arch size format" with size and params columns.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
D=../shared/data/models/stories260K
FX=tests/fixtures
if [ ! -f $D/hf/config.json ]; then echo "SKIPPED: $D absent (shared test data)"; exit 77; fi
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed to read JSON"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }
n=$(getconf _NPROCESSORS_ONLN)

"$G" bench --model $D/hf -p 8 -n 4 -r 1 > "$T/table" 2>&1
grep -qE "^\| llama 0.26M F32 +\| +1.00 MiB \| +0.26 M \| +$n \| +pp8 " "$T/table"; ok $? "table: model, size, params, $n threads: $(cat "$T/table")"
"$G" bench --model $D/hf -p 8 -n 4 -r 1 -t 1 --json > "$T/j" 2>&1
python3 -c "
import json,sys; j=json.load(open('$T/j'))
sys.exit(0 if j['n_threads'] == 1 and j['model_type'] == 'llama 0.26M F32' and j['model_n_params'] > 0 else 1)"
ok $? "--json: n_threads 1, model_type: $(cat "$T/j")"
"$G" bench --model $D/hf -p 8 -n 4 -r 1 --json > "$T/j" 2>&1
python3 -c "import json,sys; sys.exit(0 if json.load(open('$T/j'))['n_threads'] == $n else 1)"; ok $? "--json: n_threads = $n CPUs"
if [ -f $FX/llama-gguf-q4_k/model.gguf ]; then
    "$G" bench --model $FX/llama-gguf-q4_k/model.gguf -p 8 -n 4 -r 1 > "$T/table" 2>&1
    grep -qE "^\| llama [0-9.]+M Q4_K " "$T/table"; ok $? "GGUF: the format in the model column: $(sed -n 3p "$T/table")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
