#!/usr/bin/env python3
"""GGUF copies of the Gemma 4 golden fixtures, laid out as llama.cpp's converter writes Gemma 4
(conversion/gemma.py Gemma4Model; pure Python, no numpy or torch needed).

Usage:  python3 scripts/gen_gemma4_gguf.py [FIXTURES_DIR]     (default tests/fixtures)

  gemma4-gguf-f32     from gemma4-f32 (PLE, KV sharing, double-wide MLPs, proportional RoPE)
  gemma4-kv-gguf-f32  from gemma4-kv-f32 (attention_k_eq_v: no attn_v on the full layers,
                      per-layer head_count_kv)

Every tensor is stored F32 with the source's exact values, so the expected.safetensors of the
source fixture (transformers' logits) is the reference and is copied beside model.gguf.
Metadata as the converter writes it: gemma4.* sizes, attention.key_length (the full layers'
head_dim) / key_length_swa, feed_forward_length per layer when use_double_wide_mlp, head_count_kv
per layer when the full layers have their own KV head count, sliding_window_pattern as a bool per
layer, shared_kv_layers, embedding_length_per_layer_input, rope.freq_base / freq_base_swa,
rope.dimension_count (full head_dim: "proportional" RoPE) / dimension_count_swa, and the tensor
rope_freqs.weight (1 for the int(head_dim * partial_rotary_factor / 2) rotated pairs, 1e30 for
the rest). Norms are stored as w (the converter's norm_shift is 0 for Gemma 4).
"""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gguf_py import GGUFWriter  # noqa: E402

LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj",
    "post_per_layer_input_norm": "post_norm",
}
TOP = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    data = b[8 + n:]
    out = {}
    for k, v in h.items():
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = (v["shape"], data[s:e])
    return out


def gguf_name(hf):
    if hf in TOP:
        return TOP[hf]
    parts = hf.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf
    layer, rest = parts[2], ".".join(parts[3:])
    if rest == "layer_scalar":
        return f"blk.{layer}.layer_output_scale.weight"
    mod, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER[mod]}.{suffix}"


def convert(src, dst, encode=None):
    """encode(hf_name, shape, f32_bytes) -> (ggml type name, raw bytes) for the 2-D tensors, or None:
    everything F32 (and src's expected.safetensors copied: the same values)."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    tens = read_safetensors(os.path.join(src, "model.safetensors"))
    L = cfg["num_hidden_layers"]
    types = cfg["layer_types"]
    swa = [t == "sliding_attention" for t in types]
    plc = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}
    full = [i for i in range(L) if not swa[i]]
    hd_full = cfg.get("global_head_dim") or plc.get(full[0], {}).get("head_dim") or cfg["head_dim"]
    kv_full = cfg.get("num_global_key_value_heads") or plc.get(full[0], {}).get("num_key_value_heads")
    hd = cfg["head_dim"]
    n_shared = cfg.get("num_kv_shared_layers", 0)
    rope = cfg["rope_parameters"]
    a = "gemma4"
    w = GGUFWriter()
    w.add("general.architecture", "string", a)
    w.add("general.name", "string", os.path.basename(dst))
    w.add(f"{a}.block_count", "u32", L)
    w.add(f"{a}.context_length", "u32", cfg["max_position_embeddings"])
    w.add(f"{a}.embedding_length", "u32", cfg["hidden_size"])
    if cfg.get("use_double_wide_mlp"):
        n_ff = cfg["intermediate_size"]
        w.add_array(f"{a}.feed_forward_length", "u32", [n_ff if i < L - n_shared else 2 * n_ff for i in range(L)])
    else:
        w.add(f"{a}.feed_forward_length", "u32", cfg["intermediate_size"])
    w.add(f"{a}.attention.head_count", "u32", cfg["num_attention_heads"])
    if kv_full is not None:
        w.add_array(f"{a}.attention.head_count_kv", "u32",
                    [cfg["num_key_value_heads"] if s else kv_full for s in swa])
    else:
        w.add(f"{a}.attention.head_count_kv", "u32", cfg["num_key_value_heads"])
    w.add(f"{a}.attention.key_length", "u32", hd_full)
    w.add(f"{a}.attention.value_length", "u32", hd_full)
    w.add(f"{a}.attention.key_length_swa", "u32", hd)
    w.add(f"{a}.attention.value_length_swa", "u32", hd)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", "f32", cfg["rms_norm_eps"])
    w.add(f"{a}.attention.sliding_window", "u32", cfg["sliding_window"])
    w.add_array(f"{a}.attention.sliding_window_pattern", "bool", swa)
    w.add(f"{a}.attention.shared_kv_layers", "u32", n_shared)
    w.add(f"{a}.embedding_length_per_layer_input", "u32", cfg.get("hidden_size_per_layer_input") or 0)
    w.add(f"{a}.rope.freq_base", "f32", rope["full_attention"]["rope_theta"])
    w.add(f"{a}.rope.freq_base_swa", "f32", rope["sliding_attention"]["rope_theta"])
    w.add(f"{a}.rope.dimension_count", "u32", hd_full)
    w.add(f"{a}.rope.dimension_count_swa", "u32",
          int(hd * rope["sliding_attention"].get("partial_rotary_factor", 1.0)))
    if cfg.get("final_logit_softcapping"):
        w.add(f"{a}.final_logit_softcapping", "f32", cfg["final_logit_softcapping"])
    w.add("tokenizer.ggml.bos_token_id", "u32", cfg["bos_token_id"])
    w.add("tokenizer.ggml.eos_token_id", "u32", cfg["eos_token_id"])
    for hf in sorted(tens):
        shape, data = tens[hf]
        typ = "F32"
        if encode is not None and len(shape) == 2:
            typ, data = encode(hf, shape, data)
        w.add_tensor(gguf_name(hf), typ, shape, data)
    assert rope["full_attention"]["rope_type"] == "proportional"
    n_rot = int(hd_full * rope["full_attention"]["partial_rotary_factor"] / 2)
    vals = [1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot)
    w.add_tensor("rope_freqs.weight", "F32", [hd_full // 2], struct.pack("<%df" % len(vals), *vals))
    os.makedirs(dst, exist_ok=True)
    w.write(os.path.join(dst, "model.gguf"))
    if encode is None:
        shutil.copy(os.path.join(src, "expected.safetensors"), os.path.join(dst, "expected.safetensors"))
    print(f"{dst}: {len(tens) + 1} tensors, {os.path.getsize(os.path.join(dst, 'model.gguf'))} bytes")


def main(argv):
    fx = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(HERE), "tests", "fixtures")
    convert(os.path.join(fx, "gemma4-f32"), os.path.join(fx, "gemma4-gguf-f32"))
    convert(os.path.join(fx, "gemma4-kv-f32"), os.path.join(fx, "gemma4-kv-gguf-f32"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
