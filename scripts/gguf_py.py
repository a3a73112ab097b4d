#!/usr/bin/env python3
"""Minimal GGUF v3 writer and reader in pure Python (numpy optional), for golden fixtures.

The writer only lays out the container: header, metadata, tensor infos and the data
section aligned to 32 bytes. Tensor bytes are given ready-made: a numpy array (its
little-endian bytes are taken as is) or `bytes` (for quantized types: the raw blocks,
e.g. block_q8_0 = f16 d + 32 int8). Shapes are given OUTERMOST FIRST, as numpy and
gerbil list them ([n_out, n_in] for a weight); the file stores ggml's reversed ne[].

    from gguf_py import GGUFWriter, GGML
    w = GGUFWriter()
    w.add("general.architecture", "string", "llama")
    w.add("llama.block_count", "u32", 2)
    w.add_array("tokenizer.ggml.tokens", "string", ["<unk>", "<s>"])
    w.add_tensor("token_embd.weight", GGML["F32"], [512, 64], emb.astype("<f4"))
    w.add_tensor("blk.0.attn_q.weight", GGML["Q8_0"], [64, 64], q8_bytes)
    w.write("model.gguf")

    version, kv, tensors = read("model.gguf")   # kv: {key: (type, value)}

Command line:  gguf_py.py dump FILE            print metadata and tensor infos
               gguf_py.py selftest-write FILE  write the small file tests/test_gguf.c reads
"""
import os
import struct
import sys

# Metadata value types (gguf_metadata_value_type).
VTYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7,
          "string": 8, "array": 9, "u64": 10, "i64": 11, "f64": 12}
VTYPE_NAMES = {v: k for k, v in VTYPES.items()}
_PACK = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f",
         "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}

# ggml type ids (enum ggml_type) and (block size in elements, bytes per block).
GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
        "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "I8": 24,
        "I16": 25, "I32": 26, "I64": 27, "F64": 28, "BF16": 30}
GGML_NAMES = {v: k for k, v in GGML.items()}
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
         28: (1, 8), 30: (1, 2)}

ALIGNMENT = 32


def tensor_nbytes(ggml_type, shape):
    """Bytes of a tensor of this type and shape (outermost first)."""
    bs, ts = BLOCK[ggml_type]
    if not shape or any(int(d) < 1 for d in shape):
        raise ValueError("shape %r: every dim must be >= 1" % (shape,))
    if shape[-1] % bs:
        raise ValueError("innermost dim %d not a multiple of the block size %d" % (shape[-1], bs))
    n = ts * (shape[-1] // bs)
    for d in shape[:-1]:
        n *= int(d)
    return n


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _scalar(vtype, value):
    return struct.pack(_PACK[vtype], value)


class GGUFWriter:
    def __init__(self):
        self.kv = []        # serialized pairs
        self.keys = set()
        self.tensors = []   # (name, ggml_type, shape, data bytes)

    def _key(self, key):
        if key in self.keys:
            raise ValueError("duplicate key %r" % key)
        self.keys.add(key)

    def add(self, key, vtype, value):
        """A scalar ("u8" ... "f64", "bool") or a "string"."""
        self._key(key)
        if vtype == "string":
            body = _str(value)
        elif vtype in _PACK:
            body = _scalar(vtype, value)
        else:
            raise ValueError("add: %r is not a scalar or string type" % vtype)
        self.kv.append(_str(key) + struct.pack("<I", VTYPES[vtype]) + body)

    def add_array(self, key, elem_vtype, values):
        """An array of scalars or strings (values: any iterable)."""
        self._key(key)
        values = list(values)
        if elem_vtype == "string":
            body = b"".join(_str(v) for v in values)
        elif elem_vtype in _PACK:
            body = b"".join(_scalar(elem_vtype, v) for v in values)
        else:
            raise ValueError("add_array: bad element type %r" % elem_vtype)
        self.kv.append(_str(key) + struct.pack("<IIQ", VTYPES["array"], VTYPES[elem_vtype],
                                                len(values)) + body)

    def add_tensor(self, name, ggml_type, shape, data):
        """shape outermost first; data: bytes, or a numpy array (C order, little-endian)."""
        if isinstance(ggml_type, str):
            ggml_type = GGML[ggml_type]
        if any(t[0] == name for t in self.tensors):
            raise ValueError("duplicate tensor %r" % name)
        shape = [int(d) for d in shape]
        if not 1 <= len(shape) <= 4:
            raise ValueError("%s: %d dims, expected 1 to 4" % (name, len(shape)))
        if hasattr(data, "tobytes"):
            if getattr(data.dtype, "byteorder", "=") == ">" or (
                    data.dtype.byteorder == "=" and sys.byteorder != "little"):
                raise ValueError("%s: data must be little-endian" % name)
            data = data.tobytes(order="C")
        data = bytes(data)
        want = tensor_nbytes(ggml_type, shape)
        if len(data) != want:
            raise ValueError("%s: %d bytes given, %s %r needs %d" % (
                name, len(data), GGML_NAMES.get(ggml_type, ggml_type), shape, want))
        self.tensors.append((name, ggml_type, shape, data))

    def write(self, path):
        """Write to path + ".tmp", then rename over path."""
        pad = lambda n: (-n) % ALIGNMENT
        out = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))] + self.kv
        off = 0
        for name, t, shape, data in self.tensors:
            ne = list(reversed(shape))  # ggml order: innermost first
            out.append(_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
                       + struct.pack("<IQ", t, off))
            off += len(data) + pad(len(data))
        header = b"".join(out)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(header + b"\0" * pad(len(header)))
            for _, _, _, data in self.tensors:
                f.write(data + b"\0" * pad(len(data)))
        os.replace(tmp, path)


def read(path):
    """Parse a GGUF v2/v3 file: (version, {key: (vtype name, value)}, [tensor dicts]).
    Arrays are (\"array\", (elem vtype name, [values])); tensors have name, type (ggml
    name), shape (outermost first), offset (absolute, in the file) and nbytes."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(n):
        nonlocal pos
        if n > len(buf) - pos:
            raise ValueError("%s: truncated at offset %d" % (path, pos))
        pos += n
        return buf[pos - n:pos]

    def unpack(fmt):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string():
        return take(unpack("<Q")).decode("utf-8", errors="surrogateescape")

    def value(vt, depth=0):
        name = VTYPE_NAMES.get(vt)
        if name in _PACK:
            return unpack(_PACK[name])
        if name == "string":
            return string()
        if name == "array" and depth < 8:
            et, n = unpack("<I"), unpack("<Q")
            if n > len(buf) - pos:
                raise ValueError("%s: array count %d past the end" % (path, n))
            return (VTYPE_NAMES.get(et, et), [value(et, depth + 1) for _ in range(n)])
        raise ValueError("%s: bad value type %r at offset %d" % (path, vt, pos))

    if take(4) != b"GGUF":
        raise ValueError("%s: bad magic" % path)
    version = unpack("<I")
    if version not in (2, 3):
        raise ValueError("%s: GGUF version %d not supported" % (path, version))
    n_tensors, n_kv = unpack("<Q"), unpack("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        vt = unpack("<I")
        kv[key] = (VTYPE_NAMES.get(vt, vt), value(vt))
    align = kv.get("general.alignment", ("u32", ALIGNMENT))[1]
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = unpack("<I")
        ne = [unpack("<Q") for _ in range(nd)]
        t, off = unpack("<I"), unpack("<Q")
        infos.append((name, nd, ne, t, off))
    data_start = pos + (-pos) % align
    tensors = []
    for name, nd, ne, t, off in infos:
        shape = list(reversed(ne))
        nbytes = tensor_nbytes(t, shape) if t in BLOCK else None
        if nbytes is not None and data_start + off + nbytes > len(buf):
            raise ValueError("%s: tensor %s past the end of the file" % (path, name))
        tensors.append({"name": name, "type": GGML_NAMES.get(t, str(t)), "shape": shape,
                        "offset": data_start + off, "nbytes": nbytes})
    return version, kv, tensors


def tensor_bytes(path, tensor):
    """The raw bytes of a tensor dict returned by read()."""
    with open(path, "rb") as f:
        f.seek(tensor["offset"])
        return f.read(tensor["nbytes"])


def _fmt(vt, v):
    if vt == "array":
        et, vals = v
        head = ", ".join(repr(x) for x in vals[:4])
        return "array[%s] n=%d [%s%s]" % (et, len(vals), head, ", ..." if len(vals) > 4 else "")
    return "%s %s" % (vt, repr(v) if vt == "string" else v)


def dump(path):
    version, kv, tensors = read(path)
    print("GGUF v%d: %d kv, %d tensors" % (version, len(kv), len(tensors)))
    for k, (vt, v) in kv.items():
        print("%s %s" % (k, _fmt(vt, v)))
    for t in tensors:
        print("%s %s %s offset=%d nbytes=%s" % (t["name"], t["type"], t["shape"], t["offset"],
                                                t["nbytes"]))


def selftest_write(path):
    """The file tests/test_gguf.c checks: values and bytes it knows."""
    w = GGUFWriter()
    w.add("general.architecture", "string", "llama")
    w.add("llama.block_count", "u32", 2)
    w.add("llama.rope.freq_base", "f32", 10000.0)
    w.add("tokenizer.ggml.add_bos_token", "bool", True)
    w.add_array("tokenizer.ggml.tokens", "string", ["a", "b", "w\u00f6rld"])
    w.add_array("x.i64s", "i64", [-5, 7])
    w.add_tensor("w.f32", "F32", [2, 3], struct.pack("<6f", *range(6)))
    w.add_tensor("w.q8_0", "Q8_0", [2, 32], bytes(range(68)))
    w.add_tensor("w.f16", "F16", [3], struct.pack("<3e", 1.0, -2.0, 0.5))
    w.write(path)
    # and it reads back
    version, kv, tensors = read(path)
    assert version == 3 and kv["llama.block_count"] == ("u32", 2)
    assert kv["tokenizer.ggml.tokens"][1][1][2] == "w\u00f6rld"
    assert [t["shape"] for t in tensors] == [[2, 3], [2, 32], [3]]
    assert all(t["offset"] % ALIGNMENT == 0 for t in tensors)
    assert tensor_bytes(path, tensors[1]) == bytes(range(68))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "selftest-write":
        selftest_write(sys.argv[2])
    else:
        sys.exit(__doc__)
