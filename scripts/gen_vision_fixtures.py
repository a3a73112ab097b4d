#!/usr/bin/env python3
"""Golden fixtures for gerbil's image layer (src/image/): run on the GPU machine, which has
transformers 5.17, Pillow and torchvision. Writes into OUT (argv[1]):
  images/*            small test images made here with Pillow (RGBA / palette / grey PNG,
                      lossless and lossy WebP, JPEGs with EXIF orientations 3, 6, 8)
  decode.json         for every image (those and the real photos): the size and sha256 of
                      the RGB bytes transformers' load_image gives (Pillow decode, exif
                      transpose, convert("RGB"))
  resize.json         sha256 of Pillow's Image.resize(BICUBIC) of the fjord photo to sizes
  proc/<name>_<cfg>.u8  + proc.json: the Qwen3.5 image processor's pixel_values for each
                      real photo, stored as the bytes u = (v * std + mean) * 255 they come
                      from (checked here to map back onto pixel_values within the bound
                      recorded), image_grid_thw, and the f32 pixel_values' sha256
Usage: PYTHONUNBUFFERED=1 python3 gen_vision_fixtures.py OUT_DIR [IMAGES_DIR]"""
import hashlib
import json
import os
import sys
import traceback

import numpy as np
from PIL import Image

out = sys.argv[1]
src = sys.argv[2] if len(sys.argv) > 2 else "images"
os.makedirs(os.path.join(out, "images"), exist_ok=True)
os.makedirs(os.path.join(out, "proc"), exist_ok=True)
REAL = ["coco_000000039769_two_cats.png", "llamacpp_mtmd_test-1_newspaper.jpeg", "llamacpp_ui_fixture_1_fjord.jpg"]
meta = {"errors": []}


def sha(b):
    return hashlib.sha256(b).hexdigest()


def step(name, fn):
    print("==", name, flush=True)
    try:
        fn()
    except Exception:
        traceback.print_exc()
        meta["errors"].append(name + ": " + traceback.format_exc().splitlines()[-1])


def make_images():
    fj = Image.open(os.path.join(src, REAL[2])).convert("RGB")
    crop = fj.crop((100, 60, 164, 108))  # 64x48
    a = np.array(crop)
    alpha = (np.arange(64)[None, :] * 4 + np.arange(48)[:, None]).astype(np.uint8)
    Image.fromarray(np.dstack([a, alpha]), "RGBA").save(os.path.join(out, "images/rgba.png"))
    Image.fromarray(a[:, :, 0], "L").save(os.path.join(out, "images/grey.png"))
    Image.fromarray(np.dstack([a[:, :, 1], alpha]), "LA").save(os.path.join(out, "images/la.png"))
    p = crop.quantize(16)
    p.info["transparency"] = 3
    p.save(os.path.join(out, "images/palette.png"), transparency=3)
    crop.save(os.path.join(out, "images/lossless.webp"), lossless=True)
    crop.save(os.path.join(out, "images/lossy.webp"), quality=80)
    Image.fromarray(np.dstack([a, alpha]), "RGBA").save(os.path.join(out, "images/alpha.webp"), lossless=True)
    crop.save(os.path.join(out, "images/progressive.jpg"), quality=90, progressive=True)
    crop.convert("L").save(os.path.join(out, "images/grey.jpg"), quality=90)
    for o in (2, 3, 4, 5, 6, 7, 8):
        ex = Image.Exif()
        ex[0x0112] = o
        crop.save(os.path.join(out, "images/exif_o%d.jpg" % o), quality=90, exif=ex.tobytes())


def decode_refs():
    from transformers.image_utils import load_image
    d = {}
    files = [os.path.join(src, f) for f in REAL] + sorted(
        os.path.join(out, "images", f) for f in os.listdir(os.path.join(out, "images"))
        if f.endswith((".png", ".jpg", ".webp")))
    for f in files:
        im = load_image(f)
        arr = np.ascontiguousarray(np.array(im.convert("RGB"), dtype=np.uint8))
        raw = np.ascontiguousarray(np.array(Image.open(f).convert("RGB"), dtype=np.uint8))
        d[os.path.basename(f)] = {"w": arr.shape[1], "h": arr.shape[0], "sha256": sha(arr.tobytes()),
                                  "mode": Image.open(f).mode, "sha256_no_exif": sha(raw.tobytes())}
        print(os.path.basename(f), d[os.path.basename(f)], flush=True)
    json.dump(d, open(os.path.join(out, "decode.json"), "w"), indent=1)


def resize_refs():
    fj = Image.open(os.path.join(src, REAL[2])).convert("RGB")
    d = {}
    for (w, h) in [(544, 384), (148, 100), (160, 96), (550, 100), (100, 368), (1100, 736), (821, 500), (32, 32), (37, 1000)]:
        r = np.ascontiguousarray(np.array(fj.resize((w, h), Image.Resampling.BICUBIC), dtype=np.uint8))
        d["%dx%d" % (w, h)] = sha(r.tobytes())
    json.dump(d, open(os.path.join(out, "resize.json"), "w"), indent=1)
    print(d, flush=True)


def proc_refs():
    import transformers
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl import image_processing_qwen2_vl as m
    classes = {}
    for name in dir(m):
        obj = getattr(m, name)
        if isinstance(obj, type) and name.startswith("Qwen2VLImageProcessor") and hasattr(obj, "preprocess"):
            classes[name] = obj
    try:
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as mp
        for name in dir(mp):
            obj = getattr(mp, name)
            if isinstance(obj, type) and name.startswith("Qwen2VLImageProcessor") and hasattr(obj, "preprocess"):
                classes[name] = obj
    except Exception:
        traceback.print_exc()
    print("transformers", transformers.__version__, "classes", list(classes), flush=True)
    cfgs = {"full": dict(min_pixels=65536, max_pixels=16777216), "small": dict(min_pixels=1024, max_pixels=40960),
            "tiny": dict(min_pixels=4096, max_pixels=8192)}
    d = {"transformers": transformers.__version__, "classes": list(classes), "items": {}}
    for cname, cls in classes.items():
        for cfg_name, c in cfgs.items():
            try:
                proc = cls(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                           image_std=[0.5] * 3, size={"shortest_edge": c["min_pixels"], "longest_edge": c["max_pixels"]})
            except Exception:
                traceback.print_exc()
                continue
            for f in REAL:
                im = load_image(os.path.join(src, f))
                res = proc(images=[im], return_tensors="np")
                pv = np.asarray(res["pixel_values"], dtype=np.float32)
                thw = [int(x) for x in np.asarray(res["image_grid_thw"]).reshape(-1)]
                u = np.rint((pv.astype(np.float64) * 0.5 + 0.5) * 255.0)
                u8 = np.clip(u, 0, 255).astype(np.uint8)
                back = ((u8.astype(np.float64) / 255.0).astype(np.float32) - np.float32(0.5)) / np.float32(0.5)
                key = "%s/%s/%s" % (cname, cfg_name, f)
                fn = "%s_%s_%s.u8" % (cname, cfg_name, f.split(".")[0])
                # store the first temporal slot of each patch only (the second is the same frame)
                pvr = u8.reshape(pv.shape[0], 3, 2, 16, 16)
                same_t = bool((pvr[:, :, 0] == pvr[:, :, 1]).all())
                if cname == list(classes)[0] or cfg_name != "full":
                    np.ascontiguousarray(pvr[:, :, 0]).tofile(os.path.join(out, "proc", fn))
                d["items"][key] = {"file": fn, "shape": list(pv.shape), "grid_thw": thw,
                                   "sha256_f32": sha(np.ascontiguousarray(pv).tobytes()),
                                   "max_abs_back": float(np.abs(back - pv).max()), "temporal_equal": same_t}
                print(key, d["items"][key], flush=True)
    json.dump(d, open(os.path.join(out, "proc.json"), "w"), indent=1)


step("make_images", make_images)
step("decode_refs", decode_refs)
step("resize_refs", resize_refs)
step("proc_refs", proc_refs)
json.dump(meta, open(os.path.join(out, "meta.json"), "w"), indent=1)
print("errors:", meta["errors"], flush=True)
