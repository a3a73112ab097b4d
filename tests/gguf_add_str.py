#!/usr/bin/env python3
"""gguf_add_str.py IN OUT KEY FILE: copy a GGUF v2/v3 file with one more string metadata
pair, KEY = FILE's contents (tests/cli_hostile.sh: a chat template in a GGUF). Standard
library only; tensor data keeps its 32-byte alignment (the file must not set
general.alignment)."""
import struct
import sys

SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    src, dst, key, path = sys.argv[1:5]
    b = open(src, 'rb').read()

    def skip(o, t):
        if t == 8:
            return o + 8 + struct.unpack_from('<Q', b, o)[0]
        if t == 9:
            et, n = struct.unpack_from('<IQ', b, o)
            o += 12
            for _ in range(n):
                o = skip(o, et)
            return o
        return o + SIZE[t]

    n_t, n_kv = struct.unpack_from('<QQ', b, 8)
    o = 24
    for _ in range(n_kv):
        o += 8 + struct.unpack_from('<Q', b, o)[0]
        t = struct.unpack_from('<I', b, o)[0]
        o = skip(o + 4, t)
    for _ in range(n_t):
        o += 8 + struct.unpack_from('<Q', b, o)[0]
        nd = struct.unpack_from('<I', b, o)[0]
        o += 4 + 8 * nd + 4 + 8
    data = (o + 31) // 32 * 32
    k, v = key.encode(), open(path, 'rb').read()
    kv = struct.pack('<Q', len(k)) + k + struct.pack('<IQ', 8, len(v)) + v
    head = b[:16] + struct.pack('<Q', n_kv + 1) + kv + b[24:o]
    head += b'\0' * ((-len(head)) % 32)
    open(dst, 'wb').write(head + b[data:])


main()
