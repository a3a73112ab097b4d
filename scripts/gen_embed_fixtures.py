#!/usr/bin/env python3
"""Golden fixtures for sentence-transformers embedding models (gerbil embed).

Usage (on the GPU machine: torch, transformers 5.17, sentence-transformers 6.0.x; runs on the CPU):
    python3 scripts/gen_embed_fixtures.py TOKDIR OUT_DIR
TOKDIR holds qwen3/ and gemma3/ (tokenizer.json + tokenizer_config.json, as ../shared/data/tokenizers/).

Two tiny random models of the shapes people use, with the real tokenizers:
  embed-qwen3-*   Qwen3-Embedding: Qwen3Model -> Pooling(lasttoken) -> Normalize; texts end with
                  <|endoftext|> (Qwen3-Embedding's tokenizer appends it; here the text carries it);
                  prompts {"query": "Instruct: ...\\nQuery:", "document": ""}
  embed-gemma3-*  EmbeddingGemma: Gemma3TextModel (use_bidirectional_attention, sliding + full layers, a
                  sliding window shorter than the long texts) -> Pooling(mean) -> Dense(32->48) ->
                  Dense(48->24) -> Normalize; prompts as EmbeddingGemma's config_sentence_transformers.json
each in f32, bf16 and MLX affine 4-bit (group 32, bf16 scales/biases, every matrix incl. the embedding).
Embedding rows no text uses are zero (so the folders compress to little). Reference:
SentenceTransformer(folder).encode(text, batch_size=1) on the CPU in float32 with eager attention, on the
weights as stored (bf16 upcast exactly; MLX dequantized in numpy: w = scale * q + bias).

Each OUT_DIR/NAME/ is a sentence-transformers folder WITHOUT tokenizer.json / tokenizer_config.json (the tests
link them from ../shared/data/tokenizers/) plus expected.json:
  {"texts": [{"text", "prompt_name", "input": prompt + text, "ids": what ST's Transformer module was given,
              "tokenizer_ids": the HF tokenizer's encoding of input, "embedding"}], ...}
Note: sentence-transformers 6 saves a "message" modality for a tokenizer with a chat template and then renders
every text through it (Transformer.preprocess: "Always convert to the message format if it's supported"; a prompt
becomes the system message), so "ids" != "tokenizer_ids" here. tests/test_embed.c checks the model, pooling, Dense
and Normalize on "ids" (gerbil_embed_ids) and gerbil's text path against "tokenizer_ids".
"""

import json
import os
import shutil
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_quant_fixtures import mlx_dequantize, mlx_quantize, round_to, st_tensor, write_safetensors  # noqa: E402

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Ünïcödé: café, naïve, 東京タワー, Привет мир, 🙂",
    "a",
    "Embeddings map text to vectors; similar texts get nearby vectors, so search can rank documents "
    "by cosine similarity to a query. This sentence is long on purpose: it spans several sliding windows.",
]
# (text index, prompt name) pairs encoded with a prompt
PROMPTED = [(0, "query"), (1, "query"), (2, "document")]

QWEN_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
                "document": ""}
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: ",
                 "Retrieval-query": "task: search result | query: ", "Clustering": "task: clustering | query: "}


def randomize(model, seed, norm_center):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1:  # norms
                p.copy_(norm_center + (torch.rand(p.shape, generator=g) - 0.5) * 0.4)
            elif "embed_tokens" in n:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[1]))


def copy_tokenizer(tdir, dst):
    """tokenizer.json as is; tokenizer_config.json without processor_class (Gemma 3's names Gemma3Processor,
    which AutoProcessor would build, image processor and all)."""
    shutil.copy(os.path.join(tdir, "tokenizer.json"), os.path.join(dst, "tokenizer.json"))
    c = json.load(open(os.path.join(tdir, "tokenizer_config.json"), encoding="utf-8"))
    c.pop("processor_class", None)
    json.dump(c, open(os.path.join(dst, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False)


def st_inputs(family, tok):
    """The strings ST is given (prompt prepended by ST itself) and every id they use."""
    items = [(i, None) for i in range(len(TEXTS))] + list(PROMPTED)
    prompts = QWEN_PROMPTS if family == "qwen3" else GEMMA_PROMPTS
    out, used = [], set()
    for i, pn in items:
        text = TEXTS[i] + ("<|endoftext|>" if family == "qwen3" else "")
        full = (prompts[pn] if pn else "") + text
        ids = tok(full)["input_ids"]
        used.update(ids)
        out.append(dict(index=i, text=TEXTS[i], prompt_name=pn, st_text=text, input=full, ids=[int(x) for x in ids]))
    return out, used


def build(family, tokdir, work, outdir):
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    tdir = os.path.join(tokdir, family)
    tok = transformers.AutoTokenizer.from_pretrained(tdir)
    V = len(tok)
    items, used = st_inputs(family, tok)
    log(f"{family}: vocab {V}, {len(used)} ids used, max id {max(used)}")
    if family == "qwen3":
        cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       bos_token_id=None, eos_token_id=151643, pad_token_id=151643)
        model = transformers.Qwen3Model(cfg)
        randomize(model, 20, 1.0)
        prompts = QWEN_PROMPTS
    else:
        cfg = transformers.Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                            query_pre_attn_scalar=16, max_position_embeddings=512,
                                            sliding_window=16, use_bidirectional_attention=True,
                                            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                            rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2)
        model = transformers.Gemma3TextModel(cfg)
        randomize(model, 21, 0.0)
        prompts = GEMMA_PROMPTS
    log(f"{family}: config sliding_window after init {getattr(model.config, 'sliding_window', None)}")
    with torch.no_grad():  # rows no input uses are zero
        E = model.embed_tokens.weight
        keep = torch.zeros(E.shape[0], dtype=torch.bool)
        keep[sorted(used)] = True
        E[~keep] = 0
    params = {n: p.detach().float().numpy().copy() for n, p in model.named_parameters()}
    base = os.path.join(work, family + "-base")
    model.save_pretrained(base)
    copy_tokenizer(tdir, base)
    base_cfg = json.load(open(os.path.join(base, "config.json")))

    g = torch.Generator().manual_seed(22)
    if family == "gemma3":
        d1 = Dense(in_features=32, out_features=48, bias=False, activation_function=torch.nn.Identity())
        d2 = Dense(in_features=48, out_features=24, bias=False, activation_function=torch.nn.Identity())
        with torch.no_grad():
            d1.linear.weight.copy_(torch.randn(48, 32, generator=g) / np.sqrt(32))
            d2.linear.weight.copy_(torch.randn(24, 48, generator=g) / np.sqrt(48))
        head = [Pooling(32, pooling_mode="mean"), d1, d2, Normalize()]
    else:
        head = [Pooling(32, pooling_mode="lasttoken"), Normalize()]

    mk = {"dtype": torch.float32, "attn_implementation": "eager"}
    for variant in ("f32", "bf16", "mlx4"):
        name = f"embed-{family}-{variant}"
        try:
            log(f"=== {name}")
            ref = os.path.join(work, name + "-ref")  # the weights the reference computes with (float32)
            shutil.rmtree(ref, ignore_errors=True)
            shutil.copytree(base, ref)
            stored = {}  # the checkpoint files the fixture ships
            if variant == "bf16":
                m2 = type(model)(model.config)
                m2.load_state_dict(model.state_dict())
                m2 = m2.to(torch.bfloat16)
                d = os.path.join(work, name + "-w")
                m2.save_pretrained(d)
                stored = {f: os.path.join(d, f) for f in ("config.json", "model.safetensors")}
                shutil.rmtree(ref)
                shutil.copytree(d, ref)
                copy_tokenizer(tdir, ref)
            elif variant == "mlx4":
                tensors, deq = {}, {}
                for n, w in params.items():
                    w = round_to(w, "bfloat16")
                    if w.ndim == 2:
                        mod = n[: -len(".weight")]
                        words, s, b = mlx_quantize(w, 32, 4, "bfloat16")
                        tensors[mod + ".weight"] = st_tensor(words, "uint32")
                        tensors[mod + ".scales"] = st_tensor(s, "bfloat16")
                        tensors[mod + ".biases"] = st_tensor(b, "bfloat16")
                        deq[n] = mlx_dequantize(words, s, b, 32, 4)
                    else:
                        tensors[n] = st_tensor(w, "bfloat16")
                        deq[n] = w
                d = os.path.join(work, name + "-w")
                os.makedirs(d, exist_ok=True)
                write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "mlx"})
                c = dict(base_cfg)
                c["quantization"] = {"group_size": 32, "bits": 4}
                c["quantization_config"] = {"group_size": 32, "bits": 4}
                c["dtype"] = "bfloat16"
                json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
                stored = {f: os.path.join(d, f) for f in ("config.json", "model.safetensors")}
                m3 = type(model)(model.config)
                with torch.no_grad():
                    for n, p in m3.named_parameters():
                        p.copy_(torch.from_numpy(deq[n]))
                m3.save_pretrained(ref)
            st = SentenceTransformer(modules=[Transformer(ref, max_seq_length=256, model_kwargs=mk)] + head,
                                     device="cpu", prompts=prompts)
            std = os.path.join(work, name + "-st")
            shutil.rmtree(std, ignore_errors=True)
            st.save(std)
            st = SentenceTransformer(std, device="cpu", model_kwargs=mk)
            log(f"  loaded: {type(st[0].auto_model).__name__ if hasattr(st[0], 'auto_model') else type(st[0].model).__name__}"
                f", sliding_window {getattr(st[0].model.config, 'sliding_window', None)}")
            seen = {}

            def hook(mod, args, output):  # what the Transformer module was given and gave
                seen["ids"] = [int(x) for x in args[0]["input_ids"][0].tolist()]
                seen["tok"] = output["token_embeddings"][0].detach().float().clone()

            hk = st[0].register_forward_hook(hook)
            # the weights in memory against the file the fixture ships
            from safetensors.torch import load_file
            sd = load_file(os.path.join(std, "model.safetensors"))
            wdiff = max(float((p.detach().float() - sd[n].float()).abs().max()) for n, p in st[0].model.named_parameters()
                        if n in sd)
            missing = [n for n, _ in st[0].model.named_parameters() if n not in sd]
            log(f"  weights in memory vs file: max |diff| {wdiff:.3g}, not in file: {missing[:4]}")
            log(f"  model class {type(st[0].model).__name__}, config: "
                f"{ {k: getattr(st[0].model.config, k, None) for k in ('rope_parameters', 'sliding_window', 'layer_types', 'use_bidirectional_attention', 'is_causal', '_attn_implementation')} }")
            res = []
            for it in items:
                kw = {"prompt_name": it["prompt_name"]} if it["prompt_name"] else {}
                seen.clear()
                e = st.encode([it["st_text"]], batch_size=1, convert_to_numpy=True, **kw)[0]
                # the same ids through the bare model: last_hidden_state
                with torch.no_grad():
                    hs = st[0].model(input_ids=torch.tensor([seen["ids"]])).last_hidden_state[0].float()
                ddiff = float((hs - seen["tok"]).abs().max())
                if seen["ids"] != it["ids"] or ddiff > 1e-5:
                    log(f"  text {it['index']} ({it['prompt_name']}): ST ids {seen['ids'][:12]}... (tokenizer: "
                        f"{it['ids'][:12]}...), direct forward vs ST token embeddings {ddiff:.3g}")
                res.append(dict(text=it["text"], prompt_name=it["prompt_name"], input=it["input"], ids=seen["ids"],
                                tokenizer_ids=it["ids"], embedding=[float(x) for x in e],
                                last_hidden_first4=[float(x) for x in seen["tok"][-1][:4]],
                                first_hidden_first4=[float(x) for x in seen["tok"][0][:4]]))
            hk.remove()
            # the same texts in one padded batch, for information
            eb = st.encode([it["st_text"] for it in items[: len(TEXTS)]], batch_size=8, convert_to_numpy=True)
            bdiff = float(max(np.abs(eb[i] - np.array(res[i]["embedding"])).max() for i in range(len(TEXTS))))
            out = os.path.join(outdir, name)
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(std, out)
            for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                      "README.md"):
                if os.path.exists(os.path.join(out, f)):
                    os.remove(os.path.join(out, f))
            for f, src in stored.items():
                shutil.copy(src, os.path.join(out, f))
            json.dump(dict(family=family, variant=variant, dim=len(res[0]["embedding"]),
                           st_sliding_window=getattr(st[0].model.config, "sliding_window", None),
                           padded_batch_max_abs_diff=bdiff, texts=res),
                      open(os.path.join(out, "expected.json"), "w", encoding="utf-8"), indent=1, ensure_ascii=False)
            log(f"  {name}: dim {len(res[0]['embedding'])}, padded-batch diff {bdiff:.2e}, files "
                f"{sorted(os.listdir(out))}")
        except Exception:
            log(f"  {name} FAILED")
            traceback.print_exc()


def main():
    tokdir, outdir = sys.argv[1], sys.argv[2]
    import sentence_transformers
    import torch
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"sentence-transformers {sentence_transformers.__version__}")
    torch.set_num_threads(4)
    work = "/tmp/embed-work"
    os.makedirs(work, exist_ok=True)
    os.makedirs(outdir, exist_ok=True)
    for fam in ("qwen3", "gemma3"):
        try:
            build(fam, tokdir, work, outdir)
        except Exception:
            log(f"{fam} FAILED")
            traceback.print_exc()
    log("done")


if __name__ == "__main__":
    main()
