#!/usr/bin/python3
"""gen_safetensors.py: writes the small .safetensors files test_optim.c
loads, with torch 1.13 values, and tests/data/safetensors/expected.inc (the
values, for the C side to compare).

    /usr/bin/python3 tests/gen_safetensors.py             # rewrites tests/data/safetensors/
    /usr/bin/python3 tests/gen_safetensors.py --check F   # reads a Kiln-written file F
                                                           # with the reader below and prints it

Debian's python3 has no `safetensors` package, so this file carries a small
writer and reader written from the format's specification and the reference
implementation's serialize(): tensors sorted by dtype (descending, in the
reference's enum order) then by name, compact JSON with "__metadata__" first,
header padded with spaces to a multiple of 8. Tensor bytes come from torch
(each dtype viewed as a same-width integer and packed little-endian).
"""
import json
import os
import struct
import sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "safetensors")

# The reference implementation's Dtype enum order (its writer sorts by it).
ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
         "I64", "U64"]
ST = {torch.bool: "BOOL", torch.uint8: "U8", torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
      torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
FROM_ST = {v: k for k, v in ST.items()}
# Same-width integer view and struct code for each dtype's raw bytes.
RAW = {torch.bool: (torch.uint8, "B"), torch.uint8: (torch.uint8, "B"), torch.float16: (torch.int16, "h"),
       torch.bfloat16: (torch.int16, "h"), torch.int32: (torch.int32, "i"), torch.float32: (torch.int32, "i"),
       torch.float64: (torch.int64, "q"), torch.int64: (torch.int64, "q")}
KL = {torch.bool: "KL_BOOL", torch.uint8: "KL_U8", torch.float16: "KL_F16", torch.bfloat16: "KL_BF16",
      torch.int32: "KL_I32", torch.float32: "KL_F32", torch.float64: "KL_F64", torch.int64: "KL_I64"}


def tensor_bytes(t):
    t = t.contiguous().reshape(-1)
    as_int, code = RAW[t.dtype]
    vals = (t.to(torch.uint8) if t.dtype == torch.bool else t.view(as_int)).tolist()
    return struct.pack("<%d%s" % (len(vals), code), *vals)


def header_json(meta, entries):
    """entries: (name, dtype, shape, begin, end) in header order."""
    h = {}
    if meta is not None:
        h["__metadata__"] = meta
    for name, dt, shape, b, e in entries:
        h[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [b, e]}
    s = json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return s + b" " * ((8 - len(s) % 8) % 8)


def save(path, tensors, meta=None, layout="reference"):
    """layout "reference": as the reference writer; "reversed": data in reverse
    reference order and header keys shuffled (older writers; still valid)."""
    items = sorted(tensors.items(), key=lambda kv: (-ORDER.index(ST[kv[1].dtype]), kv[0]))
    if layout == "reversed":
        items = items[::-1]
    entries, blobs, off = [], [], 0
    for name, t in items:
        b = tensor_bytes(t)
        entries.append((name, ST[t.dtype], tuple(t.shape), off, off + len(b)))
        blobs.append(b)
        off += len(b)
    if layout == "reversed":
        entries = sorted(entries, key=lambda e: e[0])
    hdr = header_json(meta, entries)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + b"".join(blobs))


def load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    meta = hdr.pop("__metadata__", None)
    buf = data[8 + n:]
    out = {}
    for name, info in hdr.items():
        dt = FROM_ST[info["dtype"]]
        b, e = info["data_offsets"]
        as_int, code = RAW[dt]
        count = (e - b) // struct.calcsize(code)
        vals = list(struct.unpack("<%d%s" % (count, code), buf[b:e]))
        t = torch.tensor(vals, dtype=as_int)
        t = t.to(torch.bool) if dt == torch.bool else t.view(dt)
        out[name] = t.reshape(info["shape"])
    return meta, out


def mixed():
    g = torch.Generator().manual_seed(0)
    return {
        "w.f32": torch.randn(2, 3, generator=g),
        "w.f64": torch.randn(4, generator=g, dtype=torch.float64),
        "h.f16": torch.randn(3, 2, generator=g).to(torch.float16),
        "h.bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "i.i32": torch.tensor([[-7, 2147483647], [-2147483648, 12]], dtype=torch.int32),
        "i.i64": torch.tensor([2 ** 40 + 3, -5, 0], dtype=torch.int64),
        "u.u8": torch.tensor([0, 1, 200, 255], dtype=torch.uint8),
        "b.bool": torch.tensor([[True, False, True], [False, False, True]]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        'odd "name"\\\u00fc\t': torch.tensor([-0.0]),
    }


def c_str(s):
    out = ""
    for ch in s.encode("utf-8"):
        c = chr(ch)
        if c in '"\\':
            out += "\\" + c
        elif 0x20 <= ch < 0x7f:
            out += c
        else:
            out += "\\%03o" % ch
    return '"' + out + '"'


def c_vals(t):
    v = t.double().reshape(-1).tolist() if t.dtype != torch.int64 else t.reshape(-1).tolist()
    if not v:
        return "{0}"
    return "{" + ", ".join(("%d" % x) if t.dtype == torch.int64 else repr(x) for x in v) + "}"


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        meta, ts = load(sys.argv[2])
        print("metadata:", meta)
        for k, v in ts.items():
            print(repr(k), v.dtype, tuple(v.shape), v.reshape(-1).tolist())
        return
    os.makedirs(OUT, exist_ok=True)
    ts = mixed()
    save(os.path.join(OUT, "torch_mixed.safetensors"), ts, meta={"format": "pt"})
    save(os.path.join(OUT, "torch_unordered.safetensors"), ts, meta=None, layout="reversed")
    # A round trip through the reader above, so writer and reader agree.
    meta, back = load(os.path.join(OUT, "torch_mixed.safetensors"))
    assert meta == {"format": "pt"} and all(torch.equal(back[k], ts[k]) for k in ts)

    torch.manual_seed(0)
    fc = torch.nn.Linear(4, 3)
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    y = fc(x).detach()
    save(os.path.join(OUT, "torch_linear.safetensors"), {"fc." + k: v for k, v in fc.state_dict().items()})

    lines = ["/* Generated by tests/gen_safetensors.py from torch %s: do not edit. */" % torch.__version__,
             "/* name, dtype, ndim, shape, numel, values (int64 values exact in st_i64) */"]
    lines.append("static const kt_st_expect kt_st_mixed[] = {")
    for name, t in sorted(ts.items()):
        shape = list(t.shape)
        lines.append("    {%s, %s, %d, {%s}, %d, (const double[])%s, (const int64_t[])%s}," % (
            c_str(name), KL[t.dtype], len(shape), ", ".join(map(str, shape)) or "0", t.numel(),
            c_vals(t) if t.dtype != torch.int64 else "{0}",
            c_vals(t) if t.dtype == torch.int64 else "{0}"))
    lines.append("};")
    lines.append("static const double kt_st_linear_x[] = %s;" % c_vals(x))
    lines.append("static const double kt_st_linear_y[] = %s;" % c_vals(y))
    with open(os.path.join(OUT, "expected.inc"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
