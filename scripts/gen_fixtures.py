#!/usr/bin/env python3
"""Generate golden test fixtures for gerbil with Hugging Face transformers.

Usage:
    python3 scripts/gen_fixtures.py OUT_DIR [NAME ...]

For every fixture NAME this writes OUT_DIR/NAME/ holding
  config.json, generation_config.json, model weights (save_pretrained, safetensors)
  expected.safetensors with
    input_ids      int32   [T]      fixed prompt (T = 20, ids in [3, vocab))
    logits         float32 [T, V]   logits of one full forward of the prompt
    greedy_ids     int32   [24]     greedy continuation computed with the KV cache
    greedy_margin  float32 [24]     top1 - top2 logit at each greedy step
and OUT_DIR/README.md describing everything.

All reference math runs in float32 on the CPU with attn_implementation="eager".
bf16 fixtures store bf16 weights; their reference is computed by loading those
bf16 weights back, upcasting to float32 and running in float32.
"""

import copy
import json
import math
import os
import shutil
import sys
import time
import traceback

import torch

import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from safetensors.torch import save_file, load_file

T_PROMPT = 20
N_GREEDY = 24
VOCAB = 256
PROMPT_SEED = 20240601
W_STD = 0.2          # std of every Linear / Embedding weight
BIAS_STD = 0.1       # std of every bias
NORM_STD = 0.2       # norm weights = 1 + NORM_STD * randn
GOOD_MARGIN = 1e-2   # preferred minimum margin
MIN_MARGIN = 1e-3    # hard requirement
MAX_SEEDS = 24

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
DEVICE = torch.device("cpu")

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    hidden_act="silu",
)


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------
# fixture specifications
# --------------------------------------------------------------------------------------

def specs():
    S = []

    def add(name, model_type, rope, extra, dtype="float32", shard=False, layers=3, base_seed=0,
            desc="", pair=None):
        kw = dict(COMMON)
        kw["num_hidden_layers"] = layers
        kw.update(extra)
        S.append(dict(name=name, model_type=model_type, rope=rope, kw=kw, dtype=dtype,
                      shard=shard, base_seed=base_seed, desc=desc, pair=pair))

    # family fixtures: f32 + bf16 share one seed search
    llama_kw = dict(tie_word_embeddings=False)
    add("llama-f32", "llama", {"rope_type": "default", "rope_theta": 10000.0}, llama_kw,
        shard=True, base_seed=100, desc="Llama, GQA 4q/2kv, head_dim 16, untied, saved SHARDED", pair="bfloat16")
    add("llama-bf16", "llama", {"rope_type": "default", "rope_theta": 10000.0}, llama_kw,
        dtype="bfloat16", base_seed=100, desc="llama-f32 model cast to bf16")

    mistral_kw = dict(tie_word_embeddings=False, sliding_window=8)
    add("mistral-f32", "mistral", {"rope_type": "default", "rope_theta": 1e6}, mistral_kw,
        base_seed=200, desc="Mistral, sliding_window 8, untied", pair="bfloat16")
    add("mistral-bf16", "mistral", {"rope_type": "default", "rope_theta": 1e6}, mistral_kw,
        dtype="bfloat16", base_seed=200, desc="mistral-f32 model cast to bf16")

    qwen2_kw = dict(tie_word_embeddings=True, use_sliding_window=False)
    add("qwen2-f32", "qwen2", {"rope_type": "default", "rope_theta": 1e6}, qwen2_kw,
        base_seed=300, desc="Qwen2, tied embeddings, q/k/v biases", pair="bfloat16")
    add("qwen2-bf16", "qwen2", {"rope_type": "default", "rope_theta": 1e6}, qwen2_kw,
        dtype="bfloat16", base_seed=300, desc="qwen2-f32 model cast to bf16")

    qwen3_kw = dict(tie_word_embeddings=True, head_dim=32, use_sliding_window=False)
    add("qwen3-f32", "qwen3", {"rope_type": "default", "rope_theta": 1e6}, qwen3_kw,
        base_seed=400, desc="Qwen3, tied, head_dim 32 != hidden/heads, q_norm/k_norm", pair="bfloat16")
    add("qwen3-bf16", "qwen3", {"rope_type": "default", "rope_theta": 1e6}, qwen3_kw,
        dtype="bfloat16", base_seed=400, desc="qwen3-f32 model cast to bf16")

    # RoPE variants (f32, Llama, 2 layers)
    add("llama-rope-linear", "llama",
        {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        dict(tie_word_embeddings=False), layers=2, base_seed=500,
        desc="Llama 2 layers, linear RoPE scaling factor 4")
    add("llama-rope-dynamic", "llama",
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        dict(tie_word_embeddings=False, max_position_embeddings=16), layers=2, base_seed=600,
        desc="Llama 2 layers, dynamic NTK factor 2, max_position_embeddings 16")
    # llama3: head_dim 16, theta 1e4 -> wavelengths 2*pi*1e4^(i/8) = 6.28, 19.9, 62.8, ...
    # original_max 32, low 1, high 4 -> high_freq_wavelen 8, low_freq_wavelen 32:
    #   i=0 (6.28) kept, i=1 (19.9) smoothed, i>=2 divided by factor: all three bands.
    add("llama-rope-llama3", "llama",
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 32, "rope_theta": 10000.0},
        dict(tie_word_embeddings=False, max_position_embeddings=128), layers=2, base_seed=700,
        desc="Llama 2 layers, llama3 RoPE factor 8 (all three frequency bands)")
    # yarn: with original_max 64, dim 16, theta 1e4 the correction range is [0, 3], so the
    # ramp has fractional entries (1/3, 2/3); with original_max 16 it would be [0, 1] (no
    # fractional entries).
    add("llama-rope-yarn", "llama",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "rope_theta": 10000.0},
        dict(tie_word_embeddings=False, max_position_embeddings=256), layers=2, base_seed=800,
        desc="Llama 2 layers, YaRN factor 4, original_max_position_embeddings 64")
    # Gemma 3 (gemma3_text): 4 layers sliding/sliding/full/sliding, window 6 < the 20-token prompt,
    # query_pre_attn_scalar 24 != head_dim, local RoPE base 1e4 and global 1e6 with linear factor 8
    # (global layers only), (1 + w) norms, GELU-tanh, embeddings scaled by sqrt(hidden), tied.
    gemma_kw = dict(tie_word_embeddings=True, sliding_window=6, query_pre_attn_scalar=24,
                    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])
    add("gemma3-f32", "gemma3_text", GEMMA_ROPE, gemma_kw, layers=4, base_seed=900, pair="bfloat16",
        desc="Gemma 3 text, 4 layers S/S/F/S, sliding_window 6, local/global RoPE 1e4/1e6 (global linear x8), "
             "query_pre_attn_scalar 24, tied")
    add("gemma3-bf16", "gemma3_text", GEMMA_ROPE, gemma_kw, dtype="bfloat16", layers=4, base_seed=900,
        desc="gemma3-f32 model cast to bf16")
    # final_logit_softcapping is applied by transformers; attn_logit_softcapping is in the config but
    # Gemma3Attention never passes it to the attention function, so it has no effect (checked below).
    add("gemma3-softcap-f32", "gemma3_text", GEMMA_ROPE,
        dict(gemma_kw, final_logit_softcapping=5.0, attn_logit_softcapping=2.0,
             layer_types=["sliding_attention", "full_attention"]), layers=2, base_seed=950,
        desc="Gemma 3 text, 2 layers S/F, final_logit_softcapping 5, attn_logit_softcapping 2 (ignored by transformers)")
    return S


GEMMA_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


# --------------------------------------------------------------------------------------
# model construction
# --------------------------------------------------------------------------------------

def rope_dict_of(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if rp:
        return dict(rp)
    rs = getattr(cfg, "rope_scaling", None)
    out = dict(rs) if rs else {}
    if getattr(cfg, "rope_theta", None) is not None:
        out.setdefault("rope_theta", cfg.rope_theta)
    return out


def make_gemma3_config(kw, rope):
    """Gemma3TextConfig with per-layer-type RoPE (transformers 5 rope_parameters), or the older
    rope_theta / rope_scaling / rope_local_base_freq keys; checked against what was asked."""
    kw = {k: v for k, v in kw.items() if k != "hidden_act"}
    full, slide = rope["full_attention"], rope["sliding_attention"]
    old = dict(kw, rope_theta=full["rope_theta"], rope_local_base_freq=slide["rope_theta"])
    if full.get("rope_type", "default") != "default":
        old["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
    errors = []
    for label, k in (("rope_parameters", dict(kw, rope_parameters=copy.deepcopy(rope))), ("legacy", old)):
        try:
            cfg = AutoConfig.for_model("gemma3_text", **copy.deepcopy(k))
        except Exception as e:  # noqa: BLE001
            errors.append(f"{label}: {e!r}")
            continue
        rp = getattr(cfg, "rope_parameters", None) or {}
        ok = all(isinstance(rp.get(t), dict) and all(rp[t].get(a) == b for a, b in rope[t].items()) for t in rope)
        if ok:
            return cfg, label
        errors.append(f"{label}: rope_parameters {rp}")
    raise RuntimeError("could not build gemma3 config: " + " | ".join(errors))


def make_config(model_type, kw, rope):
    if model_type == "gemma3_text":
        return make_gemma3_config(kw, rope)
    want_type = rope.get("rope_type", "default")
    errors = []
    attempts = []
    kw1 = dict(kw)
    kw1["rope_parameters"] = dict(rope)
    attempts.append(("rope_parameters", kw1))
    kw2 = dict(kw)
    kw2["rope_theta"] = rope["rope_theta"]
    if want_type != "default":
        rs = {k: v for k, v in rope.items() if k != "rope_theta"}
        kw2["rope_scaling"] = rs
    attempts.append(("rope_scaling", kw2))
    for label, k in attempts:
        try:
            cfg = AutoConfig.for_model(model_type, **copy.deepcopy(k))
        except Exception as e:  # noqa: BLE001
            errors.append(f"{label}: {e!r}")
            continue
        rd = rope_dict_of(cfg)
        got_type = rd.get("rope_type", rd.get("type", "default"))
        ok = (got_type == want_type
              and abs(float(rd.get("rope_theta", -1)) - float(rope["rope_theta"])) < 1e-6
              and all(rd.get(key) == val for key, val in rope.items()
                      if key not in ("rope_type", "rope_theta")))
        if ok:
            return cfg, label
        errors.append(f"{label}: config rope dict mismatch: {rd}")
    raise RuntimeError("could not build config: " + " | ".join(errors))


def reinit_(model, seed):
    centre = 0.0 if getattr(model.config, "model_type", "") == "gemma3_text" else 1.0
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma 3 norms scale by (1 + w): centre w at 0 there, at 1 elsewhere
                p.copy_(centre + NORM_STD * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, BIAS_STD)
            elif p.dim() == 2:
                p.normal_(0.0, W_STD)
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def build_model(cfg, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32)
    reinit_(model, seed)
    model.eval()
    return model


def load_model(path):
    last = None
    for kw in ({"dtype": torch.float32}, {"torch_dtype": torch.float32}):
        try:
            m = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **kw)
            m = m.to(torch.float32).to(DEVICE)
            m.eval()
            return m
        except TypeError as e:
            last = e
    raise last


# --------------------------------------------------------------------------------------
# reference computation
# --------------------------------------------------------------------------------------

def prompt_ids(vocab):
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return torch.randint(3, vocab, (T_PROMPT,), generator=g, dtype=torch.int64)


def top2(v):
    t = torch.topk(v, 2)
    return int(t.indices[0]), float(t.values[0] - t.values[1])


@torch.no_grad()
def reference(model, ids):
    # 1. full forward of the prompt
    out = model(input_ids=ids[None].to(DEVICE), use_cache=False)
    logits = out.logits[0].float().cpu().clone()
    _, last_margin = top2(logits[-1])
    rot = rotary_info(model)
    # 2. greedy loop with the KV cache
    out = model(input_ids=ids[None].to(DEVICE), use_cache=True)
    past = out.past_key_values
    cur = out.logits[0, -1].float().cpu()
    greedy, margins, step_logits = [], [], []
    for i in range(N_GREEDY):
        tok, m = top2(cur)
        greedy.append(tok)
        margins.append(m)
        step_logits.append(cur.clone())
        if i == N_GREEDY - 1:
            break
        out = model(input_ids=torch.tensor([[tok]], device=DEVICE), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
        cur = out.logits[0, -1].float().cpu()
    return dict(logits=logits, last_margin=last_margin,
                greedy=torch.tensor(greedy, dtype=torch.int64),
                margins=torch.tensor(margins, dtype=torch.float32),
                step_logits=torch.stack(step_logits), rot=rot)


@torch.no_grad()
def consistency(model, ids, ref):
    """No-cache forward over prompt + greedy[:-1]; compare with the cached greedy logits."""
    full = torch.cat([ids, ref["greedy"][:-1]])
    out = model(input_ids=full[None].to(DEVICE), use_cache=False)
    lg = out.logits[0, T_PROMPT - 1:].float().cpu()
    diff = float((lg - ref["step_logits"]).abs().max())
    same = bool(torch.equal(lg.argmax(-1), ref["greedy"]))
    pdiff = float((out.logits[0, :T_PROMPT].float().cpu() - ref["logits"]).abs().max())
    return diff, same, pdiff


@torch.no_grad()
def attention_span(model, ids):
    """Number of keys the last query attends to in layer 0 (eager attentions)."""
    try:
        out = model(input_ids=ids[None].to(DEVICE), use_cache=False, output_attentions=True)
        att = out.attentions
        if not att:
            return None
        a = att[0][0, 0, -1]
        nz = (a > 0).nonzero().flatten().tolist()
        return dict(count=len(nz), first=nz[0] if nz else None, last=nz[-1] if nz else None)
    except Exception as e:  # noqa: BLE001
        return f"n/a ({e!r})"


def rotary_info(model):
    info = {}
    try:
        re_ = model.model.rotary_emb
        inv = getattr(re_, "inv_freq", None)
        info["inv_freq"] = [float(x) for x in inv.flatten()] if inv is not None else None
        info["attention_scaling"] = float(getattr(re_, "attention_scaling", float("nan")))
        info["rope_type"] = str(getattr(re_, "rope_type", "?"))
    except Exception as e:  # noqa: BLE001
        info["error"] = repr(e)
    return info


@torch.no_grad()
def attn_softcap_effect(model, ids):
    """Max |logit change| when attn_logit_softcapping is set to 0.5 (or removed, when set): 0 means
    transformers does not apply it for this architecture."""
    base = model(input_ids=ids[None].to(DEVICE), use_cache=False).logits.float()
    old = model.config.attn_logit_softcapping
    new = None if old is not None else 0.5
    holders = [model.config] + [m for m in model.modules() if hasattr(m, "attn_logit_softcapping")]
    for h in holders:
        h.attn_logit_softcapping = new
    try:
        other = model(input_ids=ids[None].to(DEVICE), use_cache=False).logits.float()
    finally:
        for h in holders:
            h.attn_logit_softcapping = old
    return float((base - other).abs().max())


def default_inv_freq(theta, dim):
    return [1.0 / (theta ** (i / dim)) for i in range(0, dim, 2)]


# --------------------------------------------------------------------------------------
# saving
# --------------------------------------------------------------------------------------

def set_cfg_dtype(cfg, dtype):
    try:
        cfg.dtype = dtype
    except Exception:  # noqa: BLE001
        cfg.torch_dtype = dtype


def save_model(model, path, dtype, shard):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    m = copy.deepcopy(model)
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    m = m.to(tdt)
    set_cfg_dtype(m.config, tdt)
    if shard:
        for size in ("300KB", "250KB", "200KB", "150KB"):
            m.save_pretrained(path, max_shard_size=size)
            if os.path.exists(os.path.join(path, "model.safetensors.index.json")):
                break
            shutil.rmtree(path)
            os.makedirs(path)
        else:
            raise RuntimeError("sharded save produced no index.json")
    else:
        m.save_pretrained(path)
    if not os.path.exists(os.path.join(path, "generation_config.json")):
        try:
            m.generation_config.save_pretrained(path)
        except Exception as e:  # noqa: BLE001
            log("  generation_config save failed:", repr(e))
    if not os.path.exists(os.path.join(path, "generation_config.json")):
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": m.config.bos_token_id, "eos_token_id": m.config.eos_token_id,
                       "transformers_version": transformers.__version__}, f, indent=2)
    return m


def check_reload(saved_model, loaded):
    sd_a = {k: v.float() for k, v in saved_model.state_dict().items()}
    sd_b = loaded.state_dict()
    worst = 0.0
    for k, v in sd_a.items():
        if k not in sd_b:
            raise RuntimeError(f"reloaded model lacks {k}")
        if "rotary" in k:
            continue
        worst = max(worst, float((v - sd_b[k].float()).abs().max()))
    return worst


def save_expected(path, ids, ref):
    save_file({
        "input_ids": ids.to(torch.int32).contiguous(),
        "logits": ref["logits"].to(torch.float32).contiguous(),
        "greedy_ids": ref["greedy"].to(torch.int32).contiguous(),
        "greedy_margin": ref["margins"].to(torch.float32).contiguous(),
    }, os.path.join(path, "expected.safetensors"))
    back = load_file(os.path.join(path, "expected.safetensors"))
    assert back["logits"].shape == (T_PROMPT, ref["logits"].shape[1])
    assert back["greedy_ids"].shape == (N_GREEDY,)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

def evaluate(spec, cfg, seed, tmpdir):
    """Build the f32 model for seed, save it as the spec dtype, reload, compute reference."""
    model = build_model(cfg, seed)
    path = os.path.join(tmpdir, f"{spec['name']}-seed{seed}")
    saved = save_model(model, path, spec["dtype"], spec["shard"])
    loaded = load_model(path)
    worst = check_reload(saved, loaded)
    ids = prompt_ids(cfg.vocab_size)
    ref = reference(loaded, ids)
    return model, path, loaded, ids, ref, worst


def run_fixture(spec, outdir, tmpdir, seed_cache):
    name = spec["name"]
    log(f"\n=== {name} ({spec['model_type']}, {spec['dtype']}) ===")
    cfg, how = make_config(spec["model_type"], spec["kw"], spec["rope"])
    log(f"  config built via {how}; rope dict: {rope_dict_of(cfg)}")
    # seed search (bf16 fixture reuses the seed of its f32 sibling when it works)
    key = (spec["model_type"], spec["base_seed"])
    candidates = []
    if key in seed_cache:
        candidates.append(seed_cache[key])
    candidates += [spec["base_seed"] + i for i in range(MAX_SEEDS) if spec["base_seed"] + i not in candidates]
    best = None
    chosen = None
    for seed in candidates:
        try:
            res = evaluate(spec, cfg, seed, tmpdir)
        except Exception:
            log(f"  seed {seed}: FAILED\n" + traceback.format_exc())
            raise
        ref = res[4]
        mm = min(float(ref["margins"].min()), ref["last_margin"])
        log(f"  seed {seed}: logits std {float(ref['logits'].std()):.3f}, min margin {mm:.5f}")
        if spec.get("pair"):
            # the sibling fixture (same model, other dtype) must pass with the same seed
            sib = dict(spec, dtype=spec["pair"], shard=False, name=spec["name"] + "-pair")
            sref = evaluate(sib, cfg, seed, tmpdir)[4]
            smm = min(float(sref["margins"].min()), sref["last_margin"])
            log(f"  seed {seed}: {spec['pair']} sibling min margin {smm:.5f}")
            mm = min(mm, smm)
        if best is None or mm > best[0]:
            best = (mm, seed, res)
        if mm >= GOOD_MARGIN or (seed == seed_cache.get(key) and mm >= MIN_MARGIN):
            chosen = (mm, seed, res)
            break
    if chosen is None:
        if best is not None and best[0] >= MIN_MARGIN:
            chosen = best
        else:
            raise RuntimeError(f"{name}: no seed reached margin {MIN_MARGIN} (best {best[0] if best else None})")
    mm, seed, (model, path, loaded, ids, ref, worst) = chosen
    seed_cache.setdefault(key, seed)

    final = os.path.join(outdir, name)
    if os.path.isdir(final):
        shutil.rmtree(final)
    shutil.copytree(path, final)
    save_expected(final, ids, ref)

    diff, same, pdiff = consistency(loaded, ids, ref)
    span = attention_span(loaded, ids)
    rot = ref["rot"]
    with open(os.path.join(final, "config.json")) as f:
        saved_cfg = json.load(f)
    files = {fn: os.path.getsize(os.path.join(final, fn)) for fn in sorted(os.listdir(final))}
    tied = None
    try:
        tied = loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    except Exception:  # noqa: BLE001
        pass
    param_names = [k for k, _ in loaded.named_parameters()]
    has_bias = any(k.endswith("q_proj.bias") for k in param_names)
    has_qknorm = any("q_norm" in k for k in param_names)

    rope_keys = {k: saved_cfg[k] for k in ("rope_parameters", "rope_scaling", "rope_theta")
                 if k in saved_cfg}
    info = dict(
        name=name, desc=spec["desc"], model_type=spec["model_type"], dtype=spec["dtype"],
        architectures=saved_cfg.get("architectures"), seed=seed,
        T=T_PROMPT, V=int(ref["logits"].shape[1]),
        logits_std=float(ref["logits"].std()),
        logits_absmax=float(ref["logits"].abs().max()),
        prompt_last_margin=ref["last_margin"],
        min_greedy_margin=float(ref["margins"].min()),
        greedy_ids=ref["greedy"].tolist(),
        input_ids=ids.tolist(),
        reload_max_weight_diff=worst,
        cache_vs_nocache_max_logit_diff=diff, cache_vs_nocache_argmax_equal=same,
        prompt_logits_reforward_diff=pdiff,
        layer0_last_query_attention=span,
        rotary=rot,
        rope_config=rope_keys,
        sliding_window=saved_cfg.get("sliding_window", "absent"),
        use_sliding_window=saved_cfg.get("use_sliding_window", "absent"),
        layer_types=saved_cfg.get("layer_types", "absent"),
        max_window_layers=saved_cfg.get("max_window_layers", "absent"),
        tie_word_embeddings=saved_cfg.get("tie_word_embeddings", "absent"),
        tied_in_model=tied,
        head_dim=saved_cfg.get("head_dim", "absent"),
        num_hidden_layers=saved_cfg.get("num_hidden_layers"),
        max_position_embeddings=saved_cfg.get("max_position_embeddings"),
        saved_dtype=saved_cfg.get("dtype", saved_cfg.get("torch_dtype", "absent")),
        qkv_bias=has_bias, qk_norm=has_qknorm,
        files=files, total_bytes=sum(files.values()),
    )
    if "full_attention" in spec["rope"]:
        info["attn_softcap_effect"] = attn_softcap_effect(loaded, ids)
    elif spec["rope"].get("rope_type", "default") != "default":
        head_dim = spec["kw"]["head_dim"]
        info["default_inv_freq"] = default_inv_freq(spec["rope"]["rope_theta"], head_dim)
    log(json.dumps({k: v for k, v in info.items() if k not in ("input_ids",)}, indent=1))
    return info


MM_FIXTURES = ("gemma3-mm-f32", "gemma3-mm-renamed-f32", "gemma3-oldcfg-f32")


@torch.no_grad()
def make_mm_fixtures(outdir, only):
    """The text weights of gemma3-f32 inside Gemma3ForConditionalGeneration checkpoints (vision weights
    present, to be ignored by a text engine):
      gemma3-mm-f32          transformers' own class, saved by save_pretrained (transformers 5.17 writes
                             the checkpoint layout: language_model.model.*, vision_tower.*), its
                             reference computed by that model;
      gemma3-mm-renamed-f32  weights under model.language_model.* (the module layout of transformers 5,
                             used by some re-saved checkpoints), written by renaming the tensors;
                             reference = gemma3-f32's (the same text model);
      gemma3-oldcfg-f32      gemma3-f32 with a transformers 4.x style config (see below)."""
    src = os.path.join(outdir, "gemma3-f32")
    text_cfg = json.load(open(os.path.join(src, "config.json")))
    sd = load_file(os.path.join(src, "model.safetensors"))
    tc = {k: v for k, v in text_cfg.items()
          if k not in ("architectures", "dtype", "torch_dtype", "transformers_version")}
    vc = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
    mm_kw = dict(mm_tokens_per_image=4, image_token_index=255, boi_token_index=253, eoi_token_index=254)
    infos = []
    ids = prompt_ids(text_cfg["vocab_size"])
    name = "gemma3-oldcfg-f32"
    if not only or name in only:
        # gemma3-f32 with the config keys of the released Gemma 3 checkpoints (transformers 4.x):
        # sliding_window_pattern instead of layer_types (full where (i + 1) % 3 == 0: S S F S),
        # rope_theta + rope_scaling for the global layers, rope_local_base_freq for the sliding ones
        final = os.path.join(outdir, name)
        if os.path.isdir(final):
            shutil.rmtree(final)
        shutil.copytree(src, final)
        old_cfg = {k: v for k, v in text_cfg.items()
                   if k not in ("layer_types", "rope_parameters", "_sliding_window_pattern")}
        old_cfg.update(sliding_window_pattern=3, rope_theta=1e6, rope_local_base_freq=10000.0,
                       rope_scaling={"rope_type": "linear", "factor": 8.0})
        json.dump(old_cfg, open(os.path.join(final, "config.json"), "w"), indent=2)
        loaded = load_model(final)
        ref = reference(loaded, ids)
        text_ref = load_file(os.path.join(src, "expected.safetensors"))
        d = float((ref["logits"] - text_ref["logits"]).abs().max())
        save_expected(final, ids, ref)
        infos.append(dict(name=name, vs_text_logits=d, layer_types_seen=list(loaded.config.layer_types),
                          rope_parameters_seen=loaded.config.rope_parameters))
        log(json.dumps(infos[-1], indent=1))
    name = "gemma3-mm-renamed-f32"
    if not only or name in only:
        final = os.path.join(outdir, name)
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.makedirs(final)
        out = {"model.language_model." + k[len("model."):]: v.contiguous() for k, v in sd.items()}
        out["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(16)
        out["model.multi_modal_projector.mm_input_projection_weight"] = torch.zeros(16, text_cfg["hidden_size"])
        save_file(out, os.path.join(final, "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3",
                   text_config=dict(tc, model_type="gemma3_text"), vision_config=vc, dtype="float32", **mm_kw)
        json.dump(cfg, open(os.path.join(final, "config.json"), "w"), indent=2)
        for f in ("generation_config.json", "expected.safetensors"):
            shutil.copy(os.path.join(src, f), os.path.join(final, f))
        infos.append(dict(name=name, note="renamed copy of gemma3-f32; expected = gemma3-f32's",
                          files={f: os.path.getsize(os.path.join(final, f)) for f in sorted(os.listdir(final))}))
        log(json.dumps(infos[-1], indent=1))
    name = "gemma3-mm-f32"
    if not only or name in only:
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration
        cfg = Gemma3Config(text_config=dict(tc), vision_config={k: v for k, v in vc.items() if k != "model_type"},
                           **mm_kw)
        torch.manual_seed(0)
        mm = Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation="eager").to(torch.float32)
        lm = mm.model.language_model
        missing, unexpected = lm.load_state_dict({k[len("model."):]: v for k, v in sd.items()}, strict=False)
        log(f"  {name}: language_model load: missing {missing}, unexpected {unexpected}")
        if missing or unexpected:
            raise RuntimeError(f"{name}: text weights do not fit the language model")
        if mm.lm_head.weight.data_ptr() != lm.embed_tokens.weight.data_ptr():
            mm.lm_head.weight.copy_(lm.embed_tokens.weight)
        mm.eval()
        ref = reference(mm, ids)
        text_ref = load_file(os.path.join(src, "expected.safetensors"))
        d = float((ref["logits"] - text_ref["logits"]).abs().max())
        log(f"  {name}: max |logits - gemma3-f32 logits| = {d:.3g}")
        final = os.path.join(outdir, name)
        if os.path.isdir(final):
            shutil.rmtree(final)
        mm.save_pretrained(final)
        save_expected(final, ids, ref)
        keys = sorted(load_file(os.path.join(final, "model.safetensors")).keys())
        infos.append(dict(name=name, vs_text_logits=d, greedy_ids=ref["greedy"].tolist(),
                          min_greedy_margin=float(ref["margins"].min()), n_tensors=len(keys),
                          prefixes=sorted({".".join(k.split(".")[:2]) for k in keys}),
                          files={f: os.path.getsize(os.path.join(final, f)) for f in sorted(os.listdir(final))}))
        log(json.dumps(infos[-1], indent=1))
    return infos


NOTES = [
    "- RoPE config: transformers 5.x writes a single `rope_parameters` dict (holding `rope_type`, `rope_theta` and the",
    "  scaling keys) into config.json; there is no top-level `rope_theta` and no `rope_scaling` key any more.",
    "  Older checkpoints use `rope_scaling` (+ top-level `rope_theta`); an engine should accept both.",
    "- Mistral sliding window (`sliding_window: 8`): query i attends to keys j with i - 8 < j <= i (8 keys including",
    "  itself); checked from layer-0 attention weights of the last prompt query (keys 12..19 of 0..19). Greedy with the",
    "  KV cache matches a no-cache forward to ~1e-5.",
    "- Qwen2/Qwen3 configs carry `use_sliding_window: false`, `sliding_window: null`, `max_window_layers: 28` and",
    "  `layer_types` (all `full_attention`): no windowing. Qwen2 q/k/v projections have biases (o_proj has none).",
    "- Qwen3: `head_dim` 32 while hidden/heads = 16, so q_proj is [128, 64], k/v_proj [64, 64], o_proj [64, 128];",
    "  q_norm/k_norm are RMSNorms over head_dim applied per head before RoPE.",
    "- Tied fixtures (qwen2, qwen3) save no `lm_head.weight`; the output projection is `model.embed_tokens.weight`.",
    "- dynamic RoPE: inv_freq is recomputed per forward CALL from L = max(position_ids) + 1 whenever L exceeds the",
    "  largest L seen so far (initially max_position_embeddings = 16): base' = base * (factor*L/16 - (factor-1))^(d/(d-2)),",
    "  d = head_dim. The full prompt forward (`logits`) uses L = 20 for all 20 positions; in the cached greedy loop each",
    "  new token is rotated with L = its position + 1 while cached keys keep the rotation of the call that produced",
    "  them. So for this fixture the cached greedy logits differ from a no-cache forward of prompt+greedy (by design).",
    "- llama3 RoPE: `original_max_position_embeddings` is 32 (not 16): with head_dim 16, theta 1e4 the wavelengths are",
    "  2*pi*1e4^(i/8) = 6.28, 19.9, 62.8, ...; high_freq_wavelen = 32/4 = 8 and low_freq_wavelen = 32/1 = 32, so",
    "  i=0 is kept, i=1 is smoothed (smooth = (32/19.87 - 1)/3) and i>=2 are divided by 8: all three bands occur.",
    "- YaRN: `original_max_position_embeddings` 64 and `max_position_embeddings` 256 (instead of 16/64) so that the",
    "  correction range (beta_fast 32, beta_slow 1, computed with original_max) is [0, 3] and the ramp has fractional",
    "  entries; with 16 it would be [0, 1] with no fractional entry. `factor` is taken from the dict (4), not from",
    "  max/original. attention_scaling = 0.1*ln(4) + 1 = 1.1386 multiplies both cos and sin.",
    "- linear RoPE: inv_freq / factor. All other fixtures use default RoPE (rotate_half / NeoX layout, as in HF Llama).",
]


def fmt_list(xs, n=6):
    return "[" + ", ".join(f"{x:.6g}" for x in xs) + "]"


def write_readme(outdir, infos, failures, versions, argv):
    L = []
    L.append("# gerbil golden test fixtures\n")
    L.append("Generated by `scripts/gen_fixtures.py` with Hugging Face transformers; do not edit by hand.\n")
    L.append("## How they were generated\n")
    L.append("On the GPU device machine (the computation itself runs in float32 on the CPU, eager attention):\n")
    L.append("```\nPYTHONUNBUFFERED=1 python3 scripts/gen_fixtures.py /tmp/fx && tar czf $OUT/fixtures.tgz -C /tmp/fx .\n```\n")
    L.append("then unpacked into `tests/fixtures/`. (Invocation seen by the script: `" + " ".join(argv) + "`.)\n")
    L.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "\n")
    L.append("## Contents of each fixture folder\n")
    L.append("- `config.json`, `generation_config.json`: as written by `save_pretrained`.")
    L.append("- weights: `model.safetensors`, or (llama-f32 only) `model-0000X-of-0000N.safetensors` + `model.safetensors.index.json`.")
    L.append("- `expected.safetensors` (written with `safetensors.torch.save_file`):")
    L.append(f"  - `input_ids` int32 [{T_PROMPT}]: the prompt (torch.randint(3, vocab) with generator seed {PROMPT_SEED}; identical for all fixtures).")
    L.append(f"  - `logits` float32 [{T_PROMPT}, V]: logits at every prompt position from ONE full forward of the prompt (no cache).")
    L.append(f"  - `greedy_ids` int32 [{N_GREEDY}]: greedy continuation computed with the KV cache: forward the prompt, argmax of the last")
    L.append("    position, then feed each new token alone with `past_key_values`; EOS is not special (all 24 recorded).")
    L.append(f"  - `greedy_margin` float32 [{N_GREEDY}]: top1 - top2 logit at each greedy step.")
    L.append("")
    L.append("Weights: `from_config(cfg, attn_implementation=\"eager\")` under `torch.manual_seed(seed)`, then every 2-D weight")
    L.append(f"(Linear / Embedding) ~ N(0, {W_STD}^2), every bias ~ N(0, {BIAS_STD}^2), every norm weight (input/post-attention/final,")
    L.append(f"Qwen3 q_norm/k_norm) = 1 + {NORM_STD}*randn. Seeds were searched until the prompt's last-position margin and every greedy")
    L.append(f"margin were >= {GOOD_MARGIN} (falling back to >= {MIN_MARGIN}).")
    L.append("")
    L.append("bf16 fixtures: the same f32 model (same seed, same weights before rounding) as the matching -f32 fixture, cast to")
    L.append("bfloat16 and saved; the seed search requires both dtypes to pass. The reference is computed by loading those bf16 weights")
    L.append("back, upcasting to float32 and running in float32.\n")
    L.append("f32 fixtures: the reference is computed from the weights reloaded from disk (bit-identical to the saved ones).\n")
    L.append("## Notes for engine authors (transformers 5.x behaviour seen while generating)\n")
    L.extend(NOTES)
    L.append("")
    L.append("## Fixtures\n")
    L.append("| name | arch | dtype | layers | head_dim | tied | rope (as in config.json) | sliding_window | logits std | prompt last margin | min greedy margin | bytes |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i in infos:
        rope = json.dumps(i["rope_config"], sort_keys=True)
        L.append(f"| `{i['name']}` | {(i['architectures'] or ['?'])[0]} | {i['dtype']} | {i['num_hidden_layers']} | "
                 f"{i['head_dim']} | {i['tie_word_embeddings']} | `{rope}` | {i['sliding_window']} | "
                 f"{i['logits_std']:.3f} | {i['prompt_last_margin']:.4f} | {i['min_greedy_margin']:.4f} | {i['total_bytes']} |")
    L.append("")
    L.append("## Details per fixture\n")
    for i in infos:
        L.append(f"### {i['name']}\n")
        L.append(f"{i['desc']}. Seed {i['seed']}, T={i['T']}, V={i['V']}, logits std {i['logits_std']:.4f}, "
                 f"|logits| max {i['logits_absmax']:.3f}.\n")
        L.append(f"- config: head_dim {i['head_dim']}, max_position_embeddings {i['max_position_embeddings']}, "
                 f"tie_word_embeddings {i['tie_word_embeddings']} (tied in model: {i['tied_in_model']}), "
                 f"sliding_window {i['sliding_window']}, use_sliding_window {i['use_sliding_window']}, "
                 f"saved dtype {i['saved_dtype']}, q/k/v bias {i['qkv_bias']}, q/k norm {i['qk_norm']}")
        L.append(f"- rope keys in config.json: `{json.dumps(i['rope_config'], sort_keys=True)}`")
        if i.get("default_inv_freq"):
            L.append(f"- rotary inv_freq (after the full prompt forward): {fmt_list(i['rotary'].get('inv_freq') or [])}, "
                     f"attention_scaling {i['rotary'].get('attention_scaling')}")
            L.append(f"- default inv_freq for comparison: {fmt_list(i['default_inv_freq'])}")
        L.append(f"- greedy_ids: {i['greedy_ids']}")
        L.append(f"- cached greedy vs no-cache forward of prompt+greedy: max |logit diff| {i['cache_vs_nocache_max_logit_diff']:.3g}, "
                 f"argmax equal: {i['cache_vs_nocache_argmax_equal']}")
        L.append(f"- layer-0 attention of the last prompt query: {i['layer0_last_query_attention']}")
        L.append(f"- files: {i['files']}")
        L.append("")
    if failures:
        L.append("## FAILED fixtures\n")
        for n, e in failures:
            L.append(f"- {n}: {e}")
    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    outdir = argv[1]
    only = set(argv[2:])
    os.makedirs(outdir, exist_ok=True)
    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__}
    try:
        import safetensors
        versions["safetensors"] = safetensors.__version__
    except Exception:  # noqa: BLE001
        pass
    log("versions:", versions)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    tmpdir = os.path.join(outdir, "..", os.path.basename(os.path.abspath(outdir)) + "-tmp")
    os.makedirs(tmpdir, exist_ok=True)
    infos, failures = [], []
    seed_cache = {}
    t0 = time.time()
    for spec in specs():
        if only and spec["name"] not in only:
            continue
        try:
            infos.append(run_fixture(spec, outdir, tmpdir, seed_cache))
        except Exception as e:  # noqa: BLE001
            log(f"!!! {spec['name']} failed:\n" + traceback.format_exc())
            failures.append((spec["name"], repr(e)))
    mm_infos = []
    if not only or only & set(MM_FIXTURES):
        try:
            mm_infos = make_mm_fixtures(outdir, only)
        except Exception as e:  # noqa: BLE001
            log("!!! gemma3 multimodal fixtures failed:\n" + traceback.format_exc())
            failures.append(("gemma3-mm", repr(e)))
    shutil.rmtree(tmpdir, ignore_errors=True)
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(dict(versions=versions, fixtures=infos, mm_fixtures=mm_infos, failures=failures), f, indent=1)
    write_readme(outdir, infos, failures, versions, argv)
    log(f"\n==== summary ({time.time() - t0:.1f}s) ====")
    for i in infos:
        log(f"{i['name']:22s} std {i['logits_std']:.3f}  last-margin {i['prompt_last_margin']:.4f}  "
            f"min-greedy-margin {i['min_greedy_margin']:.4f}  bytes {i['total_bytes']}  "
            f"cache-diff {i['cache_vs_nocache_max_logit_diff']:.2e}")
    for n, e in failures:
        log(f"FAILED {n}: {e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
