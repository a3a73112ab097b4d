#!/usr/bin/env python3
"""Golden fixtures for Gemma 4 text (Gemma4ForCausalLM) with Hugging Face transformers.

Usage:
    python3 scripts/gen_gemma4_fixtures.py OUT_DIR [NAME ...]   (needs torch, transformers >= 5.5, numpy)

Writes OUT_DIR/NAME/ like scripts/gen_fixtures.py (config.json, generation_config.json,
model.safetensors, expected.safetensors with input_ids, logits [20, V], greedy_ids [24],
greedy_margin [24]) and OUT_DIR/gemma4_summary.json. Fixtures:

  gemma4-f32    E2B-shaped: 6 layers S/S/F/S/S/F, sliding_window 6 (< the 20-token prompt), head_dim 16
                (sliding) / global_head_dim 32 (full), RoPE sliding default 1e4, full "proportional"
                (partial_rotary_factor 0.25, theta 1e6), per-layer embeddings (hidden_size_per_layer_input
                64), the last 2 layers share the KV of the last earlier layer of their type
                (num_kv_shared_layers 2) and have double-wide MLPs (use_double_wide_mlp), random
                layer_scalar values, final_logit_softcapping 3.
  gemma4-bf16   gemma4-f32's model saved in bf16 (reference: those bf16 weights upcast, run in f32).
  gemma4-mlx4   gemma4-f32's weights, MLX affine 4-bit group 32, bf16 scales/biases (every 2-D
                tensor quantized, embeddings included; reference on the dequantized weights).
  gemma4-kv-f32 31B-shaped: 4 layers S/F/S/F, attention_k_eq_v with num_global_key_value_heads 1
                (full layers: v = k_proj output), no PLE, no KV sharing, final_logit_softcapping 5.

All reference math is float32, CPU, eager attention. Norm weights are 1 + 0.2 randn (Gemma4RMSNorm
scales by w), matrices N(0, 0.2), layer_scalar U(0.5, 1.5).
"""

import copy
import json
import os
import shutil
import sys
import time
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_fixtures as gf          # noqa: E402
import gen_quant_fixtures as gq    # noqa: E402

import transformers                # noqa: E402

log = gf.log

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=128,
            bos_token_id=2, eos_token_id=1, pad_token_id=0, hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True, sliding_window=6, attention_bias=False)

ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}

E2B = dict(BASE, num_hidden_layers=6,
           layer_types=["sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention", "sliding_attention", "full_attention"],
           global_head_dim=32, hidden_size_per_layer_input=64, vocab_size_per_layer_input=256,
           num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=False,
           final_logit_softcapping=3.0, enable_moe_block=False)

KV31 = dict(BASE, num_hidden_layers=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
            hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
            final_logit_softcapping=5.0, enable_moe_block=False)


def make_config(kw):
    kw = copy.deepcopy(kw)
    kw["rope_parameters"] = copy.deepcopy(ROPE)
    cls = getattr(transformers, "Gemma4TextConfig", None)
    if cls is None:
        from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig as cls
    cfg = cls(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def reinit(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + gf.NORM_STD * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, gf.BIAS_STD)
            elif p.dim() == 2:
                p.normal_(0.0, gf.W_STD)
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))


def build(kw, seed):
    cfg = make_config(kw)
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(torch.float32)
    reinit(m, seed)
    m.eval()
    return m


def load(path):
    m = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    m = m.to(torch.float32)
    m.eval()
    return m


def describe(model):
    d = {}
    for name, t in model.state_dict().items():
        d[name] = [list(t.shape), str(t.dtype)]
    return d


def main(argv):
    out = argv[1]
    only = set(argv[2:])
    # GEMMA4_SRC: where the float fixtures are when only the GGUF one is generated
    only_src = os.environ.get("GEMMA4_SRC")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    versions = dict(torch=torch.__version__, transformers=transformers.__version__, numpy=np.__version__)
    log("versions", versions)
    summary = dict(versions=versions, fixtures={})
    # the exact sources this reference ran (read when writing the C side)
    try:
        import transformers.models.gemma4 as g4
        import transformers.modeling_rope_utils as ru
        src = os.path.join(out, "_src")
        os.makedirs(src, exist_ok=True)
        gd = os.path.dirname(g4.__file__)
        for f in ("modeling_gemma4.py", "configuration_gemma4.py"):
            shutil.copy(os.path.join(gd, f), os.path.join(src, f))
        shutil.copy(ru.__file__, os.path.join(src, "modeling_rope_utils.py"))
    except Exception:  # noqa: BLE001
        traceback.print_exc()

    def finish(name, path, ids, ref, model, extra):
        gf.save_expected(path, ids, ref)
        diff, same, pdiff = gf.consistency(model, ids, ref)
        files = {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}
        info = dict(logits_std=float(ref["logits"].std()), last_margin=float(ref["last_margin"]),
                    min_greedy_margin=float(ref["margins"].min()), greedy_ids=[int(x) for x in ref["greedy"]],
                    cache_vs_nocache=diff, cache_argmax_equal=same, files=files)
        info.update(extra)
        summary["fixtures"][name] = info
        log(f"  {name}: logits std {info['logits_std']:.3f} last margin {info['last_margin']:.4f} "
            f"min greedy margin {info['min_greedy_margin']:.4f} cache diff {diff:.2e} {same}")

    def pick_seed(kw, base_seed):
        best = None
        for seed in range(base_seed, base_seed + 12):
            m = build(kw, seed)
            ids = gf.prompt_ids(kw["vocab_size"])
            ref = gf.reference(m, ids)
            mm = min(float(ref["margins"].min()), ref["last_margin"])
            log(f"  seed {seed}: logits std {float(ref['logits'].std()):.3f} min margin {mm:.5f}")
            if best is None or mm > best[0]:
                best = (mm, seed)
            if mm >= gf.GOOD_MARGIN:
                break
        return best[1]

    for fam, kw, base_seed, names in (("gemma4", E2B, 4400, ("gemma4-f32", "gemma4-bf16", "gemma4-mlx4")),
                                       ("gemma4-kv", KV31, 4500, ("gemma4-kv-f32",))):
        if only and not (only & set(names)):
            continue
        try:
            log(f"\n=== {fam} ===")
            seed = pick_seed(kw, base_seed)
            m = build(kw, seed)
            log("  config:", json.dumps(m.config.to_dict())[:3000])
            # f32
            name = names[0]
            path = os.path.join(out, name)
            m.save_pretrained(path, safe_serialization=True)
            log("  saved config.json:", open(os.path.join(path, "config.json")).read())
            lm = load(path)
            ids = gf.prompt_ids(kw["vocab_size"])
            ref = gf.reference(lm, ids)
            worst = max(float((lm.state_dict()[k].float() - v.float()).abs().max())
                        for k, v in m.state_dict().items() if k in lm.state_dict())
            finish(name, path, ids, ref, lm, dict(seed=seed, reload_max_diff=worst, tensors=describe(lm)))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            continue
        if fam != "gemma4":
            continue
        try:
            name = "gemma4-bf16"
            path = os.path.join(out, name)
            mb = build(kw, seed).to(torch.bfloat16)
            mb.save_pretrained(path, safe_serialization=True)
            lb = load(path)
            ref = gf.reference(lb, ids)
            finish(name, path, ids, ref, lb, dict(seed=seed))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        try:
            # the text tower of Gemma4ForConditionalGeneration (no vision / audio config: transformers
            # builds no towers), as save_pretrained writes it: weights under model.language_model.*
            name = "gemma4-mm-f32"
            path = os.path.join(out, name)
            tc = load(os.path.join(out, "gemma4-f32"))
            mc = transformers.Gemma4Config(text_config=tc.config.to_dict(), vision_config=None, audio_config=None)
            mm = transformers.Gemma4ForConditionalGeneration(mc).to(torch.float32)
            missing = mm.model.language_model.load_state_dict(tc.model.state_dict(), strict=False)
            log("  mm load:", missing)
            mm.eval()
            mm.config._attn_implementation = "eager"
            for sub in mm.modules():
                if hasattr(sub, "config") and hasattr(sub.config, "_attn_implementation"):
                    sub.config._attn_implementation = "eager"
            mm.save_pretrained(path, safe_serialization=True)
            ref = gf.reference(mm, ids)
            finish(name, path, ids, ref, mm, dict(seed=seed, tensors=describe(mm)))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        try:
            name = "gemma4-mlx4"
            path = os.path.join(out, name)
            os.makedirs(path, exist_ok=True)
            src = os.path.join(out, "gemma4-f32")
            base = load(src)
            params = {n: t.detach().float().cpu().numpy().copy() for n, t in base.state_dict().items()}
            if base.config.tie_word_embeddings:
                params.pop("lm_head.weight", None)
            cfgd = json.load(open(os.path.join(src, "config.json")))
            spec = dict(dtype="bfloat16", group_size=32, bits=4, mode=True, overrides={})
            deq, qinfo, q = gq.build_mlx(path, params, spec, cfgd, src)
            # NOTE: the committed model.safetensors was then rewritten with the 4-byte tensors first
            # (same bytes, other order): the 1-element bf16 layer_scalar tensors otherwise leave the
            # U32 weights after them 2-byte aligned, which gerbil refuses
            sd = base.state_dict()
            with torch.no_grad():
                for n, arr in deq.items():
                    sd[n].copy_(torch.from_numpy(arr))
                if base.config.tie_word_embeddings:
                    base.tie_weights()
            ref = gf.reference(base, ids)
            finish(name, path, ids, ref, base, dict(quantization=q, tensors=qinfo))
        except Exception:  # noqa: BLE001
            traceback.print_exc()

    # GGUF Q8_0 of gemma4-f32 (llama.cpp's gemma4 layout, scripts/gen_gemma4_gguf.py): every 2-D
    # tensor Q8_0, the rest F32; reference = transformers on the weights dequantized from those bytes
    for src_name, name in (("gemma4-f32", "gemma4-gguf-q8_0"),):
        if only and name not in only:
            continue
        try:
            import gen_gemma4_gguf as gg
            src = os.path.join(only_src or out, src_name)
            deq = {}

            def enc(hf, shape, data, deq=deq):
                w = np.frombuffer(data, "<f4").reshape(shape)
                raw = gq.ggml_encode(w, "q8_0")
                deq[hf] = gq.ggml_decode(raw, "q8_0", tuple(shape))
                return "Q8_0", raw.tobytes()

            path = os.path.join(out, name)
            gg.convert(src, path, encode=enc)
            m = load(src)
            sd = m.state_dict()
            with torch.no_grad():
                for n, arr in deq.items():
                    sd[n].copy_(torch.from_numpy(np.ascontiguousarray(arr)))
            ids = gf.prompt_ids(m.config.vocab_size)
            ref = gf.reference(m, ids)
            errs = {n: float(np.sqrt(((deq[n] - sd_f) ** 2).mean() / (sd_f ** 2).mean()))
                    for n, sd_f in ((n, load(src).state_dict()[n].numpy()) for n in list(deq)[:4])}
            finish(name, path, ids, ref, m, dict(kind="gguf", ftype="q8_0", rel_rms_err_sample=errs))
        except Exception:  # noqa: BLE001
            traceback.print_exc()

    json.dump(summary, open(os.path.join(out, "gemma4_summary.json"), "w"), indent=1)
    log("done")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main(sys.argv)
    log(f"total {time.time() - t0:.1f}s")
    sys.exit(rc)
