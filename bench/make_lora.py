#!/usr/bin/env python3
"""A random PEFT LoRA adapter for a model folder, for benchmarks (bench/README.md: LoRA decode cost).

Usage: python3 bench/make_lora.py MODEL_DIR OUT_DIR [--rank R] [--seed N]
Every attention and MLP projection of every layer (q, k, v, o, gate, up, down; Qwen3.5's Gated
DeltaNet in_proj_qkv / in_proj_z / in_proj_b / in_proj_a / out_proj on its linear-attention layers),
f32 A [r, in] and B [out, r] with small random values, lora_alpha = 2 r. Needs numpy only."""
import json
import os
import struct
import sys

import numpy as np


def main():
    args = sys.argv[1:]
    rank, seed = 16, 1
    if "--rank" in args:
        i = args.index("--rank"); rank = int(args[i + 1]); del args[i:i + 2]
    if "--seed" in args:
        i = args.index("--seed"); seed = int(args[i + 1]); del args[i:i + 2]
    model, out = args
    c = json.load(open(os.path.join(model, "config.json")))
    c = c.get("text_config", c)
    D, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim", D // c["num_attention_heads"])
    Q, KV = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    gated = c.get("model_type", "").startswith("qwen3_5")
    kinds = c.get("layer_types", ["full_attention"] * L)
    mods = {}
    for l in range(L):
        p = f"model.layers.{l}."
        if kinds[l] == "linear_attention":
            nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            mods[p + "linear_attn.in_proj_qkv"] = (D, 2 * nk * dk + nv * dv)
            mods[p + "linear_attn.in_proj_z"] = (D, nv * dv)
            mods[p + "linear_attn.in_proj_b"] = (D, nv)
            mods[p + "linear_attn.in_proj_a"] = (D, nv)
            mods[p + "linear_attn.out_proj"] = (nv * dv, D)
        else:
            mods[p + "self_attn.q_proj"] = (D, 2 * Q if gated else Q)
            mods[p + "self_attn.k_proj"] = (D, KV)
            mods[p + "self_attn.v_proj"] = (D, KV)
            mods[p + "self_attn.o_proj"] = (Q, D)
        mods[p + "mlp.gate_proj"] = (D, F)
        mods[p + "mlp.up_proj"] = (D, F)
        mods[p + "mlp.down_proj"] = (F, D)
    rng = np.random.default_rng(seed)
    header, blobs, off = {}, [], 0
    for m, (n_in, n_out) in sorted(mods.items()):
        for name, shape, std in ((f"base_model.model.{m}.lora_A.weight", (rank, n_in), n_in ** -0.5),
                                 (f"base_model.model.{m}.lora_B.weight", (n_out, rank), 0.01)):
            raw = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype("<f4").tobytes()
            header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
    os.makedirs(out, exist_ok=True)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "use_rslora": False, "bias": "none",
               "target_modules": sorted({m.split(".", 3)[3] for m in mods}), "modules_to_save": None,
               "use_dora": False}, open(os.path.join(out, "adapter_config.json"), "w"), indent=1)
    print(f"{out}: {len(mods)} modules, rank {rank}, {off / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
