#!/usr/bin/env bash
# Qwen3.5 checkpoints reach users in several layouts: RMSNorm weights stored as w (Hugging Face)
# or as 1 + w (mlx-lm conversions, and some other converters), conv1d kernels as [C, 1, K]
# (Hugging Face) or [C, K, 1] (MLX). The loader decides the norms from their values, not from
# the conv layout. Each variant of tests/fixtures/qwen35-f32 rewritten here (pure python) must
# reproduce transformers' logits of the fixture prompt within 1e-3 (f32 KV cache):
#   shifted norms + HF conv; shifted norms + MLX conv; raw norms + MLX conv.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
FX=tests/fixtures/qwen35-f32
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
for variant in shift-hf shift-mlx raw-mlx; do
    mkdir "$T/$variant"
    cp $FX/config.json $FX/generation_config.json "$T/$variant/"
    python3 - "$FX/model.safetensors" "$T/$variant/model.safetensors" "$variant" <<'EOF'
import json, struct, sys
src, dst, variant = sys.argv[1:4]
f = open(src, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
shift, mlx_conv = variant.startswith("shift"), variant.endswith("mlx")
zero_centred = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")
out, off = {}, 0
blobs = []
for name in sorted(k for k in h if k != "__metadata__"):
    m = h[name]; f.seek(base + m["data_offsets"][0]); raw = f.read(m["data_offsets"][1] - m["data_offsets"][0])
    assert m["dtype"] == "F32", name
    v = list(struct.unpack("<%df" % (len(raw) // 4), raw)); shape = list(m["shape"])
    if shift and name.endswith(zero_centred):
        v = [x + 1.0 for x in v]
    if mlx_conv and name.endswith("conv1d.weight"):   # [C, 1, K] -> [C, K, 1]: same element order
        shape = [shape[0], shape[2], 1]
    raw = struct.pack("<%df" % len(v), *v)
    out[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(raw)]}
    off += len(raw); blobs.append(raw)
hj = json.dumps(out).encode(); hj += b" " * ((8 - len(hj) % 8) % 8)
with open(dst, "wb") as o:
    o.write(struct.pack("<Q", len(hj))); o.write(hj)
    for b in blobs: o.write(b)
EOF
    if python3 scripts/vs_transformers.py "$G" $FX "$T/$variant" "qwen35-f32 as $variant"
    then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $variant"; fi
done
echo "cli_hybrid_layouts: $pass passed, $fail failed"
[ $fail -eq 0 ]
