#!/usr/bin/env python3
"""Golden fixtures for text-to-speech: the DAC decoder and an OuteTTS-shaped backbone.

Usage:
    python3 scripts/gen_tts_fixtures.py OUT_DIR

Run on the device machine with transformers 5.17 (float32, on the CPU: deterministic f32).
Each OUT_DIR/NAME/ holds a checkpoint (config.json, model.safetensors) and expected.safetensors.

  dac-tiny   transformers.DacModel with a tiny random DacConfig (hidden_size 24, decoder_hidden_size
             32, upsampling_ratios [3, 2] (an odd stride: padding ceil(3/2) = 2), 2 codebooks of 64
             entries, codebook_dim 4). model.apply_weight_norm() is called and the g/v parameters
             are randomised, so the checkpoint stores parametrizations.weight.original0/original1
             as a weight-normed HF checkpoint does (gerbil folds them at load). Snake alphas are
             1 + 0.3 N(0,1) (kept away from 0). Weight-norm g is U(0.5, 1.5): many output samples
             saturate tanh (test_tts prints how many do not); a rerun with smaller g and the
             pre-tanh waveform saved is the next step (the device was not available).
             expected: codes [2, T] i32 (random), audio [N] f32 = model.decode(audio_codes=codes).
  outetts-tiny  transformers.Qwen3ForCausalLM (OuteTTS-1.0-0.6B is a Qwen3 backbone, tied embeddings),
             vocab 512, ids 256..511 the audio-code tokens (c1_0..c1_127 = 256..383,
             c2_0..c2_127 = 384..511). expected: prompt_ids [P] i32 (fixed, random < 256),
             greedy_ids [G] i32 = generate(do_sample=False) with a logits processor that keeps only
             the audio-code ids (the rest -inf), greedy_margin [G] f32 (top1 - top2 of the allowed).
"""

import json
import os
import sys
import traceback

import torch
import transformers
from safetensors.torch import save_file


def log(*a):
    print(*a, flush=True)


def dac_tiny(out):
    torch.manual_seed(3300)
    cfg = transformers.DacConfig(encoder_hidden_size=8, downsampling_ratios=[2, 3], decoder_hidden_size=32,
                                 n_codebooks=2, codebook_size=64, codebook_dim=4, upsampling_ratios=[3, 2],
                                 hidden_size=24, sampling_rate=24000)
    model = transformers.DacModel(cfg).eval()
    model.apply_weight_norm()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("original0"):  # g
                p.copy_(0.5 + torch.rand_like(p))
            elif name.endswith("original1"):  # v
                p.copy_(torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p))
    T = 7
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.n_codebooks, T))
    with torch.no_grad():
        audio = model.decode(audio_codes=codes).audio_values[0].float()
    sd = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    os.makedirs(out, exist_ok=True)
    save_file(sd, os.path.join(out, "model.safetensors"))
    cfg.save_pretrained(out)
    save_file({"codes": codes[0].to(torch.int32).contiguous(), "audio": audio.contiguous()},
              os.path.join(out, "expected.safetensors"))
    log("dac-tiny: keys", len(sd), "audio", tuple(audio.shape), "range", float(audio.min()), float(audio.max()))


class AudioOnly(transformers.LogitsProcessor):
    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi

    def __call__(self, input_ids, scores):
        mask = torch.full_like(scores, float("-inf"))
        mask[:, self.lo:self.hi] = 0
        return scores + mask


def outetts_tiny(out):
    torch.manual_seed(3400)
    V, LO = 512, 256
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    P, G = 10, 16
    prompt = torch.randint(3, LO, (1, P))
    with torch.no_grad():
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=G,
                             logits_processor=transformers.LogitsProcessorList([AudioOnly(LO, V)]),
                             pad_token_id=0, eos_token_id=None)
        ids = gen[0, P:]
        # margins from full forwards
        margins = []
        seq = prompt
        for t in range(G):
            lg = model(seq).logits[0, -1, LO:V]
            top = torch.topk(lg, 2).values
            margins.append(float(top[0] - top[1]))
            assert int(lg.argmax()) + LO == int(ids[t]), "generate disagrees with the manual argmax"
            seq = torch.cat([seq, ids[t].view(1, 1)], dim=1)
    sd = {k: v.detach().contiguous().float() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    os.makedirs(out, exist_ok=True)
    save_file(sd, os.path.join(out, "model.safetensors"))
    cfg.save_pretrained(out)
    save_file({"prompt_ids": prompt[0].to(torch.int32).contiguous(), "greedy_ids": ids.to(torch.int32).contiguous(),
               "greedy_margin": torch.tensor(margins, dtype=torch.float32)},
              os.path.join(out, "expected.safetensors"))
    log("outetts-tiny: ids", ids.tolist(), "min margin", min(margins))


def main():
    out = sys.argv[1]
    log("transformers", transformers.__version__, "torch", torch.__version__)
    for name, fn in (("dac-tiny", dac_tiny), ("outetts-tiny", outetts_tiny)):
        try:
            fn(os.path.join(out, name))
        except Exception:
            log("FAILED", name)
            traceback.print_exc()


if __name__ == "__main__":
    main()
