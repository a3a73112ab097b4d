#!/usr/bin/env bash
# Command-line contract and bad input: every case must end with a clear message and a
# non-zero exit, never a crash (this also runs under the sanitizer build).
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
FX=tests/fixtures
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0

# expect_fail NAME PATTERN CMD...: non-zero exit (not a signal) and stderr matching PATTERN
expect_fail() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pat" "$T/err"; then
        pass=$((pass+1))
    else
        fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; sed 's/^/  stderr: /' "$T/err" | head -5
    fi
}
expect_ok() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -eq 0 ] && grep -qE -- "$pat" "$T/out"; then
        pass=$((pass+1))
    else
        fail=$((fail+1)); echo "FAIL: $name (rc=$rc)"; head -c 300 "$T/out"; sed 's/^/  stderr: /' "$T/err" | head -5
    fi
}

# --help everywhere
expect_ok "help" "usage: gerbil COMMAND" "$G" --help
for c in run chat logits info bench tokenize template; do expect_ok "$c --help" "usage: gerbil $c" "$G" $c --help; done
expect_fail "no command" "usage" "$G"
expect_fail "unknown command" 'unknown command "frobnicate"' "$G" frobnicate
expect_fail "unknown flag" 'unknown option "--frob"' "$G" run --model $FX/llama-f32 --ids 1 --frob

# bad flag values
M=$FX/llama-f32
expect_fail "threads not a number" "--threads: expected an integer" "$G" run --model $M --ids 1 --threads abc
expect_fail "kv-type" "--kv-type: expected f16 or f32" "$G" logits --model $M --ids 1 --kv-type f8
expect_fail "backend" "--backend: expected cpu or ref" "$G" logits --model $M --ids 1 --backend cuda
expect_fail "cpu isa" "GERBIL_CPU_ISA=.bogus.: expected auto, avx512, avx2 or scalar" env GERBIL_CPU_ISA=bogus "$G" logits --model $M --ids 1
expect_fail "bench batch" "--batch" "$G" bench --model $M --batch 0
expect_fail "ids malformed" "--ids: expected comma-separated integers" "$G" logits --model $M --ids 1,x,3
expect_fail "ids missing" "--ids is required" "$G" logits --model $M
expect_fail "temperature" "--temperature: expected a number" "$G" run --model $M --ids 1 --temperature hot
expect_fail "negative temperature" "temperature must be >= 0" "$G" run --model $M --ids 1 --temperature -1
expect_fail "text prompt without tokenizer" "has no tokenizer" "$G" run --model $M "Why is the sky blue?"

# bad ids and context
expect_fail "id outside vocab" "token id 300 at position 1 is outside the vocabulary \[0, 256\)" \
    "$G" logits --model $M --ids 1,300
expect_fail "negative id" "outside the vocabulary" "$G" run --model $M --ids -5 --temperature 0 -n 2
expect_fail "prompt longer than context" "exceed|does not fit the context" \
    "$G" run --model $M --ids 1,2,3,4,5,6 --ctx-size 4 --temperature 0 -n 2

# missing / corrupt files
expect_fail "missing dir" "no such file or directory" "$G" info --model "$T/nope"
mkdir -p "$T/trunc" && cp $FX/qwen2-f32/*.json "$T/trunc/"
head -c 100000 $FX/qwen2-f32/model.safetensors > "$T/trunc/model.safetensors"
expect_fail "truncated safetensors" "model.safetensors" "$G" info --model "$T/trunc"
mkdir -p "$T/hdr" && cp $FX/qwen2-f32/*.json "$T/hdr/"
{ printf '\xff\xff\xff\xff\xff\xff\x00\x00'; tail -c +9 $FX/qwen2-f32/model.safetensors; } > "$T/hdr/model.safetensors"
expect_fail "absurd header length" "model.safetensors" "$G" info --model "$T/hdr"
mkdir -p "$T/junk" && cp $FX/qwen2-f32/*.json "$T/junk/" && head -c 4096 /dev/urandom > "$T/junk/model.safetensors"
expect_fail "random bytes" "model.safetensors" "$G" info --model "$T/junk"
mkdir -p "$T/dtype" && cp $FX/qwen2-f32/*.json "$T/dtype/"
sed '0,/"F32"/s//"F64"/' $FX/qwen2-f32/model.safetensors > "$T/dtype/model.safetensors"
expect_fail "unsupported dtype" 'F64' "$G" info --model "$T/dtype"
mkdir -p "$T/noweights" && cp $FX/qwen2-f32/*.json "$T/noweights/"
expect_fail "no weights" "safetensors" "$G" info --model "$T/noweights"
mkdir -p "$T/arch" && cp $FX/qwen2-f32/model.safetensors "$T/arch/"
sed 's/Qwen2ForCausalLM/FooForCausalLM/' $FX/qwen2-f32/config.json > "$T/arch/config.json"
expect_fail "unknown architecture" 'unknown architecture "FooForCausalLM"' "$G" info --model "$T/arch"
mkdir -p "$T/cfg" && cp $FX/qwen2-f32/model.safetensors "$T/cfg/"
head -c 200 $FX/qwen2-f32/config.json > "$T/cfg/config.json"
expect_fail "truncated config.json" "config.json" "$G" info --model "$T/cfg"
mkdir -p "$T/untied" && cp $FX/qwen2-f32/model.safetensors "$T/untied/"
sed 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' $FX/qwen2-f32/config.json > "$T/untied/config.json"
expect_fail "missing lm_head" 'missing tensor "lm_head.weight"' "$G" info --model "$T/untied"
mkdir -p "$T/shape" && cp $FX/qwen2-f32/model.safetensors "$T/shape/"
sed 's/"intermediate_size": 128/"intermediate_size": 96/' $FX/qwen2-f32/config.json > "$T/shape/config.json"
expect_fail "shape mismatch" 'expected shape \[96, 64\], found \[128, 64\]' "$G" info --model "$T/shape"

# Qwen3-Next MoE: bad routing sizes, missing or misshapen experts are named
N=$FX/qwen3next-f32
mkdir -p "$T/topk" && cp $N/model.safetensors "$T/topk/"
sed 's/"num_experts_per_tok": 2/"num_experts_per_tok": 5/' $N/config.json > "$T/topk/config.json"
expect_fail "moe top-k > experts" 'num_experts_per_tok 5 exceeds num_experts 4' "$G" info --model "$T/topk"
mkdir -p "$T/noexp" && cp $N/config.json "$T/noexp/"
sed 's/layers\.0\.mlp\.experts\.0\.gate_proj/layers.0.mlp.experts.0.gate_XXXX/' $N/model.safetensors > "$T/noexp/model.safetensors"
expect_fail "moe no experts" 'missing tensor "model.layers.0.mlp.experts.0.gate_proj.weight" \(the experts' \
    "$G" info --model "$T/noexp"
mkdir -p "$T/noexp3" && cp $N/config.json "$T/noexp3/"
sed 's/layers\.1\.mlp\.experts\.3\.down_proj/layers.1.mlp.experts.3.down_XXXX/' $N/model.safetensors > "$T/noexp3/model.safetensors"
expect_fail "moe missing expert" 'missing tensor "model.layers.1.mlp.experts.3.down_proj.weight"' "$G" info --model "$T/noexp3"
mkdir -p "$T/moeshape" && cp $FX/qwen3next-bf16/model.safetensors "$T/moeshape/"
sed 's/"moe_intermediate_size": 64/"moe_intermediate_size": 32/' $FX/qwen3next-bf16/config.json > "$T/moeshape/config.json"
expect_fail "moe fused shape" 'mlp.experts.gate_up_proj": expected shape \[4, 64, 64\], found \[4, 128, 64\]' \
    "$G" info --model "$T/moeshape"
if "$G" quantize $N "$T/next.gguf" --type f32 >/dev/null 2>&1; then
    sed 's/blk\.1\.ffn_gate_exps/blk.1.ffn_gate_XXXX/' "$T/next.gguf" > "$T/next-noexp.gguf"
    expect_fail "gguf moe no experts" 'missing tensor "blk.1.ffn_gate_exps.weight" \(the experts' \
        "$G" info --model "$T/next-noexp.gguf"
    sed 's/blk\.3\.ffn_down_shexp/blk.3.ffn_down_XXXXX/' "$T/next.gguf" > "$T/next-noshexp.gguf"
    expect_fail "gguf moe no shared expert" 'missing tensor "blk.3.ffn_down_shexp.weight"' \
        "$G" info --model "$T/next-noshexp.gguf"
else
    fail=$((fail+1)); echo "FAIL: quantize qwen3next-f32 to GGUF"
fi
expect_ok "info qwen3next" "architecture: +Qwen3NextForCausalLM" "$G" info --model $N
expect_ok "info experts" "experts: +4 \(2 per token, ffn 64; shared expert ffn 128\) in 3 of 4 layers" "$G" info --model $N

# GGUF: a missing tensor is named as the file spells it; truncation and junk are refused
Q=$FX/qwen3-gguf-q8_0/model.gguf
sed 's/blk\.0\.ffn_up\.weight/blk.0.ffn_XX.weight/' $Q > "$T/miss.gguf"
expect_fail "gguf missing tensor" 'missing tensor "blk.0.ffn_up.weight"' "$G" info --model "$T/miss.gguf"
head -c 300000 $Q > "$T/trunc.gguf"
expect_fail "gguf truncated" "trunc.gguf" "$G" info --model "$T/trunc.gguf"
head -c 4096 /dev/urandom > "$T/junk.gguf"
expect_fail "gguf junk" "junk.gguf" "$G" info --model "$T/junk.gguf"
expect_fail "gguf id outside vocab" "outside the vocabulary" "$G" logits --model $Q --ids 1,999

# the parity contracts
expect_ok "info" "architecture: +Qwen3ForCausalLM" "$G" info --model $FX/qwen3-bf16
expect_ok "info lfm2 gguf" "architecture: +Lfm2ForCausalLM \\(gguf lfm2\\)" "$G" info --model $FX/lfm2-gguf-q8_0/model.gguf
expect_ok "logits last" '^\{"n_vocab": 256, "logits": \[\[[^]]*\]\]\}$' "$G" logits --model $M --ids 1,17,100
"$G" logits --model $M --ids 1,17,100 --all > "$T/all.json" 2>/dev/null
rows=$(grep -o '\[' "$T/all.json" | wc -l)
if [ "$rows" -eq 4 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: logits --all rows ($rows brackets)"; fi
expect_ok "run --json" '"token_ids": \[[0-9, ]+\].*"prompt_tokens_per_s".*"gen_tokens_per_s"' \
    "$G" run --model $M --ids 1,17,100 -n 5 --temperature 0 --json
# the same seed gives the same tokens; sampling differs from greedy somewhere over 3 seeds
a=$("$G" run --model $M --ids 1,17,100 -n 16 --seed 7 --temperature 1.0 --json 2>/dev/null | grep -o '"token_ids": \[[^]]*\]')
b=$("$G" run --model $M --ids 1,17,100 -n 16 --seed 7 --temperature 1.0 --json 2>/dev/null | grep -o '"token_ids": \[[^]]*\]')
c=$("$G" run --model $M --ids 1,17,100 -n 16 --seed 8 --temperature 1.0 --json 2>/dev/null | grep -o '"token_ids": \[[^]]*\]')
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: seeded sampling ($a / $b / $c)"; fi
expect_ok "bench --json" '"prompt_tokens_per_s": [0-9.]+.*"gen_tokens_per_s": [0-9.]+' \
    "$G" bench --model $M -p 16 -n 4 -r 1 --json
expect_ok "bench --batch --json" '"gen_tokens_per_s": [0-9.]+, "gen_tokens_per_s_sd": [0-9.]+, "batch": 3\}' \
    "$G" bench --model $M -p 8 -n 4 -r 1 --batch 3 --json

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
