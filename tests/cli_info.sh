#!/usr/bin/env bash
# `gerbil info` reads metadata only: on a 1.5 GB model (a sparse file: the header of a real
# Llama layout, the data never written) its memory stays far below the weights'; formats
# are named as users know them; --json; --ctx-size/--kv-type refused (info does not use them);
# a load that runs out of memory says how much the weights need.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
FX=tests/fixtures
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed"; exit 77; }
[ -f $FX/llama-f32/config.json ] || { echo "SKIPPED: fixtures absent"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }

# a Llama of hidden 2048, 8 layers, vocab 32000 in f32: the safetensors header and a hole
python3 - "$FX/llama-f32/config.json" "$T/big" <<'PY'
import json, os, struct, sys
cfg = json.load(open(sys.argv[1])); out = sys.argv[2]; os.makedirs(out)
H, F, L, V, NH, KV, HD = 2048, 5632, 8, 32000, 16, 8, 128
cfg.update(hidden_size=H, intermediate_size=F, num_hidden_layers=L, vocab_size=V, num_attention_heads=NH,
           num_key_value_heads=KV, head_dim=HD, max_position_embeddings=4096, tie_word_embeddings=True)
json.dump(cfg, open(f"{out}/config.json", "w"))
shapes = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                   p + "self_attn.q_proj.weight": [NH * HD, H], p + "self_attn.k_proj.weight": [KV * HD, H],
                   p + "self_attn.v_proj.weight": [KV * HD, H], p + "self_attn.o_proj.weight": [H, NH * HD],
                   p + "mlp.gate_proj.weight": [F, H], p + "mlp.up_proj.weight": [F, H], p + "mlp.down_proj.weight": [H, F]})
hdr, off, n = {}, 0, 0
for k, s in shapes.items():
    size = 4 * s[0] * (s[1] if len(s) > 1 else 1)
    hdr[k] = {"dtype": "F32", "shape": s, "data_offsets": [off, off + size]}
    off += size; n += size // 4
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h); f.truncate(8 + len(h) + off)
open(f"{out}/n_params", "w").write(str(n))
PY
ok $? "sparse model written"

# 1. info on it: the weights are not read (max RSS of the child far below 1.5 GB)
python3 - "$G" "$T/big" "$T/info.json" <<'PY'
import json, resource, subprocess, sys
out = subprocess.run([sys.argv[1], "info", sys.argv[2], "--json"], capture_output=True, text=True)
rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
assert out.returncode == 0, out.stderr
open(sys.argv[3], "w").write(out.stdout)
j = json.loads(out.stdout)
weights_mib = float(j["weights"].split()[0])
print(f"  info: max RSS {rss_mib:.0f} MiB for {weights_mib:.0f} MiB of weights")
assert weights_mib > 1400 and rss_mib < 200, (weights_mib, rss_mib)
PY
ok $? "info reads metadata only"
python3 -c "
import json,sys; j=json.load(open('$T/info.json')); n=int(open('$T/big/n_params').read())
sys.exit(0 if j['parameters'] == n and j['layers'] == 8 and j['vocab'] == 32000 and j['format'] == 'F32'
         and j['architecture'] == 'LlamaForCausalLM' else 1)"
ok $? "--json: parameters, layers, vocab, format: $(head -c 300 "$T/info.json")"

# 2. formats named as users know them (expected from each fixture's own config / file)
gs=$(python3 -c "import json; q=json.load(open('$FX/llama-mlx4/config.json'))['quantization']; print(q['bits'], q['group_size'])")
"$G" info $FX/llama-mlx4 > "$T/mlx.txt" 2>&1
grep -q "^format: *MLX ${gs% *}-bit, group ${gs#* }\$" "$T/mlx.txt"; ok $? "MLX: $(grep format "$T/mlx.txt") (config: $gs)"
"$G" info $FX/llama-gguf-q4_k/model.gguf > "$T/gguf.txt" 2>&1
grep -q "^format: *GGUF Q4_K\$" "$T/gguf.txt"; ok $? "GGUF: $(grep format "$T/gguf.txt")"
"$G" info $FX/qwen3-bf16 > "$T/bf16.txt" 2>&1
grep -q "^format: *BF16\$" "$T/bf16.txt"; ok $? "bf16: $(grep format "$T/bf16.txt")"

# 3. flags info does not use are refused, not silently ignored
for f in "--ctx-size 8192" "--kv-type f32"; do
    "$G" info $FX/qwen3-bf16 $f >/dev/null 2>"$T/err"; rc=$?
    [ $rc = 2 ] && grep -q -- "${f%% *} is not used" "$T/err"; ok $? "info $f refused ($rc)"
done

# 4. a load out of memory says how much the weights need (an address-space limit below them;
# not under AddressSanitizer, which cannot start under such a limit)
if (ulimit -v 800000; "$G" --version) >/dev/null 2>&1; then
    (ulimit -v 800000; "$G" run --model "$T/big" --ids 1,2 -n 1) >/dev/null 2>"$T/err"; rc=$?
    want=$(python3 -c "import os; print('%.1f' % (os.path.getsize('$T/big/model.safetensors') / 1048576))")
    [ $rc = 1 ] && grep -q "the weights need $want MiB" "$T/err"; ok $? "out of memory: how much is needed ($rc: $(cat "$T/err"))"
else
    echo "  (the out-of-memory case skipped: ulimit -v cannot be used here)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
