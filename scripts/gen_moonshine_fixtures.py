#!/usr/bin/env python3
"""Golden fixtures for Moonshine speech-to-text (MoonshineForConditionalGeneration).

Usage:
    python3 scripts/gen_moonshine_fixtures.py OUT_DIR JFK_WAV

Run on the device machine with transformers 5.17 (float32, CPU, eager attention).
Each OUT_DIR/NAME/ holds a checkpoint (config.json, generation_config.json,
model.safetensors) and expected.safetensors:

  input_values   [N] f32     what the processor (Wav2Vec2FeatureExtractor configured as
                             UsefulSensors/moonshine-*'s preprocessor_config.json: feature_size 1,
                             16 kHz, do_normalize false) makes of the wav
  encoder_out    [T, H] f32  model.model.encoder(input_values).last_hidden_state
  decoder_ids    [L] i32     a fixed decoder prefix: decoder_start_token_id, then random ids
  logits         [L, V] f32  the decoder's logits at every position of that prefix (one forward;
                             the script checks step-by-step decoding with the cache agrees)
  greedy_ids     [G] i32     G greedy tokens after decoder_start_token_id, EOS ignored (manual
                             argmax loop over full forwards; checked against generate())
  greedy_margin  [G] f32     top1 - top2 logit at each greedy step
  inv_freq       [R/2] f32   the rotary embedding's inv_freq (for debugging rotary dims)

Fixtures (weights: Linear/Embedding N(0, 0.2), biases N(0, 0.1), norm weights 1 + 0.2 N(0,1),
norm biases N(0, 0.1), conv weights N(0, 1/fan_in), as scripts/gen_fixtures.py plus the convs).
transformers' MoonshineAttention views queries with config.num_key_value_heads and every attention
module shares (and updates) one config, so the reference runs only when encoder and decoder have
the same head counts and no GQA (as the published checkpoints): every fixture is MHA.
  moonshine-f32         hidden 64, 2+2 layers, 4 heads, head_dim 16, partial_rotary_factor 0.9 (rotary dim 14), tied
                        proj_out, vocab 512; the whole jfk.wav (11 s, 176000 samples)
  moonshine-bf16        the same weights stored as bf16 (reference: the bf16 weights upcast)
  moonshine-untied-f32  hidden 48, 2+1 layers, 4 heads (head_dim 12),
                        partial_rotary_factor 0.62 (int(7.44) = 7: an odd rotary dim), untied
                        proj_out, intermediate 80; the first 3 s of jfk.wav
"""

import copy
import json
import os
import shutil
import sys
import traceback
import wave

import torch
import transformers
from safetensors.torch import load_file, save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

W_STD = 0.2
BIAS_STD = 0.1
NORM_STD = 0.2
N_GREEDY = 24
L_PREFIX = 12
MIN_MARGIN = 1e-3


def log(*a):
    print(*a, flush=True)


BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2,
            decoder_num_hidden_layers=2, encoder_num_attention_heads=4, decoder_num_attention_heads=4,
            encoder_num_key_value_heads=4, decoder_num_key_value_heads=4,
            encoder_hidden_act="gelu", decoder_hidden_act="silu", max_position_embeddings=194,
            decoder_start_token_id=1, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            tie_word_embeddings=True, attention_bias=False)
UNTIED = dict(BASE, hidden_size=48, intermediate_size=80, decoder_num_hidden_layers=1,
              tie_word_embeddings=False)

SPECS = [
    dict(name="moonshine-f32", kw=BASE, partial=0.9, dtype="float32", seconds=None, seed=2300),
    dict(name="moonshine-bf16", kw=BASE, partial=0.9, dtype="bfloat16", seconds=None, seed=2300),
    dict(name="moonshine-untied-f32", kw=UNTIED, partial=0.62, dtype="float32", seconds=3, seed=2400),
]


def read_wav(path):
    with wave.open(path, "rb") as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, "expects 16-bit mono"
        rate = w.getframerate()
        raw = w.readframes(w.getnframes())
    x = torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.float32) / 32768.0
    return x, rate


def make_config(kw, partial):
    from transformers import MoonshineConfig
    errors = []
    attempts = [
        dict(kw, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": partial}),
        dict(kw, rope_theta=10000.0, partial_rotary_factor=partial),
    ]
    for a in attempts:
        try:
            cfg = MoonshineConfig(**a)
            return cfg
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    raise RuntimeError("MoonshineConfig: " + " | ".join(errors))


def reinit_(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + NORM_STD * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, BIAS_STD)
            elif p.dim() == 3:
                fan_in = p.shape[1] * p.shape[2]
                p.normal_(0.0, 1.0 / fan_in ** 0.5)
            elif p.dim() == 2:
                p.normal_(0.0, W_STD)
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def build(cfg, seed):
    from transformers import MoonshineForConditionalGeneration
    torch.manual_seed(seed)
    m = MoonshineForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    m = m.to(torch.float32)
    reinit_(m, seed)
    if cfg.tie_word_embeddings:
        with torch.no_grad():
            m.proj_out.weight = m.model.decoder.embed_tokens.weight
    m.eval()
    return m


def load(path):
    from transformers import MoonshineForConditionalGeneration
    m = MoonshineForConditionalGeneration.from_pretrained(path, attn_implementation="eager",
                                                          dtype=torch.float32)
    m.eval()
    return m


def processor_values(audio, rate):
    from transformers import Wav2Vec2FeatureExtractor
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                  do_normalize=False, return_attention_mask=True)
    out = fe(audio.numpy(), sampling_rate=rate, return_tensors="pt")
    return out["input_values"].to(torch.float32)


@torch.no_grad()
def reference(model, iv, prefix):
    cfg = model.config
    enc_out = model.model.encoder(input_values=iv)
    enc = enc_out.last_hidden_state
    dec = torch.tensor([prefix], dtype=torch.long)
    logits = model(input_values=iv, decoder_input_ids=dec).logits[0].float()
    # step by step with the cache must agree with the single forward
    out = model(input_values=iv, decoder_input_ids=dec[:, :1], use_cache=True)
    pkv = out.past_key_values
    steps = [out.logits[0, -1]]
    for t in range(1, dec.shape[1]):
        out = model(encoder_outputs=enc_out, decoder_input_ids=dec[:, t:t + 1], past_key_values=pkv,
                    use_cache=True)
        pkv = out.past_key_values
        steps.append(out.logits[0, -1])
    steps = torch.stack(steps).float()
    log(f"    cached-vs-full max diff {float((steps - logits).abs().max()):.2e}")
    # greedy, EOS ignored
    ids = [cfg.decoder_start_token_id]
    greedy, margins = [], []
    for _ in range(N_GREEDY):
        lg = model(encoder_outputs=enc_out, decoder_input_ids=torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(lg, 2)
        greedy.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(greedy[-1])
    try:
        gen = model.generate(input_values=iv, max_new_tokens=N_GREEDY, min_new_tokens=N_GREEDY,
                             do_sample=False, num_beams=1, decoder_start_token_id=cfg.decoder_start_token_id)
        g = gen[0].tolist()
        if g and g[0] == cfg.decoder_start_token_id:
            g = g[1:]
        log(f"    generate() agrees with the argmax loop: {g[:N_GREEDY] == greedy} ({g[:8]}...)")
    except Exception as e:  # noqa: BLE001
        log("    generate() failed (argmax loop kept):", repr(e))
    return dict(enc=enc[0].float(), logits=logits, greedy=greedy, margins=margins)


def save_ckpt(model, path, dtype):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    m = copy.deepcopy(model)
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    m = m.to(tdt)
    try:
        m.config.dtype = tdt
    except Exception:  # noqa: BLE001
        m.config.torch_dtype = tdt
    m.save_pretrained(path)
    if not os.path.exists(os.path.join(path, "generation_config.json")):
        m.generation_config.save_pretrained(path)


def run_spec(spec, outdir, audio, rate, tmp):
    name = spec["name"]
    log(f"== {name}")
    x = audio if spec["seconds"] is None else audio[: spec["seconds"] * rate]
    iv = processor_values(x, rate)
    cfg = make_config(spec["kw"], spec["partial"])
    g = torch.Generator().manual_seed(77)
    prefix = [cfg.decoder_start_token_id] + torch.randint(3, cfg.vocab_size, (L_PREFIX - 1,),
                                                          generator=g).tolist()
    for seed in range(spec["seed"], spec["seed"] + 8):
        model = build(cfg, seed)
        path = os.path.join(tmp, f"{name}-{seed}")
        save_ckpt(model, path, spec["dtype"])
        ref_model = load(path)
        ref = reference(ref_model, iv, prefix)
        mm = min(ref["margins"])
        log(f"  seed {seed}: enc {tuple(ref['enc'].shape)} std {float(ref['enc'].std()):.3f}, logits std "
            f"{float(ref['logits'].std()):.3f}, greedy {ref['greedy'][:8]}..., min margin {mm:.5f}")
        if mm >= MIN_MARGIN:
            break
    dst = os.path.join(outdir, name)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    shutil.copytree(path, dst)
    inv = ref_model.model.encoder.rotary_emb.inv_freq.float().contiguous()
    save_file({
        "input_values": iv[0].contiguous(),
        "encoder_out": ref["enc"].contiguous(),
        "decoder_ids": torch.tensor(prefix, dtype=torch.int32),
        "logits": ref["logits"].contiguous(),
        "greedy_ids": torch.tensor(ref["greedy"], dtype=torch.int32),
        "greedy_margin": torch.tensor(ref["margins"], dtype=torch.float32),
        "inv_freq": inv,
    }, os.path.join(dst, "expected.safetensors"))
    back = load_file(os.path.join(dst, "expected.safetensors"))
    log(f"  saved {dst}: {sorted((k, tuple(v.shape)) for k, v in back.items())}")
    log(f"  inv_freq {inv.tolist()}")
    with open(os.path.join(dst, "config.json")) as f:
        log("  config.json:", f.read())
    return dict(name=name, seed=seed, min_margin=mm, n_samples=int(iv.shape[1]),
                enc_frames=int(ref["enc"].shape[0]))


def main():
    outdir, wav = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    tmp = os.path.join(outdir, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    log("transformers", transformers.__version__, "torch", torch.__version__)
    audio, rate = read_wav(wav)
    log(f"audio: {audio.shape[0]} samples at {rate} Hz")
    summary = []
    for spec in SPECS:
        try:
            summary.append(run_spec(spec, outdir, audio, rate, tmp))
        except Exception:  # noqa: BLE001
            log(f"FIXTURE {spec['name']} FAILED\n" + traceback.format_exc())
    shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.join(outdir, "moonshine_summary.json"), "w") as f:
        json.dump(dict(transformers=transformers.__version__, torch=torch.__version__, fixtures=summary), f,
                  indent=2)
    log(json.dumps(summary))


if __name__ == "__main__":
    main()
