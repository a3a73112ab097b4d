#!/usr/bin/env python3
"""Golden fixtures for quantized checkpoints (MLX affine safetensors and GGUF v3).

Usage:
    python3 scripts/gen_quant_fixtures.py OUT_DIR [NAME ...]     # generate (needs numpy, torch, transformers)
    python3 scripts/gen_quant_fixtures.py --selftest [GGUF_PY_DIR] # numpy-only checks of the format code

Every fixture folder OUT_DIR/NAME/ holds the checkpoint (MLX: config.json, generation_config.json,
model.safetensors, model.safetensors.index.json; GGUF: model.gguf) and expected.safetensors with
    input_ids      int32   [20]     the prompt of scripts/gen_fixtures.py
    logits         float32 [20, V]  logits of one full forward of the prompt
    greedy_ids     int32   [24]     greedy continuation computed with the KV cache
    greedy_margin  float32 [24]     top1 - top2 logit at each greedy step
The reference is Hugging Face transformers (float32, CPU, eager attention) run on the weights DEQUANTIZED
in numpy from the stored bytes (w = scale * q + bias for MLX, the ggml dequantization formulas for GGUF),
so the engine should reproduce it up to its own float rounding.

The format code (MLX affine quantize/pack/dequantize, ggml block quantizers/dequantizers, GGUF writer,
safetensors writer) uses numpy only; torch/transformers are imported by the generation step alone.
"""

import json
import os
import struct
import sys
import time

import numpy as np

# ======================================================================================
# small helpers
# ======================================================================================

def log(*a):
    print(*a, flush=True)


def bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (as torch .to(bfloat16))."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    """Round float32 values to dtype ('float32', 'float16', 'bfloat16') and return them as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_to_f32(bf16_bits(x))
    raise ValueError(dtype)


# ======================================================================================
# safetensors writer (numpy; supports BF16 through raw bits)
# ======================================================================================

ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32"}


def st_tensor(arr_f32_or_int, dtype):
    """-> (safetensors dtype string, shape, raw bytes)."""
    a = np.asarray(arr_f32_or_int)
    if dtype == "bfloat16":
        raw = bf16_bits(a.astype(np.float32)).tobytes()
    elif dtype == "float16":
        raw = a.astype("<f2").tobytes()
    elif dtype == "float32":
        raw = a.astype("<f4").tobytes()
    elif dtype == "uint32":
        raw = a.astype("<u4").tobytes()
    elif dtype == "int32":
        raw = a.astype("<i4").tobytes()
    else:
        raise ValueError(dtype)
    return ST_DTYPES[dtype], list(a.shape), raw


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> (dtype string, shape, bytes). Writes in sorted-name order, 8-aligned header."""
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    off = 0
    names = sorted(tensors)
    for n in names:
        dt, shape, raw = tensors[n]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for n in names:
            f.write(tensors[n][2])
    return 8 + len(h) + off


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


# ======================================================================================
# MLX affine quantization (mlx/ops.cpp affine_quantize fallback + pack_and_quantize)
# ======================================================================================

def mlx_quantize(w, group_size, bits, dtype):
    """w: float32 [out, in], already rounded to the checkpoint dtype (mlx-lm casts before quantizing).

    MLX rule per group of group_size consecutive columns:
        n_bins = 2^bits - 1
        scale  = max((max - min) / n_bins, 1e-7)
        if |min| > |max|: edge = min (scale > 0) else: edge = max, scale = -scale
        q0 = round(edge / scale);  if q0 != 0: scale = edge / q0;  bias = 0 if q0 == 0 else edge
    (so 0 is exactly representable; the scale is NEGATIVE when |max| >= |min|), then
        q = clip(round((w - bias) / scale), 0, n_bins)       round = half to even
    scales/biases are stored in the checkpoint dtype; here q is computed from the ROUNDED scale/bias
    (MLX computes everything in w.dtype, so its scale/bias are rounded too).
    Packing: uint32 words, el = 32 / bits codes per word, code j of a word at bits [j*bits, (j+1)*bits).
    Returns (words uint32 [out, in*bits/32], scales f32 [out, in/gs], biases f32 [out, in/gs]) where
    scales/biases hold the dtype-rounded values."""
    w = np.asarray(w, dtype=np.float32)
    out, inn = w.shape
    assert inn % group_size == 0 and 32 % bits == 0
    g = w.reshape(out, inn // group_size, group_size)
    n_bins = np.float32((1 << bits) - 1)
    wmax = g.max(-1)
    wmin = g.min(-1)
    mask = np.abs(wmin) > np.abs(wmax)
    scales = np.maximum((wmax - wmin) / n_bins, np.float32(1e-7)).astype(np.float32)
    scales = np.where(mask, scales, -scales)
    edge = np.where(mask, wmin, wmax)
    q0 = np.round(edge / scales)
    scales = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scales).astype(np.float32)
    biases = np.where(q0 == 0, 0, edge).astype(np.float32)
    scales = round_to(scales, dtype)
    biases = round_to(biases, dtype)
    safe = np.where(scales == 0, np.float32(1), scales)
    q = np.clip(np.round((g - biases[..., None]) / safe[..., None]), 0, n_bins).astype(np.uint64)
    q = np.where((scales == 0)[..., None], 0, q).astype(np.uint64)
    el = 32 // bits
    q = q.reshape(out, inn // el, el)
    shifts = (np.arange(el, dtype=np.uint64) * bits)
    words = (q << shifts).sum(-1).astype(np.uint32)
    return words, scales, biases


def mlx_dequantize(words, scales, biases, group_size, bits):
    """Definition: w[r, c] = scales[r, c // gs] * code(r, c) + biases[r, c // gs] (float32), where
    code(r, c) = (words[r, c // el] >> ((c % el) * bits)) & (2^bits - 1), el = 32 / bits."""
    words = np.asarray(words, dtype=np.uint32)
    out, nw = words.shape
    el = 32 // bits
    codes = (words[..., None] >> (np.arange(el, dtype=np.uint32) * bits)) & np.uint32((1 << bits) - 1)
    codes = codes.reshape(out, nw * el).astype(np.float32)
    inn = nw * el
    g = codes.reshape(out, inn // group_size, group_size)
    w = g * np.asarray(scales, np.float32)[..., None] + np.asarray(biases, np.float32)[..., None]
    return w.reshape(out, inn).astype(np.float32)


# ======================================================================================
# ggml block formats: quantizers (simple, valid) and dequantizers (ggml reference formulas)
# ======================================================================================

QK_K = 256
# name: (ggml type id, block size in elements, bytes per block)
GGML_TYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34),
    "q2_k": (10, 256, 84), "q3_k": (11, 256, 110), "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176), "q6_k": (14, 256, 210), "bf16": (30, 1, 2),
}


def _f16b(x):
    """float32 [..] -> uint8 [.., 2] little-endian f16 bytes."""
    return np.ascontiguousarray(np.asarray(x, np.float32).astype("<f2")).view(np.uint8).reshape(
        np.shape(x) + (2,))


def _f16r(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _div(a, b):
    return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def _signed_absmax(x):
    i = np.abs(x).argmax(-1)
    return np.take_along_axis(x, i[..., None], -1)[..., 0]


def q_blocks(x, bs):
    x = np.asarray(x, np.float32)
    assert x.ndim == 2 and x.shape[1] % bs == 0, (x.shape, bs)
    return x.reshape(-1, bs)


def quant_q8_0(x):
    b = q_blocks(x, 32)
    d = _f16r(np.abs(b).max(-1) / 127)
    q = np.clip(np.round(_div(b, d[:, None])), -127, 127).astype(np.int8)
    return np.concatenate([_f16b(d), q.view(np.uint8)], -1)


def quant_q4_0(x):
    b = q_blocks(x, 32)
    d = _f16r(_signed_absmax(b) / -8)
    q = np.clip(np.floor(_div(b, d[:, None]) + 8.5), 0, 15).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([_f16b(d), qs], -1)


def quant_q4_1(x):
    b = q_blocks(x, 32)
    mn, mx = b.min(-1), b.max(-1)
    d = _f16r((mx - mn) / 15)
    m = _f16r(mn)
    q = np.clip(np.floor(_div(b - m[:, None], d[:, None]) + 0.5), 0, 15).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([_f16b(d), _f16b(m), qs], -1)


def _qh32(q):
    """bit j of the little-endian u32 = bit 4 of q[j] (j = 0..31)."""
    hb = ((q >> 4) & 1).astype(np.uint64)
    v = (hb << np.arange(32, dtype=np.uint64)).sum(-1).astype("<u4")
    return np.ascontiguousarray(v).view(np.uint8).reshape(-1, 4)


def quant_q5_0(x):
    b = q_blocks(x, 32)
    d = _f16r(_signed_absmax(b) / -16)
    q = np.clip(np.floor(_div(b, d[:, None]) + 16.5), 0, 31).astype(np.uint8)
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    return np.concatenate([_f16b(d), _qh32(q), qs], -1)


def quant_q5_1(x):
    b = q_blocks(x, 32)
    mn, mx = b.min(-1), b.max(-1)
    d = _f16r((mx - mn) / 31)
    m = _f16r(mn)
    q = np.clip(np.floor(_div(b - m[:, None], d[:, None]) + 0.5), 0, 31).astype(np.uint8)
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    return np.concatenate([_f16b(d), _f16b(m), _qh32(q), qs], -1)


def _scale_min_k(b, nsub, nmax, lmax):
    """Asymmetric sub-block params for q2_k/q4_k/q5_k: value = d*Ls*q - dmin*Lm, q in [0, nmax].
    Returns d, dmin (f16-rounded) [n], Ls, Lm int [n, nsub], q uint8 [n, 256]."""
    s = b.reshape(b.shape[0], nsub, -1)
    mn = np.minimum(s.min(-1), 0)
    sc = (s.max(-1) - mn) / nmax
    d = _f16r(sc.max(-1) / lmax)
    dmin = _f16r((-mn).max(-1) / lmax)
    Ls = np.clip(np.round(_div(sc, d[:, None])), 0, lmax).astype(np.int64)
    Lm = np.clip(np.round(_div(-mn, dmin[:, None])), 0, lmax).astype(np.int64)
    step = d[:, None] * Ls
    off = dmin[:, None] * Lm
    q = np.clip(np.round(_div(s + off[..., None], step[..., None])), 0, nmax).astype(np.uint8)
    return d, dmin, Ls, Lm, q.reshape(b.shape[0], -1)


def _pack_scale_min_k4(Ls, Lm):
    """8 six-bit scales and mins -> 12 bytes (inverse of ggml get_scale_min_k4)."""
    n = Ls.shape[0]
    out = np.zeros((n, 12), np.uint8)
    for j in range(4):
        out[:, j] = Ls[:, j] & 63
        out[:, j + 4] = Lm[:, j] & 63
    for j in range(4, 8):
        out[:, j + 4] = (Ls[:, j] & 0xF) | ((Lm[:, j] & 0xF) << 4)
        out[:, j - 4] |= ((Ls[:, j] >> 4) << 6).astype(np.uint8)
        out[:, j] |= ((Lm[:, j] >> 4) << 6).astype(np.uint8)
    return out


def quant_q2_k(x):
    b = q_blocks(x, QK_K)
    n = b.shape[0]
    d, dmin, Ls, Lm, q = _scale_min_k(b, 16, 3, 15)
    scales = (Ls | (Lm << 4)).astype(np.uint8)
    # element e = h*128 + j*32 + k  ->  qs[h*32 + k] bits 2j
    qq = q.reshape(n, 2, 4, 32).astype(np.uint32)
    qs = (qq << (2 * np.arange(4, dtype=np.uint32))[None, None, :, None]).sum(2).astype(np.uint8)
    return np.concatenate([scales, qs.reshape(n, 64), _f16b(d), _f16b(dmin)], -1)


def quant_q4_k(x):
    b = q_blocks(x, QK_K)
    n = b.shape[0]
    d, dmin, Ls, Lm, q = _scale_min_k(b, 8, 15, 63)
    qq = q.reshape(n, 4, 2, 32)
    qs = (qq[:, :, 0] | (qq[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16b(d), _f16b(dmin), _pack_scale_min_k4(Ls, Lm), qs], -1)


def quant_q5_k(x):
    b = q_blocks(x, QK_K)
    n = b.shape[0]
    d, dmin, Ls, Lm, q = _scale_min_k(b, 8, 31, 63)
    qq = q.reshape(n, 4, 2, 32)
    qs = ((qq[:, :, 0] & 15) | ((qq[:, :, 1] & 15) << 4)).reshape(n, 128)
    # element c*64 + l  -> qh[l] bit 2c ; element c*64 + 32 + l -> qh[l] bit 2c+1
    hb = ((q >> 4) & 1).reshape(n, 8, 32).astype(np.uint32)
    qh = (hb << np.arange(8, dtype=np.uint32)[None, :, None]).sum(1).astype(np.uint8)
    return np.concatenate([_f16b(d), _f16b(dmin), _pack_scale_min_k4(Ls, Lm), qh, qs], -1)


def quant_q3_k(x):
    """value = d * (sc - 32) * (q3 - 4), q3 in 0..7, 16 sub-blocks of 16, sc 6-bit."""
    b = q_blocks(x, QK_K)
    n = b.shape[0]
    s = b.reshape(n, 16, 16)
    sub = -_signed_absmax(s) / 4          # the extreme value maps to q = -4
    d = _f16r(np.abs(sub).max(-1) / 31)
    Ls = np.clip(np.round(_div(sub, d[:, None])), -31, 31).astype(np.int64)
    step = d[:, None] * Ls
    q = np.clip(np.round(_div(s, step[..., None])), -4, 3).astype(np.int64) + 4   # 0..7
    q = q.reshape(n, 256)
    sc = (Ls + 32).astype(np.uint8)      # 1..63
    scales = np.zeros((n, 12), np.uint8)
    for i in range(16):
        scales[:, i % 8] |= ((sc[:, i] & 0xF) << (4 * (i // 8))).astype(np.uint8)
        scales[:, 8 + i % 4] |= (((sc[:, i] >> 4) & 3) << (2 * (i // 4))).astype(np.uint8)
    qq = q.reshape(n, 2, 4, 32).astype(np.uint32)
    qs = ((qq & 3) << (2 * np.arange(4, dtype=np.uint32))[None, None, :, None]).sum(2).astype(np.uint8)
    hb = ((q >> 2) & 1).reshape(n, 8, 32).astype(np.uint32)     # hmask[k] bit s for element s*32 + k
    hmask = (hb << np.arange(8, dtype=np.uint32)[None, :, None]).sum(1).astype(np.uint8)
    return np.concatenate([hmask, qs.reshape(n, 64), scales, _f16b(d)], -1)


def quant_q6_k(x):
    """value = d * sc * (q - 32), q in 0..63, 16 sub-blocks of 16, sc int8."""
    b = q_blocks(x, QK_K)
    n = b.shape[0]
    s = b.reshape(n, 16, 16)
    sub = -_signed_absmax(s) / 32
    d = _f16r(np.abs(sub).max(-1) / 127)
    Ls = np.clip(np.round(_div(sub, d[:, None])), -127, 127).astype(np.int64)
    step = d[:, None] * Ls
    q = (np.clip(np.round(_div(s, step[..., None])), -32, 31).astype(np.int64) + 32).reshape(n, 2, 4, 32)
    q = q.astype(np.uint8)
    ql = np.zeros((n, 2, 64), np.uint8)
    ql[:, :, :32] = (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64).astype(np.uint8),
                           Ls.astype(np.int8).view(np.uint8), _f16b(d)], -1)


def _f16v(b2):
    return np.ascontiguousarray(b2).view("<f2").astype(np.float32)[..., 0]


def deq_q8_0(blk):
    d = _f16v(blk[:, 0:2])
    q = blk[:, 2:34].view(np.int8).astype(np.float32)
    return d[:, None] * q


def deq_q4_0(blk):
    d = _f16v(blk[:, 0:2])
    qs = blk[:, 2:18]
    q = np.concatenate([qs & 15, qs >> 4], -1).astype(np.float32) - 8
    return d[:, None] * q


def deq_q4_1(blk):
    d, m = _f16v(blk[:, 0:2]), _f16v(blk[:, 2:4])
    qs = blk[:, 4:20]
    q = np.concatenate([qs & 15, qs >> 4], -1).astype(np.float32)
    return d[:, None] * q + m[:, None]


def _q5_vals(qh4, qs):
    qh = np.ascontiguousarray(qh4).view("<u4")[:, 0]
    j = np.arange(16, dtype=np.uint32)
    xh0 = ((qh[:, None] >> j) << 4) & 0x10
    xh1 = (qh[:, None] >> (j + 12)) & 0x10
    x0 = (qs & 15).astype(np.uint32) | xh0
    x1 = (qs >> 4).astype(np.uint32) | xh1
    return np.concatenate([x0, x1], -1).astype(np.float32)


def deq_q5_0(blk):
    d = _f16v(blk[:, 0:2])
    return d[:, None] * (_q5_vals(blk[:, 2:6], blk[:, 6:22]) - 16)


def deq_q5_1(blk):
    d, m = _f16v(blk[:, 0:2]), _f16v(blk[:, 2:4])
    return d[:, None] * _q5_vals(blk[:, 4:8], blk[:, 8:24]) + m[:, None]


def deq_q2_k(blk):
    n = blk.shape[0]
    scales, qs = blk[:, 0:16], blk[:, 16:80]
    d, dmin = _f16v(blk[:, 80:82]), _f16v(blk[:, 82:84])
    y = np.zeros((n, 256), np.float32)
    for h in range(2):
        for j in range(4):
            for half in range(2):
                is_ = h * 8 + j * 2 + half
                sc = scales[:, is_]
                dl = d * (sc & 0xF).astype(np.float32)
                ml = dmin * (sc >> 4).astype(np.float32)
                q = (qs[:, h * 32 + half * 16: h * 32 + half * 16 + 16] >> (2 * j)) & 3
                e0 = h * 128 + j * 32 + half * 16
                y[:, e0:e0 + 16] = dl[:, None] * q.astype(np.float32) - ml[:, None]
    return y


def deq_q3_k(blk):
    n = blk.shape[0]
    hm, qs, sb = blk[:, 0:32], blk[:, 32:96], blk[:, 96:108]
    d = _f16v(blk[:, 108:110])
    aux = np.ascontiguousarray(sb).view("<u4").copy()   # [n, 3]
    km1, km2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    a0, a1, tmp = aux[:, 0], aux[:, 1], aux[:, 2]
    r = np.stack([(a0 & km2) | (((tmp >> 0) & km1) << 4),
                  (a1 & km2) | (((tmp >> 2) & km1) << 4),
                  ((a0 >> 4) & km2) | (((tmp >> 4) & km1) << 4),
                  ((a1 >> 4) & km2) | (((tmp >> 6) & km1) << 4)], -1).astype("<u4")
    scales = np.ascontiguousarray(r).view(np.int8).reshape(n, 16).astype(np.float32)
    y = np.zeros((n, 256), np.float32)
    m = 0
    for h in range(2):
        for j in range(4):
            for half in range(2):
                is_ = h * 8 + j * 2 + half
                dl = d * (scales[:, is_] - 32)
                sl = slice(h * 32 + half * 16, h * 32 + half * 16 + 16)
                q = ((qs[:, sl] >> (2 * j)) & 3).astype(np.float32)
                hbit = (hm[:, half * 16: half * 16 + 16] >> m) & 1
                q = q - np.where(hbit != 0, 0, 4)
                e0 = h * 128 + j * 32 + half * 16
                y[:, e0:e0 + 16] = dl[:, None] * q
            m += 1
    return y


def _get_scale_min_k4(j, q):
    if j < 4:
        return (q[:, j] & 63).astype(np.float32), (q[:, j + 4] & 63).astype(np.float32)
    d = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
    m = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
    return d.astype(np.float32), m.astype(np.float32)


def deq_q4_k(blk):
    n = blk.shape[0]
    d, dmin = _f16v(blk[:, 0:2]), _f16v(blk[:, 2:4])
    sc, qs = blk[:, 4:16], blk[:, 16:144]
    y = np.zeros((n, 256), np.float32)
    for c in range(4):
        s1, m1 = _get_scale_min_k4(2 * c, sc)
        s2, m2 = _get_scale_min_k4(2 * c + 1, sc)
        q = qs[:, c * 32:(c + 1) * 32]
        y[:, c * 64: c * 64 + 32] = (d * s1)[:, None] * (q & 0xF).astype(np.float32) - (dmin * m1)[:, None]
        y[:, c * 64 + 32: c * 64 + 64] = (d * s2)[:, None] * (q >> 4).astype(np.float32) - (dmin * m2)[:, None]
    return y


def deq_q5_k(blk):
    n = blk.shape[0]
    d, dmin = _f16v(blk[:, 0:2]), _f16v(blk[:, 2:4])
    sc, qh, ql = blk[:, 4:16], blk[:, 16:48], blk[:, 48:176]
    y = np.zeros((n, 256), np.float32)
    u1, u2 = 1, 2
    for c in range(4):
        s1, m1 = _get_scale_min_k4(2 * c, sc)
        s2, m2 = _get_scale_min_k4(2 * c + 1, sc)
        q = ql[:, c * 32:(c + 1) * 32]
        lo = (q & 0xF).astype(np.float32) + np.where(qh & u1, 16, 0)
        hi = (q >> 4).astype(np.float32) + np.where(qh & u2, 16, 0)
        y[:, c * 64: c * 64 + 32] = (d * s1)[:, None] * lo - (dmin * m1)[:, None]
        y[:, c * 64 + 32: c * 64 + 64] = (d * s2)[:, None] * hi - (dmin * m2)[:, None]
        u1 <<= 2
        u2 <<= 2
    return y


def deq_q6_k(blk):
    n = blk.shape[0]
    ql, qh = blk[:, 0:128], blk[:, 128:192]
    sc = blk[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16v(blk[:, 208:210])
    y = np.zeros((n, 256), np.float32)
    for h in range(2):
        L = ql[:, h * 64:(h + 1) * 64].astype(np.int32)
        H = qh[:, h * 32:(h + 1) * 32].astype(np.int32)
        S = sc[:, h * 8:(h + 1) * 8]
        for l in range(32):
            is_ = l // 16
            q1 = ((L[:, l] & 0xF) | (((H[:, l] >> 0) & 3) << 4)) - 32
            q2 = ((L[:, l + 32] & 0xF) | (((H[:, l] >> 2) & 3) << 4)) - 32
            q3 = ((L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4)) - 32
            q4 = ((L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)) - 32
            y[:, h * 128 + l] = d * S[:, is_ + 0] * q1
            y[:, h * 128 + l + 32] = d * S[:, is_ + 2] * q2
            y[:, h * 128 + l + 64] = d * S[:, is_ + 4] * q3
            y[:, h * 128 + l + 96] = d * S[:, is_ + 6] * q4
    return y


QUANT = {"q8_0": quant_q8_0, "q4_0": quant_q4_0, "q4_1": quant_q4_1, "q5_0": quant_q5_0,
         "q5_1": quant_q5_1, "q2_k": quant_q2_k, "q3_k": quant_q3_k, "q4_k": quant_q4_k,
         "q5_k": quant_q5_k, "q6_k": quant_q6_k}
DEQUANT = {"q8_0": deq_q8_0, "q4_0": deq_q4_0, "q4_1": deq_q4_1, "q5_0": deq_q5_0,
           "q5_1": deq_q5_1, "q2_k": deq_q2_k, "q3_k": deq_q3_k, "q4_k": deq_q4_k,
           "q5_k": deq_q5_k, "q6_k": deq_q6_k}


def ggml_encode(w, typ):
    """w: float32 [rows, cols] (PyTorch layout; ggml ne = [cols, rows]) -> raw bytes (uint8 array)."""
    w = np.asarray(w, np.float32)
    if typ == "f32":
        return np.ascontiguousarray(w.astype("<f4")).view(np.uint8).ravel()
    if typ == "f16":
        return np.ascontiguousarray(w.astype("<f2")).view(np.uint8).ravel()
    if typ == "bf16":
        return np.ascontiguousarray(bf16_bits(w).astype("<u2")).view(np.uint8).ravel()
    blk = QUANT[typ](w)
    assert blk.dtype == np.uint8 and blk.shape[1] == GGML_TYPES[typ][2], (typ, blk.shape)
    return np.ascontiguousarray(blk).ravel()


def ggml_decode(raw, typ, shape):
    """raw bytes -> float32 array of PyTorch shape (rows, cols) (1-D tensors: (n,))."""
    raw = np.asarray(raw, np.uint8)
    if typ == "f32":
        out = raw.view("<f4").astype(np.float32)
    elif typ == "f16":
        out = raw.view("<f2").astype(np.float32)
    elif typ == "bf16":
        out = bf16_to_f32(raw.view("<u2"))
    else:
        _, bs, nb = GGML_TYPES[typ]
        out = DEQUANT[typ](raw.reshape(-1, nb)).astype(np.float32)
    return out.reshape(shape)


def ggml_nbytes(typ, n):
    _, bs, nb = GGML_TYPES[typ]
    assert n % bs == 0
    return n // bs * nb


# ======================================================================================
# GGUF v3 writer
# ======================================================================================

GGUF_VT = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8,
           "arr": 9, "u64": 10, "i64": 11, "f64": 12}
_VT_FMT = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f",
           "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}


def _gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _gval(vt, v):
    if vt == "str":
        return _gstr(v)
    if vt.startswith("arr:"):
        et = vt[4:]
        out = struct.pack("<IQ", GGUF_VT[et], len(v))
        for e in v:
            out += _gval(et, e)
        return out
    return struct.pack(_VT_FMT[vt], v)


def gguf_write(path, kvs, tensors, alignment=32):
    """kvs: list of (key, vtype, value), vtype in GGUF_VT names or 'arr:<elem>'.
    tensors: list of (name, ggml type name, torch shape tuple, raw uint8 bytes). ggml ne = reversed shape.
    Layout: header (magic 'GGUF', u32 version 3, u64 n_tensors, u64 n_kv), kvs, tensor infos
    (name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset relative to the data section), zero padding to
    `alignment`, data (each tensor starts at a multiple of `alignment`)."""
    out = bytearray()
    out += b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, vt, v in kvs:
        tid = GGUF_VT["arr"] if vt.startswith("arr:") else GGUF_VT[vt]
        out += _gstr(k) + struct.pack("<I", tid) + _gval(vt, v)
    off = 0
    offsets = []
    for name, typ, shape, raw in tensors:
        ne = list(reversed(shape))
        n = int(np.prod(shape))
        assert len(raw) == ggml_nbytes(typ, n), (name, typ, len(raw))
        assert ne[0] % GGML_TYPES[typ][1] == 0
        out += _gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
        out += struct.pack("<IQ", GGML_TYPES[typ][0], off)
        offsets.append(off)
        off += len(raw)
        off += (-off) % alignment
    out += b"\0" * ((-len(out)) % alignment)
    base = len(out)
    for (name, typ, shape, raw), o in zip(tensors, offsets):
        assert len(out) - base == o
        out += bytes(np.asarray(raw, np.uint8))
        out += b"\0" * ((-len(out)) % alignment)
    with open(path, "wb") as f:
        f.write(out)
    return len(out)


# ======================================================================================
# HF <-> GGUF tensor mapping (convert_hf_to_gguf.py conventions)
# ======================================================================================

def llama_permute(w, n_head, n_head_kv=None):
    """convert_hf_to_gguf.py LlamaModel.permute (q: n_head; k: n_head_kv): within each head, the rows
    are reordered from HF's [first half | second half] (rotate_half RoPE) to interleaved pairs
    (row 2i <- row i, row 2i+1 <- row i + head_dim/2), which ggml's normal (non-NeoX) RoPE expects."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama_unpermute(w, n_head, n_head_kv=None):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


HF2GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


# Gemma 3 (llama.cpp's gemma3 tensors): the norm after attention is its own tensor, and the ffn
# norm is the one before the feed-forward.
HF2GGUF_GEMMA3 = dict(HF2GGUF_LAYER, **{
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
})


def hf_to_gguf_name(n, arch=None):
    if n == "model.embed_tokens.weight":
        return "token_embd.weight"
    if n == "model.norm.weight":
        return "output_norm.weight"
    if n == "lm_head.weight":
        return "output.weight"
    p = n.split(".")
    assert p[0] == "model" and p[1] == "layers", n
    table = HF2GGUF_GEMMA3 if arch == "gemma3" else HF2GGUF_LAYER
    return f"blk.{p[2]}." + table[".".join(p[3:])]


# file_type (llama_ftype) recorded in general.file_type
FTYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10,
         "q3_k": 11, "q4_k": 14, "q5_k": 16, "q6_k": 18, "q4_k_m": 15, "bf16": 32}


def tensor_type_for(gname, ftype):
    """GGUF type of one tensor: 1-D tensors (norms, biases) are F32; matrices follow the file type."""
    if ftype == "q4_k_m":
        if gname == "token_embd.weight" or gname.endswith("attn_v.weight") or gname.endswith("ffn_down.weight"):
            return "q6_k"
        return "q4_k"
    return ftype


def build_gguf(path, arch, hp, sd, ftype, name):
    """sd: dict HF name -> float32 numpy array. Returns (bytes written, dequantized HF state dict,
    {gguf name: type})."""
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
    head_dim = hp["head_dim"]
    kvs = [
        ("general.architecture", "str", arch),
        ("general.name", "str", name),
        ("general.file_type", "u32", FTYPE[ftype]),
        ("general.alignment", "u32", 32),
        (f"{arch}.context_length", "u32", hp["max_position_embeddings"]),
        (f"{arch}.embedding_length", "u32", hp["hidden_size"]),
        (f"{arch}.block_count", "u32", hp["num_hidden_layers"]),
        (f"{arch}.feed_forward_length", "u32", hp["intermediate_size"]),
        (f"{arch}.attention.head_count", "u32", n_head),
        (f"{arch}.attention.head_count_kv", "u32", n_kv),
        (f"{arch}.attention.key_length", "u32", head_dim),
        (f"{arch}.attention.value_length", "u32", head_dim),
        (f"{arch}.rope.dimension_count", "u32", head_dim),
        (f"{arch}.rope.freq_base", "f32", float(hp["rope_theta"])),
        (f"{arch}.attention.layer_norm_rms_epsilon", "f32", float(hp["rms_norm_eps"])),
        (f"{arch}.vocab_size", "u32", hp["vocab_size"]),
    ]
    gemma = arch == "gemma3"
    if gemma:
        # as llama.cpp's converter writes Gemma 3 (rope.freq_base is the global layers' base, the
        # linear scaling applies to them only); sliding_window_pattern is read by llama.cpp
        # (default 6) but not written by the converter: 2 here so that 2 layers hold both kinds.
        kvs += [
            (f"{arch}.attention.sliding_window", "u32", hp["sliding_window"]),
            (f"{arch}.attention.sliding_window_pattern", "u32", hp["sliding_window_pattern"]),
            (f"{arch}.rope.freq_base_swa", "f32", float(hp["rope_local_theta"])),
            (f"{arch}.rope.scaling.type", "str", "linear"),
            (f"{arch}.rope.scaling.factor", "f32", float(hp["rope_factor"])),
        ]
    tensors, deq, types = [], {}, {}
    order = sorted(sd, key=_hf_order)
    for hn in order:
        w = np.asarray(sd[hn], np.float32)
        gn = hf_to_gguf_name(hn, arch)
        perm = None
        # llama.cpp's Gemma 3 converter stores norms as 1 + w (Gemma3RMSNorm scales by 1 + w);
        # (1 + w) - 1 is exact in f32, so the reference sees the same numbers
        shift = 1.0 if gemma and hn.endswith("norm.weight") else 0.0
        if shift:
            w = (w + np.float32(shift)).astype(np.float32)
        if arch == "llama" and gn.endswith("attn_q.weight"):
            perm = (n_head, n_head)
        elif arch == "llama" and gn.endswith("attn_k.weight"):
            perm = (n_head, n_kv)
        g = llama_permute(w, *perm) if perm else w
        typ = "f32" if w.ndim == 1 else tensor_type_for(gn, ftype)
        raw = ggml_encode(g, typ)
        back = ggml_decode(raw, typ, g.shape)
        deq[hn] = llama_unpermute(back, *perm) if perm else back
        if shift:
            deq[hn] = (deq[hn] - np.float32(shift)).astype(np.float32)
        tensors.append((gn, typ, tuple(g.shape), raw))
        types[gn] = typ
    size = gguf_write(path, kvs, tensors)
    return size, deq, types


def _hf_order(n):
    if n.startswith("model.embed_tokens"):
        return (0, 0, "")
    if n.startswith("model.layers."):
        p = n.split(".")
        return (1, int(p[2]), ".".join(p[3:]))
    if n.startswith("model.norm"):
        return (2, 0, "")
    return (3, 0, n)


# ======================================================================================
# self test (numpy only)
# ======================================================================================

def selftest(gguf_py=None):
    rng = np.random.default_rng(0)
    # --- MLX pack/unpack
    for bits in (2, 4, 8):
        for gs in (32, 64):
            for dt in ("bfloat16", "float16"):
                w = round_to(rng.normal(0, 0.2, (8, 128)).astype(np.float32), dt)
                w[0, :gs] = 0.0                        # constant group
                w[1, :gs] = np.abs(w[1, :gs])          # all positive
                words, s, b = mlx_quantize(w, gs, bits, dt)
                assert words.shape == (8, 128 * bits // 32) and words.dtype == np.uint32
                deq = mlx_dequantize(words, s, b, gs, bits)
                # each element is the nearest representable value (clamped to the group's code range)
                lo = b
                hi = b + s * ((1 << bits) - 1)
                wc = np.clip(w.reshape(8, -1, gs), np.minimum(lo, hi)[..., None], np.maximum(lo, hi)[..., None])
                err = np.abs(deq.reshape(8, -1, gs) - wc)
                tol = np.abs(s)[..., None] * 0.5 * (1 + 1e-2) + 1e-6
                assert (err <= tol).all(), (bits, gs, dt, float((err - tol).max()))
                rel = float(np.sqrt(((deq - w) ** 2).mean() / (w ** 2).mean()))
                assert rel < {2: 0.6, 4: 0.12, 8: 0.01}[bits], (bits, rel)
                assert (deq[0, :gs] == 0).all()
                # explicit bit positions: code of column c lives at bits (c % el) * bits of word c // el
                el = 32 // bits
                r, c = 3, 37
                code = (int(words[r, c // el]) >> ((c % el) * bits)) & ((1 << bits) - 1)
                g = c // gs
                assert abs(s[r, g] * code + b[r, g] - deq[r, c]) < 1e-6
    # 4-bit: low nibble first
    w = np.zeros((1, 32), np.float32)
    w[0, :] = np.arange(32) % 16
    words, s, b = mlx_quantize(w, 32, 4, "float16")
    deq = mlx_dequantize(words, s, b, 32, 4)
    assert np.allclose(deq, w, atol=1e-3), deq
    # --- ggml round trips
    for typ in QUANT:
        bs = GGML_TYPES[typ][1]
        x = rng.normal(0, 0.1, (6, 512)).astype(np.float32)
        x[1] *= 5
        x[2, :bs] = 0
        x[3] = np.abs(x[3])
        x[4] = -np.abs(x[4])
        raw = ggml_encode(x, typ)
        assert raw.size == ggml_nbytes(typ, x.size)
        y = ggml_decode(raw, typ, x.shape)
        rel = float(np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()))
        lim = {"q8_0": 0.01, "q6_k": 0.03, "q5_0": 0.05, "q5_1": 0.05, "q5_k": 0.05, "q4_0": 0.1,
               "q4_1": 0.1, "q4_k": 0.1, "q3_k": 0.2, "q2_k": 0.45}[typ]
        log(f"  {typ}: rel rms err {rel:.4f} (limit {lim})")
        assert rel < lim, (typ, rel)
        assert (y[2, :bs] == 0).all() or typ in ("q2_k", "q4_k", "q5_k"), typ
    for typ in ("f32", "f16", "bf16"):
        x = rng.normal(0, 1, (3, 64)).astype(np.float32)
        y = ggml_decode(ggml_encode(x, typ), typ, x.shape)
        assert np.allclose(y, x, rtol=1e-2), typ
    # --- permutation
    w = rng.normal(size=(4 * 8, 5)).astype(np.float32)
    assert np.array_equal(llama_unpermute(llama_permute(w, 4), 4), w)
    wk = rng.normal(size=(2 * 8, 5)).astype(np.float32)
    assert np.array_equal(llama_unpermute(llama_permute(wk, 4, 2), 4, 2), wk)
    p = llama_permute(np.arange(8, dtype=np.float32)[:, None], 1)[:, 0]
    assert list(p) == [0, 4, 1, 5, 2, 6, 3, 7], p
    # --- safetensors writer
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        fn = os.path.join(td, "t.safetensors")
        write_safetensors(fn, {"a": st_tensor(np.arange(6, dtype=np.uint32).reshape(2, 3), "uint32"),
                               "b": st_tensor(np.ones(3, np.float32), "bfloat16")}, {"format": "mlx"})
        h, base = read_safetensors_header(fn)
        assert base % 8 == 0 and h["a"]["dtype"] == "U32" and h["b"]["data_offsets"] == [24, 30], h
        raw = open(fn, "rb").read()
        assert raw[base + 24:base + 30] == bytes([0x80, 0x3F] * 3)
    # --- GGUF writer and cross-check with gguf-py (llama.cpp's reference python package)
    if gguf_py:
        sys.path.insert(0, gguf_py)
        from gguf.gguf_reader import GGUFReader
        from gguf.quants import dequantize as gdeq
        with tempfile.TemporaryDirectory() as td:
            fn = os.path.join(td, "t.gguf")
            tens = []
            mine = {}
            for i, typ in enumerate(list(QUANT) + ["f32", "f16", "bf16"]):
                x = rng.normal(0, 0.1, (3, 512)).astype(np.float32)
                raw = ggml_encode(x, typ)
                tens.append((f"t{i}.{typ}", typ, x.shape, raw))
                mine[f"t{i}.{typ}"] = ggml_decode(raw, typ, x.shape)
            gguf_write(fn, [("general.architecture", "str", "llama"), ("x.f", "f32", 1.5),
                            ("x.arr", "arr:u32", [1, 2, 3])], tens)
            r = GGUFReader(fn)
            assert str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8") == "llama"
            for t in r.tensors:
                ref = np.asarray(gdeq(t.data, t.tensor_type), np.float32).reshape(3, 512)
                d = float(np.abs(ref - mine[t.name]).max())
                log(f"  gguf-py {t.name}: type {t.tensor_type.name} shape {list(t.shape)} max|diff| {d:.3g}")
                assert d <= 1e-6 * max(1.0, float(np.abs(ref).max())), (t.name, d)
    log("selftest OK")


# ======================================================================================
# generation (needs torch + transformers)
# ======================================================================================

def build_mlx(path, params, spec, cfg, src):
    """Write an mlx-lm style folder (model.safetensors, index, config.json, generation_config.json).
    params: HF name -> float32 numpy. cfg: source config dict (modified in place). Returns (deq, qinfo, q)."""
    dt = spec["dtype"]
    tensors, deq, qinfo = {}, {}, {}
    for n, w in params.items():
        w = round_to(w, dt)                                   # mlx-lm casts to the dtype first
        if w.ndim == 2:
            mod = n[: -len(".weight")]
            ov = spec["overrides"].get(mod, {})
            gs = ov.get("group_size", spec["group_size"])
            bits = ov.get("bits", spec["bits"])
            words, s, b = mlx_quantize(w, gs, bits, dt)
            tensors[mod + ".weight"] = st_tensor(words, "uint32")
            tensors[mod + ".scales"] = st_tensor(s, dt)
            tensors[mod + ".biases"] = st_tensor(b, dt)
            deq[n] = mlx_dequantize(words, s, b, gs, bits)
            qinfo[mod] = dict(bits=bits, group_size=gs,
                              rel_rms_err=float(np.sqrt(((deq[n] - w) ** 2).mean() / (w ** 2).mean())))
        else:
            tensors[n] = st_tensor(w, dt)
            deq[n] = w
    write_safetensors(os.path.join(path, "model.safetensors"), tensors, {"format": "mlx"})
    total = sum(len(t[2]) for t in tensors.values())
    json.dump({"metadata": {"total_size": total},
               "weight_map": {k: "model.safetensors" for k in sorted(tensors)}},
              open(os.path.join(path, "model.safetensors.index.json"), "w"), indent=4)
    q = {"group_size": spec["group_size"], "bits": spec["bits"]}
    if spec["mode"]:
        q["mode"] = "affine"
    q.update({k: dict(v) for k, v in spec["overrides"].items()})
    cfg["quantization"] = q
    cfg["quantization_config"] = json.loads(json.dumps(q))
    cfg["dtype"] = dt
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"), indent=4)
    gcfg = os.path.join(src, "generation_config.json")
    if os.path.exists(gcfg):
        open(os.path.join(path, "generation_config.json"), "w").write(open(gcfg).read())
    return deq, qinfo, q


MLX_SPECS = [
    dict(name="qwen3-mlx4", src="qwen3-f32", bits=4, group_size=64, dtype="bfloat16", mode=False,
         overrides={}, desc="qwen3-f32 weights, MLX affine 4-bit, group 64, bf16 scales/biases, tied embedding quantized"),
    dict(name="qwen3-mlx8", src="qwen3-f32", bits=8, group_size=32, dtype="float16", mode=False,
         overrides={}, desc="qwen3-f32 weights, MLX affine 8-bit, group 32, f16 scales/biases"),
    dict(name="llama-mlx4", src="llama-f32", bits=4, group_size=32, dtype="bfloat16", mode=True,
         overrides={"model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8}},
         desc="llama-f32 weights (sharded source), MLX affine 4-bit, group 32, bf16, untied lm_head quantized, "
              "per-layer override model.layers.0.mlp.down_proj = 8-bit group 64"),
    dict(name="gemma3-mlx4", src="gemma3-f32", bits=4, group_size=32, dtype="bfloat16", mode=True,
         overrides={}, desc="gemma3-f32 weights, MLX affine 4-bit, group 32, bf16 scales/biases, tied embedding "
                            "quantized, norms stored as w (the model adds 1)"),
]

GG_COMMON = dict(vocab_size=256, hidden_size=256, intermediate_size=256, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=256, bos_token_id=1,
                 eos_token_id=2, hidden_act="silu")
GG_W_STD = 1.5 / 16.0   # logits std ~ sqrt(hidden) * std = 1.5
GG_BIAS_STD = 0.1
GG_NORM_STD = 0.2

GG_ARCH = {
    "qwen3": dict(model_type="qwen3", rope_theta=1e6, rms_norm_eps=1e-6,
                  extra=dict(tie_word_embeddings=True, use_sliding_window=False), base_seed=1000),
    "qwen2": dict(model_type="qwen2", rope_theta=1e6, rms_norm_eps=1e-6,
                  extra=dict(tie_word_embeddings=True, use_sliding_window=False), base_seed=2000),
    "llama": dict(model_type="llama", rope_theta=1e6, rms_norm_eps=1e-5,
                  extra=dict(tie_word_embeddings=False), base_seed=3000),
    # query_pre_attn_scalar = head_dim: llama.cpp scales attention by 1/sqrt(head_dim) for Gemma 3
    "gemma3": dict(model_type="gemma3_text", rope_theta=1e6, rms_norm_eps=1e-6, norm_centre=0.0,
                   rope={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                   extra=dict(tie_word_embeddings=True, sliding_window=6, query_pre_attn_scalar=64,
                              hidden_activation="gelu_pytorch_tanh",
                              layer_types=["sliding_attention", "full_attention"]),
                   gguf=dict(sliding_window=6, sliding_window_pattern=2, rope_local_theta=10000.0, rope_factor=8.0),
                   base_seed=4000),
}


def gguf_specs():
    S = []
    for t in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"):
        S.append(dict(name=f"qwen3-gguf-{t}", arch="qwen3", ftype=t, layers=1))
    S.append(dict(name="qwen3-gguf-q4_k_m", arch="qwen3", ftype="q4_k_m", layers=2))
    S.append(dict(name="llama-gguf-q8_0", arch="llama", ftype="q8_0", layers=1))
    S.append(dict(name="llama-gguf-q4_k", arch="llama", ftype="q4_k", layers=2))
    S.append(dict(name="qwen2-gguf-q8_0", arch="qwen2", ftype="q8_0", layers=1))
    S.append(dict(name="gemma3-gguf-q8_0", arch="gemma3", ftype="q8_0", layers=2))
    S.append(dict(name="gemma3-gguf-q4_k", arch="gemma3", ftype="q4_k", layers=2))
    return S


GOOD_MARGIN = 1e-2
GG_MAX_SEEDS = 16


def generate(outdir, only):
    import torch
    import transformers
    import safetensors
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_fixtures as gf
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the MLX fixtures quantize a float fixture: from tests/fixtures, or from GEN_FIXTURES_SRC when
    # that fixture was generated in the same session
    fixtures = os.environ.get("GEN_FIXTURES_SRC", os.path.join(repo, "tests", "fixtures"))
    gguf_py = os.path.join(repo, ".gguf-py", "gguf-py")
    have_gguf_py = os.path.isdir(gguf_py)
    if have_gguf_py:
        sys.path.insert(0, gguf_py)
    os.makedirs(outdir, exist_ok=True)
    versions = dict(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
                    numpy=np.__version__, safetensors=getattr(safetensors, "__version__", "?"))
    log("versions:", versions)
    summary = dict(versions=versions, command=" ".join(sys.argv), fixtures={})

    def finish(name, path, ids, ref, model, extra):
        gf.save_expected(path, ids, ref)
        diff, same, pdiff = gf.consistency(model, ids, ref)
        files = {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}
        info = dict(logits_std=float(ref["logits"].std()), logits_absmax=float(ref["logits"].abs().max()),
                    last_margin=float(ref["last_margin"]), min_greedy_margin=float(ref["margins"].min()),
                    greedy_ids=[int(x) for x in ref["greedy"]],
                    cache_vs_nocache_max_logit_diff=diff, cache_argmax_equal=same, files=files,
                    bytes=sum(files.values()))
        info.update(extra)
        summary["fixtures"][name] = info
        log(f"  {name}: logits std {info['logits_std']:.3f}, last margin {info['last_margin']:.4f}, "
            f"min greedy margin {info['min_greedy_margin']:.4f}, cache diff {diff:.2e} {same}, bytes {info['bytes']}")

    # ---------------- MLX ----------------
    for spec in MLX_SPECS:
        name = spec["name"]
        if only and name not in only:
            continue
        log(f"\n=== {name} ===")
        src = os.path.join(fixtures, spec["src"])
        model = gf.load_model(src)
        cfg = json.load(open(os.path.join(src, "config.json")))
        dt = spec["dtype"]
        path = os.path.join(outdir, name)
        os.makedirs(path, exist_ok=True)
        params = {n: p.detach().float().cpu().numpy().copy() for n, p in model.named_parameters()}
        deq, qinfo, q = build_mlx(path, params, spec, cfg, src)
        # reference: HF model with the dequantized weights
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(torch.from_numpy(deq[n]))
        ids = gf.prompt_ids(cfg["vocab_size"])
        ref = gf.reference(model, ids)
        finish(name, path, ids, ref, model, dict(kind="mlx", desc=spec["desc"], quantization=q, dtype=dt,
                                                  tensors=qinfo))

    # ---------------- GGUF ----------------
    base_cache = {}

    def base_model(arch, layers, seed):
        key = (arch, layers, seed)
        if key not in base_cache:
            a = GG_ARCH[arch]
            kw = dict(GG_COMMON, num_hidden_layers=layers, rms_norm_eps=a["rms_norm_eps"], **a["extra"])
            cfg, _ = gf.make_config(a["model_type"], kw,
                                    a.get("rope", {"rope_type": "default", "rope_theta": a["rope_theta"]}))
            torch.manual_seed(seed)
            m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(torch.float32)
            torch.manual_seed(seed)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    if n.endswith("norm.weight"):
                        p.copy_(a.get("norm_centre", 1.0) + GG_NORM_STD * torch.randn_like(p))
                    elif n.endswith(".bias"):
                        p.normal_(0.0, GG_BIAS_STD)
                    elif p.dim() == 2:
                        p.normal_(0.0, GG_W_STD)
                    else:
                        raise RuntimeError(n)
            m.eval()
            sd = {n: p.detach().numpy().copy() for n, p in m.named_parameters()}
            base_cache.clear()
            base_cache[key] = (m, sd, cfg)
        return base_cache[key]

    gg_check = {}
    for spec in gguf_specs():
        name = spec["name"]
        if only and name not in only:
            continue
        log(f"\n=== {name} ===")
        arch = spec["arch"]
        a = GG_ARCH[arch]
        path = os.path.join(outdir, name)
        os.makedirs(path, exist_ok=True)
        best = None
        for seed in range(a["base_seed"], a["base_seed"] + GG_MAX_SEEDS):
            m, sd, cfg = base_model(arch, spec["layers"], seed)
            hp = dict(GG_COMMON, num_hidden_layers=spec["layers"], rope_theta=a["rope_theta"],
                      rms_norm_eps=a["rms_norm_eps"], **a.get("gguf", {}))
            fn = os.path.join(path, "model.gguf")
            size, deq, types = build_gguf(fn, arch, hp, sd, spec["ftype"], name)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(torch.from_numpy(deq[n]))
            ids = gf.prompt_ids(GG_COMMON["vocab_size"])
            ref = gf.reference(m, ids)
            mm = min(float(ref["margins"].min()), ref["last_margin"])
            log(f"  seed {seed}: logits std {float(ref['logits'].std()):.3f}, min margin {mm:.5f}")
            if best is None or mm > best[0]:
                best = (mm, seed)
            if mm >= GOOD_MARGIN:
                break
        if best[1] != seed:
            seed = best[1]
            m, sd, cfg = base_model(arch, spec["layers"], seed)
            size, deq, types = build_gguf(fn, arch, hp, sd, spec["ftype"], name)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(torch.from_numpy(deq[n]))
            ref = gf.reference(m, ids)
        errs = {}
        for n in sd:
            if sd[n].ndim == 2:
                errs[hf_to_gguf_name(n, arch)] = float(np.sqrt(((deq[n] - sd[n]) ** 2).mean() / (sd[n] ** 2).mean()))
        # independent check of the file and of our dequantizers with llama.cpp's gguf-py
        chk = "gguf-py not available"
        if have_gguf_py:
            try:
                from gguf.gguf_reader import GGUFReader
                from gguf.quants import dequantize as gdeq
                r = GGUFReader(fn)
                worst = 0.0
                mine = {}
                for hn in sd:
                    gn = hf_to_gguf_name(hn, arch)
                    w = deq[hn]
                    if arch == "gemma3" and hn.endswith("norm.weight"):
                        w = w + np.float32(1.0)
                    if arch == "llama" and gn.endswith("attn_q.weight"):
                        w = llama_permute(w, hp["num_attention_heads"])
                    elif arch == "llama" and gn.endswith("attn_k.weight"):
                        w = llama_permute(w, hp["num_attention_heads"], hp["num_key_value_heads"])
                    mine[gn] = w
                for t in r.tensors:
                    ref_w = np.asarray(gdeq(t.data, t.tensor_type), np.float32).reshape(mine[t.name].shape)
                    worst = max(worst, float(np.abs(ref_w - mine[t.name]).max()))
                assert len(r.tensors) == len(mine)
                arch_r = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
                chk = f"gguf-py read {len(r.tensors)} tensors, arch {arch_r}, max |dequant diff| {worst:.3g}"
                gg_check[name] = worst
            except Exception as e:  # noqa: BLE001
                chk = f"gguf-py check FAILED: {e!r}"
                gg_check[name] = repr(e)
        log("  " + chk)
        finish(name, path, ids, ref, m, dict(kind="gguf", arch=arch, ftype=spec["ftype"], seed=seed,
                                              layers=spec["layers"], tensor_types=types, rel_rms_err=errs,
                                              gguf_py_check=chk,
                                              n_tensors=len(types)))

    total = sum(v["bytes"] for v in summary["fixtures"].values())
    summary["total_bytes"] = total
    json.dump(summary, open(os.path.join(outdir, "quant_summary.json"), "w"), indent=1)
    try:
        open(os.path.join(outdir, "quant_readme_rows.md"), "w").write(render_readme(summary))
    except Exception as e:  # noqa: BLE001
        log("readme rendering failed:", repr(e))
    log(f"\nTOTAL bytes {total}")
    return summary


def render_readme(summary):
    """Table rows for tests/fixtures/README.md (the prose of that section is written by hand)."""
    L = []
    L.append("| name | format | arch | layers | tensor types | seed | logits std | prompt last margin | "
             "min greedy margin | bytes |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, i in summary["fixtures"].items():
        if i["kind"] == "mlx":
            q = i["quantization"]
            fmt = f"MLX {q['bits']}-bit g{q['group_size']} {i['dtype']}"
            arch = name.split("-")[0]
            layers = 4 if arch == "gemma3" else 3
            types = ", ".join(sorted({f"{v['bits']}b/g{v['group_size']}" for v in i["tensors"].values()}))
            seed = "(source fixture)"
        else:
            fmt = f"GGUF {i['ftype']}"
            arch, layers, seed = i["arch"], i["layers"], i["seed"]
            types = ", ".join(sorted(set(i["tensor_types"].values())))
        L.append(f"| `{name}` | {fmt} | {arch} | {layers} | {types} | {seed} | {i['logits_std']:.3f} | "
                 f"{i['last_margin']:.4f} | {i['min_greedy_margin']:.4f} | {i['bytes']} |")
    L.append("")
    for name, i in summary["fixtures"].items():
        L.append(f"- `{name}`: greedy_ids {i['greedy_ids']}; cached greedy vs no-cache forward max |logit diff| "
                 f"{i['cache_vs_nocache_max_logit_diff']:.2e}, argmax equal {i['cache_argmax_equal']}")
        if i["kind"] == "mlx":
            errs = ", ".join(f"{k} {v['bits']}b/g{v['group_size']} {v['rel_rms_err']:.4f}"
                             for k, v in i["tensors"].items() if k.startswith(("model.embed", "lm_head",
                                                                                "model.layers.0.")))
            L.append(f"  - relative RMS quantization error (weights vs dequantized): {errs}")
        else:
            e = i["rel_rms_err"]
            L.append(f"  - relative RMS quantization error: max {max(e.values()):.4f}, "
                     f"token_embd {e.get('token_embd.weight', float('nan')):.4f}; {i['gguf_py_check']}")
    return "\n".join(L) + "\n"


def main(argv):
    if len(argv) >= 3 and argv[1] == "--readme":
        sys.stdout.write(render_readme(json.load(open(argv[2]))))
        return 0
    if len(argv) >= 2 and argv[1] == "--selftest":
        selftest(argv[2] if len(argv) > 2 else None)
        return 0
    if len(argv) < 2:
        print(__doc__)
        return 2
    t0 = time.time()
    generate(argv[1], set(argv[2:]))
    log(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
