#!/usr/bin/env python3
"""make_corpus.py OUT: the fuzz harnesses' starting corpora, OUT/NAME/, from fuzz/seeds,
tests/fixtures, tests/templates and ../shared/data (when present). Nothing here is committed:
fuzz/run.sh calls it before each run. Standard library only."""
import glob
import os
import struct
import sys

SEP = b"\n--8<--\n"
SHARED = "../shared/data"


def put(out, name, fname, data):
    os.makedirs(os.path.join(out, name), exist_ok=True)
    with open(os.path.join(out, name, fname), "wb") as f:
        f.write(data)


def read(p):
    with open(p, "rb") as f:
        return f.read()


def gguf_strip(b):
    """The file with its metadata and no tensors (the tokenizer and config paths without
    megabytes of weights)."""
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(o, t):
        if t == 8:
            return o + 8 + struct.unpack_from("<Q", b, o)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            for _ in range(n):
                o = skip(o, et)
            return o
        return o + size[t]

    _, n_kv = struct.unpack_from("<QQ", b, 8)
    o = 24
    for _ in range(n_kv):
        o += 8 + struct.unpack_from("<Q", b, o)[0]
        o = skip(o + 4, struct.unpack_from("<I", b, o)[0])
    return b[:8] + struct.pack("<Q", 0) + b[16:o]


def main():
    out = sys.argv[1]
    # seeds are (re)written; what earlier runs added to the corpus stays
    for d in glob.glob("fuzz/seeds/*/"):
        name = os.path.basename(d.rstrip("/"))
        for f in glob.glob(d + "*"):
            put(out, name, os.path.basename(f), read(f))
    os.makedirs(os.path.join(out, "fuzz_gguf"), exist_ok=True)
    os.makedirs(os.path.join(out, "fuzz_safetensors"), exist_ok=True)
    ggufs = sorted(glob.glob("tests/fixtures/*/*.gguf")) + sorted(glob.glob(SHARED + "/models/*/gguf/*.gguf"))
    for p in ggufs:
        tag = p.split("/")[-2]
        b = read(p)
        put(out, "fuzz_gguf", tag + "-meta.gguf", gguf_strip(b))
        if len(b) <= 300000:
            put(out, "fuzz_gguf", tag + ".gguf", b)
    for p in sorted(glob.glob("tests/fixtures/*/model*.safetensors")):
        b = read(p)
        if len(b) <= 150000:
            put(out, "fuzz_safetensors", p.split("/")[-2] + "-" + os.path.basename(p), b)
    for p in sorted(glob.glob("tests/fixtures/*/model.safetensors.index.json")):
        d = os.path.dirname(p)
        shards = sorted(glob.glob(d + "/model-*.safetensors")) or [d + "/model.safetensors"]
        shard = shards[0]
        idx = read(p).replace(os.path.basename(shard).encode(), b"model-00001-of-00001.safetensors")
        put(out, "fuzz_safetensors", d.split("/")[-1] + "-index", read(shard) + SEP + idx)
    for p in sorted(glob.glob("tests/fixtures/*/config.json")):
        d = os.path.dirname(p)
        data = read(p)
        if os.path.exists(d + "/generation_config.json"):
            data += SEP + read(d + "/generation_config.json")
        put(out, "fuzz_config", d.split("/")[-1] + ".json", data)
    texts = [b"Once upon a time, there was a little dragon. 12345 \xe4\xbd\xa0\xe5\xa5\xbd <s>",
             b"  leading spaces\t\ttabs\n\nnewlines \xf0\x9f\x98\x80 caf\xc3\xa9 </s><unk>"]
    for d in glob.glob(SHARED + "/models/*/hf/"):
        if os.path.exists(d + "tokenizer.json") and os.path.getsize(d + "tokenizer.json") < 200000:
            cfg = read(d + "tokenizer_config.json") if os.path.exists(d + "tokenizer_config.json") else b"{}"
            for i, t in enumerate(texts):
                put(out, "fuzz_tokenizer", "%s-%d" % (d.split("/")[-3], i), read(d + "tokenizer.json") + SEP + cfg + SEP + t)
    msgs = read("tests/templates/cli_messages.json") if os.path.exists("tests/templates/cli_messages.json") else b"[]"
    tools = read("tests/templates/cli_tools.json") if os.path.exists("tests/templates/cli_tools.json") else b"[]"
    for p in sorted(glob.glob("tests/templates/*.jinja") + glob.glob(SHARED + "/tokenizers/chat_templates/*.jinja")):
        put(out, "fuzz_jinja", os.path.basename(p), read(p) + SEP + msgs + SEP + tools)
    # every schema of the grammar tests, compact and flexible, with a walk of every step kind
    walk = bytes(range(0, 256, 3))
    for p in sorted(glob.glob("tests/grammar/*.json")):
        for flags in (0, 1, 6):
            put(out, "fuzz_grammar", "%s-%d" % (os.path.basename(p), flags), bytes([0, flags]) + read(p) + SEP + walk)
    for name in sorted(os.listdir(out)):
        print("%-18s %4d inputs" % (name, len(os.listdir(os.path.join(out, name)))))


main()
