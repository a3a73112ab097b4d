#!/usr/bin/env python3
"""Compare gerbil's logits of a golden fixture's prompt with transformers' (tests use it).

Usage: python3 scripts/vs_transformers.py GERBIL FIXTURE_DIR MODEL [LABEL]

Runs `GERBIL logits --model MODEL` on FIXTURE_DIR/expected.safetensors's input_ids (all
positions, 1 thread, f32 KV cache) and exits 0 when every logit is within 1e-3 of the
reference stored there (transformers, float32). Standard library only."""
import json
import struct
import subprocess
import sys

g, fx, model = sys.argv[1:4]
label = sys.argv[4] if len(sys.argv) > 4 else fx.rstrip("/").rsplit("/", 1)[-1]
f = open(fx + "/expected.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))


def get(name, fmt):
    m = h[name]
    f.seek(8 + n + m["data_offsets"][0])
    raw = f.read(m["data_offsets"][1] - m["data_offsets"][0])
    return list(struct.unpack("<%d%s" % (len(raw) // 4, fmt), raw)), m["shape"]


ids, _ = get("input_ids", "i")
ref, shape = get("logits", "f")
out = subprocess.run([g, "logits", "--model", model, "--ids", ",".join(map(str, ids)), "--all", "-t", "1",
                      "--kv-type", "f32"], capture_output=True, text=True, check=True)
L = json.loads(out.stdout)["logits"]
V = shape[1]
d = max(abs(L[t][v] - ref[t * V + v]) for t in range(shape[0]) for v in range(V))
print(f"  {label}: max |diff| vs transformers {d:.3g} (bound 1e-3)")
sys.exit(0 if d <= 1e-3 else 1)
