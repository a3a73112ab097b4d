#!/usr/bin/env python3
"""Golden fixtures for LoRA adapters (transformers + peft, float32, CPU, eager attention).

Usage:
    python3 scripts/gen_lora_fixtures.py OUT_DIR [FIXTURES_DIR]     # generate (torch, transformers, peft)
    python3 scripts/gen_lora_fixtures.py --convert [FIXTURES_DIR]   # numpy only: the other layouts (below)

FIXTURES_DIR (default tests/fixtures) holds the base fixtures qwen3-f32, qwen35-f32 and qwen3-mlx4.
For each float base B in (qwen3, qwen35) it writes OUT_DIR/lora-B/ with
    a/adapter_config.json + a/adapter_model.safetensors   rank 8, lora_alpha 16, target "all-linear"
                                                            (attention, MLP and, on qwen35, every
                                                            Gated DeltaNet projection)
    b/...                                                  rank 4, lora_alpha 8, use_rslora, a target list
                                                            (q_proj, v_proj, down_proj, in_proj_qkv,
                                                            in_proj_z, out_proj), layers_to_transform [0, 1]
    expected.safetensors   input_ids int32 [20] (the base fixture's prompt), and float32 [20, V] logits
                           at every prompt position: logits_base, logits_a, logits_b, logits_ab (both
                           adapters active at once: peft sums them)
peft initialises lora_B to zero; here every lora_A and lora_B is overwritten with seeded random values so
the adapters change the logits. OUT_DIR/lora-qwen3-mlx4/expected.safetensors: the same for the qwen3-mlx4
base, with the lora-qwen3 adapters, the reference being peft on the base weights DEQUANTIZED in numpy
(w = scale * q + bias, scripts/gen_quant_fixtures.py's mlx_dequantize).

--convert writes adapter a of lora-qwen3 and lora-qwen35 again in mlx-lm's layout (a-mlx/: adapters.safetensors
with <module>.lora_a = A^T [in, r] and .lora_b = B^T [r, out], adapter_config.json with lora_parameters.scale =
lora_alpha / r, as mlx_lm/tuner/lora.py's LoRALinear computes y + scale * (x @ lora_a) @ lora_b), and, for
lora-qwen3, in llama.cpp's GGUF adapter layout (a.gguf: general.type adapter, adapter.type lora,
adapter.lora.alpha, blk.N.<name>.weight.lora_a [r, in] / .lora_b [out, r] in numpy order, as
convert_lora_to_gguf.py writes them; Qwen3 needs no row permutation). Their expected logits are logits_a.
"""

import json
import os
import sys
import traceback

import numpy as np


def log(*a):
    print(*a, flush=True)


SEED = 20261202
ADAPTERS = {
    "a": dict(r=8, lora_alpha=16, target_modules="all-linear", use_rslora=False, layers_to_transform=None),
    "b": dict(r=4, lora_alpha=8, use_rslora=True, layers_to_transform=[0, 1],
              target_modules=["q_proj", "v_proj", "down_proj", "in_proj_qkv", "in_proj_z", "out_proj"]),
}


def main():
    import torch
    import transformers
    import peft
    from safetensors.torch import load_file, save_file
    from peft import LoraConfig, PeftModel, get_peft_model

    out = sys.argv[1]
    fx = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    versions = dict(torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__)
    log("versions", versions)
    summary = dict(versions=versions, fixtures={})

    def load_base(name):
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.join(fx, name), attn_implementation="eager", dtype=torch.float32).to(torch.float32).eval()

    def logits_of(model, ids):
        with torch.no_grad():
            return model(input_ids=ids[None], use_cache=False).logits[0].float().contiguous()

    def randomize(model, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in sorted(model.named_parameters()):
                if "lora_A" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[1] ** 0.5))
                elif "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)

    for base in ("qwen3", "qwen35"):
        try:
            name = f"{base}-f32"
            d = os.path.join(out, f"lora-{base}")
            os.makedirs(d, exist_ok=True)
            ids = load_file(os.path.join(fx, name, "expected.safetensors"))["input_ids"].to(torch.int64)
            m = load_base(name)
            res = {"input_ids": ids.to(torch.int32).contiguous(), "logits_base": logits_of(m, ids)}
            info = {}
            for k, (an, spec) in enumerate(ADAPTERS.items()):
                m = load_base(name)
                cfg = LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"], target_modules=spec["target_modules"],
                                 use_rslora=spec["use_rslora"], layers_to_transform=spec["layers_to_transform"],
                                 lora_dropout=0.0, bias="none")
                torch.manual_seed(SEED + k)
                pm = get_peft_model(m, cfg)
                randomize(pm, SEED + 100 * (k + 1) + (base == "qwen35"))
                pm.eval()
                pm.save_pretrained(os.path.join(d, an))
                res[f"logits_{an}"] = logits_of(pm, ids)
                mods = sorted({n.split(".lora_A")[0] for n, _ in pm.named_parameters() if "lora_A" in n})
                info[an] = dict(n_modules=len(mods), modules=mods,
                                max_delta=float((res[f"logits_{an}"] - res["logits_base"]).abs().max()))
                log(f"  {base} adapter {an}: {len(mods)} modules, max |logits - base| {info[an]['max_delta']:.4f}")
            try:
                m = load_base(name)
                pm = PeftModel.from_pretrained(m, os.path.join(d, "a"), adapter_name="a")
                pm.load_adapter(os.path.join(d, "b"), adapter_name="b")
                pm.base_model.set_adapter(["a", "b"])
                pm.eval()
                res["logits_ab"] = logits_of(pm, ids)
                info["ab_vs_a"] = float((res["logits_ab"] - res["logits_a"]).abs().max())
                log(f"  {base} a+b: max |ab - a| {info['ab_vs_a']:.4f}")
            except Exception:
                traceback.print_exc()
            save_file(res, os.path.join(d, "expected.safetensors"))
            summary["fixtures"][f"lora-{base}"] = info
        except Exception:
            traceback.print_exc()

    # the MLX 4-bit base: peft on the dequantized weights, the lora-qwen3 adapters
    try:
        import gen_quant_fixtures as gq
        st = load_file(os.path.join(fx, "qwen3-mlx4", "model.safetensors"))
        qcfg = json.load(open(os.path.join(fx, "qwen3-mlx4", "config.json")))["quantization"]
        sd = {}
        for n, t in st.items():
            if n.endswith(".scales") or n.endswith(".biases"):
                continue
            mod = n[: -len(".weight")]
            if mod + ".scales" in st:
                ov = qcfg.get(mod, {}) if isinstance(qcfg.get(mod), dict) else {}
                gs, bits = ov.get("group_size", qcfg["group_size"]), ov.get("bits", qcfg["bits"])
                w = gq.mlx_dequantize(t.view(torch.int32).numpy().view(np.uint32), st[mod + ".scales"].float().numpy(),
                                      st[mod + ".biases"].float().numpy(), gs, bits)
                sd[n] = torch.from_numpy(w)
            else:
                sd[n] = t.float()
        m = load_base("qwen3-f32")
        missing, unexpected = m.load_state_dict(sd, strict=False)
        log("  mlx4 deq: missing", missing, "unexpected", unexpected)
        d = os.path.join(out, "lora-qwen3-mlx4")
        os.makedirs(d, exist_ok=True)
        ids = load_file(os.path.join(fx, "qwen3-mlx4", "expected.safetensors"))["input_ids"].to(torch.int64)
        res = {"input_ids": ids.to(torch.int32).contiguous(), "logits_base": logits_of(m, ids)}
        ref = load_file(os.path.join(fx, "qwen3-mlx4", "expected.safetensors"))["logits"]
        log("  mlx4 deq base vs its fixture:", float((res["logits_base"] - ref).abs().max()))
        sd_base = {k: v.clone() for k, v in m.state_dict().items()}
        for an in ADAPTERS:
            m = load_base("qwen3-f32")
            m.load_state_dict(sd_base)
            pm = PeftModel.from_pretrained(m, os.path.join(out, "lora-qwen3", an)).eval()
            res[f"logits_{an}"] = logits_of(pm, ids)
            log(f"  mlx4 adapter {an}: max |logits - base| "
                f"{float((res[f'logits_{an}'] - res['logits_base']).abs().max()):.4f}")
        save_file(res, os.path.join(d, "expected.safetensors"))
    except Exception:
        traceback.print_exc()

    json.dump(summary, open(os.path.join(out, "lora_summary.json"), "w"), indent=1)
    log("done")


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def convert(fx):
    import re
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_quant_fixtures as gq

    def read_st(path):
        hdr, base = gq.read_safetensors_header(path)
        raw = open(path, "rb").read()
        out = {}
        for n, v in hdr.items():
            if n == "__metadata__":
                continue
            assert v["dtype"] == "F32", (n, v["dtype"])
            b, e = v["data_offsets"]
            out[n] = np.frombuffer(raw[base + b: base + e], "<f4").reshape(v["shape"])
        return out

    for base, arch in (("qwen3", "qwen3"), ("qwen35", "qwen35")):
        d = os.path.join(fx, f"lora-{base}")
        cfg = json.load(open(os.path.join(d, "a", "adapter_config.json")))
        t = read_st(os.path.join(d, "a", "adapter_model.safetensors"))
        mods = sorted({n[len("base_model.model."):-len(".lora_A.weight")] for n in t if n.endswith(".lora_A.weight")})
        mlx, gg = {}, []
        for m in mods:
            A = t[f"base_model.model.{m}.lora_A.weight"]
            B = t[f"base_model.model.{m}.lora_B.weight"]
            mlx[m + ".lora_a"] = gq.st_tensor(np.ascontiguousarray(A.T), "float32")
            mlx[m + ".lora_b"] = gq.st_tensor(np.ascontiguousarray(B.T), "float32")
            mm = re.match(r"model\.layers\.(\d+)\.(.*)$", m)
            if mm and mm.group(2) in GGUF_NAMES:
                g = f"blk.{mm.group(1)}.{GGUF_NAMES[mm.group(2)]}.weight"
                gg.append((g + ".lora_a", "f32", A.shape, np.frombuffer(A.astype("<f4").tobytes(), np.uint8)))
                gg.append((g + ".lora_b", "f32", B.shape, np.frombuffer(B.astype("<f4").tobytes(), np.uint8)))
        od = os.path.join(d, "a-mlx")
        os.makedirs(od, exist_ok=True)
        gq.write_safetensors(os.path.join(od, "adapters.safetensors"), mlx)
        keys = sorted({m.split(".layers.")[1].split(".", 1)[1] for m in mods})
        json.dump({"fine_tune_type": "lora", "num_layers": -1,
                   "lora_parameters": {"rank": cfg["r"], "scale": cfg["lora_alpha"] / cfg["r"], "dropout": 0.0,
                                       "keys": keys}}, open(os.path.join(od, "adapter_config.json"), "w"), indent=1)
        log(f"  {od}: {len(mods)} modules")
        if base == "qwen3":
            kvs = [("general.architecture", "str", arch), ("general.type", "str", "adapter"),
                   ("adapter.type", "str", "lora"), ("adapter.lora.alpha", "f32", float(cfg["lora_alpha"]))]
            n = gq.gguf_write(os.path.join(d, "a.gguf"), kvs, gg)
            log(f"  {d}/a.gguf: {len(gg) // 2} modules, {n} bytes")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--convert":
        convert(sys.argv[2] if len(sys.argv) > 2 else
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
    else:
        main()
