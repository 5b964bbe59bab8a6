#!/usr/bin/env python3
"""make_seeds.py — (re)writes the seed corpora of the libFuzzer targets.

    python3 tests/fuzz/make_seeds.py

Deterministic (fixed random seeds), so the committed files are reproducible.
Seeds are starting points; crash inputs that became regression tests are
committed beside them as crash-*/slow-* files (docs/HARDENING.md), never
rewritten by this script.
"""
import os
import random
import shutil
import struct
import json

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")


def out(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def ops():
    rng = random.Random(17)
    for i in range(48):
        # first byte: bit 0 asks for the compiled comparison
        n = rng.choice([40, 90, 160, 320])
        body = bytes(rng.randrange(0, 160) if rng.random() < 0.8 else rng.randrange(256) for _ in range(n))
        out("ops", f"seed-{i:02d}", bytes([i & 1]) + body)


def npy():
    src = os.path.join(DATA, "npy")
    for name in sorted(os.listdir(src))[:12]:
        with open(os.path.join(src, name), "rb") as f:
            out("npy", name, f.read())


def safetensors_file(tensors, meta=None):
    header, blobs, off = {}, [], 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def safetensors():
    src = os.path.join(DATA, "safetensors")
    for name in sorted(n for n in os.listdir(src) if n.endswith(".safetensors")):
        with open(os.path.join(src, name), "rb") as f:
            out("safetensors", name, f.read())
    out("safetensors", "seed-f32", safetensors_file([("w", "F32", [2, 3], struct.pack("<6f", *range(6)))],
                                                    {"format": "pt"}))
    out("safetensors", "seed-mixed", safetensors_file([
        ("a", "F64", [2], struct.pack("<2d", 1.5, -2)), ("b", "I32", [3], struct.pack("<3i", 1, 2, 3)),
        ("c", "BOOL", [2], b"\x00\x01"), ("d", "F16", [1], b"\x00\x3c"), ("e", "BF16", [0], b""),
        ("f", "U8", [], b"\x07"), ("g", "I64", [1, 1], struct.pack("<q", -5))]))
    out("safetensors", "seed-empty", safetensors_file([]))


def dlpack():
    rng = random.Random(23)
    # device CPU, ndim, dtype code, bits index (0:8 1:16 2:32 3:64), lanes 1, shapes, strides flag, ...
    out("dlpack", "seed-f32-2x3", bytes([0, 0, 2, 2, 2, 0, 2, 3] + [0] * 14 + [0] + [3, 1] + [0] * 14 + [0, 0, 1]))
    out("dlpack", "seed-i64-strided", bytes([0, 0, 2, 0, 3, 0, 4, 2] + [0] * 14 + [1] + [2, 4] + [0] * 14 + [0, 8, 1]))
    for i in range(16):
        out("dlpack", f"seed-{i:02d}", bytes(rng.randrange(256) for _ in range(rng.choice([24, 48, 80]))))


def kcache():
    rng = random.Random(29)
    out("kcache", "seed-intact", b"\x01" + bytes(range(64)))
    out("kcache", "seed-empty-payload", b"\x01")
    for i in range(8):
        body = bytes(rng.randrange(256) for _ in range(rng.choice([16, 64, 200])))
        out("kcache", f"seed-{i:02d}", bytes([i & 1]) + body)
    out("kcache", "seed-raw-magic", b"\x00KILNOBJC" + b"\x01\x00\x00\x00" + b"\x00" * 100)


if __name__ == "__main__":
    ops()
    npy()
    safetensors()
    dlpack()
    kcache()
