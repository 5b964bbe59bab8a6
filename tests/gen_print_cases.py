#!/usr/bin/python3
"""gen_print_cases.py: writes tests/data/print_cases.inc, the table of
tensor repr cases test_interop.c checks kl_format against. Run with
Debian's torch:

    /usr/bin/python3 tests/gen_print_cases.py

The expected strings are torch 1.13's repr with "dtype=torch.X" written as
"dtype=X", Kiln's one deliberate difference (the suffix line-wrap decision
is made on the shortened text, as Kiln does).
"""
import math
import os

import torch
import torch._tensor_str as ts

_orig_add_suffixes = ts._add_suffixes


def _add_suffixes(tensor_str, suffixes, indent, force_newline):
    suffixes = [s.replace("dtype=torch.", "dtype=") for s in suffixes]
    return _orig_add_suffixes(tensor_str, suffixes, indent, force_newline)


ts._add_suffixes = _add_suffixes

DT = {
    "f32": (torch.float32, "KL_F32"), "f64": (torch.float64, "KL_F64"),
    "f16": (torch.float16, "KL_F16"), "bf16": (torch.bfloat16, "KL_BF16"),
    "i32": (torch.int32, "KL_I32"), "i64": (torch.int64, "KL_I64"),
    "u8": (torch.uint8, "KL_U8"), "bool": (torch.bool, "KL_BOOL"),
}
NAN, INF = math.nan, math.inf

# name, dtype, shape, values (list, or (a, b) for value i = a*i + b), view,
# print options (precision, threshold, edgeitems, linewidth) or None, default dtype
CASES = [
    ("matrix", "f32", [2, 2], [1, -2.5, 3, 4], "", None, "f32"),
    ("int_valued", "f32", [2], [1, 2], "", None, "f32"),
    ("scalar", "f32", [], [3.5], "", None, "f32"),
    ("scalar_i64", "i64", [], [3], "", None, "f32"),
    ("scalar_bool", "bool", [], [1], "", None, "f32"),
    ("scalar_f16", "f16", [], [-0.5], "", None, "f32"),
    ("scalar_nan", "f32", [], [NAN], "", None, "f32"),
    ("empty_0x3", "f32", [0, 3], [], "", None, "f32"),
    ("empty_1d", "f32", [0], [], "", None, "f32"),
    ("empty_1d_i64", "i64", [0], [], "", None, "f32"),
    ("empty_bool_2x0", "bool", [2, 0], [], "", None, "f32"),
    ("f64", "f64", [2], [1.5, 2.25], "", None, "f32"),
    ("i32", "i32", [3], [1, -20, 300], "", None, "f32"),
    ("i64", "i64", [5], (1, 0), "", None, "f32"),
    ("u8", "u8", [2], [0, 255], "", None, "f32"),
    ("bool", "bool", [3], [1, 0, 1], "", None, "f32"),
    ("bool_all_true", "bool", [2], [1, 1], "", None, "f32"),
    ("nonfinite", "f32", [4], [NAN, INF, -INF, 1.5], "", None, "f32"),
    ("nonfinite_int", "f32", [3], [NAN, 1, 2], "", None, "f32"),
    ("all_nan", "f32", [2], [NAN, NAN], "", None, "f32"),
    ("nan_int_pad", "f32", [2], [NAN, 100], "", None, "f32"),
    ("inexact", "f32", [2], [0.1, 0.2], "", None, "f32"),
    ("zeros", "f32", [2], [0, 0], "", None, "f32"),
    ("neg_zero", "f32", [2], [-0.0, 1.5], "", None, "f32"),
    ("neg_zero_int", "f32", [2], [-0.0, 0.0], "", None, "f32"),
    ("sci_small", "f32", [2], [1e-5, 1.0], "", None, "f32"),
    ("sci_big", "f64", [2], [1e9, 1.5], "", None, "f32"),
    ("sci_int_ratio", "f32", [2], [1, 2000], "", None, "f32"),
    ("sci_int_big", "f64", [2], [1e9, 2e9], "", None, "f32"),
    ("sci_nonfinite", "f64", [3], [1e10, NAN, -INF], "", None, "f32"),
    ("no_sci", "f32", [2], [0.125, 100.5], "", None, "f32"),
    ("int_mode_wide", "f32", [3], [100, -200, 999], "", None, "f32"),
    ("sci_neg", "f32", [3], [-1e-7, 2.5, -3e3], "", None, "f32"),
    ("i_neg", "i64", [3], [-1, 10, -100], "", None, "f32"),
    ("one_elem", "f32", [1], [5], "", None, "f32"),
    ("cube", "f32", [2, 3, 4], (1, 0), "", None, "f32"),
    ("cube_frac", "f32", [2, 2, 2], (0.5, -1.25), "", None, "f32"),
    ("rank4", "i32", [2, 1, 2, 2], (1, -3), "", None, "f32"),
    ("wrap_1d", "f32", [30], (1 / 3, 0), "", None, "f32"),
    ("wrap_2d", "f64", [3, 15], (0.1, -2), "", None, "f32"),
    ("wrap_i64", "i64", [40], (12345, -70000), "", None, "f32"),
    ("summ_1d", "i64", [2000], (1, 0), "", None, "f32"),
    ("summ_2d", "f32", [50, 40], (1 / 7, 0), "", None, "f32"),
    ("summ_3d", "f32", [7, 2, 7], (0.5, 0), "", (4, 50, 1, 80), "f32"),
    ("summ_hidden", "f32", [6], [1.5, 2, 1e10, 3, 4.25, 5], "", (4, 5, 2, 80), "f32"),
    ("summ_bool", "bool", [3, 5], [1, 0, 0, 1, 1] * 3, "", (4, 5, 2, 80), "f32"),
    ("summ_rows_only", "i32", [1001, 2], (1, 0), "", None, "f32"),
    ("transpose", "f32", [2, 3], [1, 2, 3, 4.5, 5, 6], "T", None, "f32"),
    ("expand", "i64", [1, 3], [7, -8, 9], "expand", None, "f32"),
    ("step", "f32", [2, 6], (1.5, 0), "step", None, "f32"),
    ("f16", "f16", [3], [0.5, 1.25, 65504], "", None, "f32"),
    ("bf16", "bf16", [2], [1.0, 3.140625], "", None, "f32"),
    ("bf16_int", "bf16", [2], [1.0, 256], "", None, "f32"),
    ("meta", "f32", [2, 3], [], "meta", None, "f32"),
    ("meta_i64", "i64", [4], [], "meta", None, "f32"),
    ("meta_scalar", "f64", [], [], "meta", None, "f32"),
    ("opts_precision", "f32", [3], [1.23456, 2.5, -0.001], "", (2, 1000, 3, 80), "f32"),
    ("opts_threshold", "i64", [10], (1, 0), "", (4, 5, 2, 80), "f32"),
    ("opts_linewidth", "f32", [12], (0.25, 0), "", (4, 1000, 3, 30), "f32"),
    ("opts_precision0", "f32", [2], [1.5, 2.25], "", (0, 1000, 3, 80), "f32"),
    ("opts_tiny_linewidth", "i32", [2, 3], (1, 0), "", (4, 1000, 3, 1), "f32"),
    ("suffix_wraps", "f64", [8], (1.125, 0), "", None, "f32"),
    ("suffix_wraps_2d", "i32", [2, 13], (111111, 0), "", None, "f32"),
    ("default_f64_f64", "f64", [2], [1.5, 2], "", None, "f64"),
    ("default_f64_f32", "f32", [2], [1.5, 2], "", None, "f64"),
    ("default_f64_empty_f32", "f32", [0], [], "", None, "f64"),
]


def values_of(spec, n):
    if isinstance(spec, tuple):
        a, b = spec
        return [a * i + b for i in range(n)]
    return list(spec)


def c_double(v):
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return repr(float(v))


def c_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", '\\n"\n    "') + '"'


def build(dtype, shape, vals, view):
    tdt = DT[dtype][0]
    if view == "meta":
        return torch.empty(shape, dtype=tdt, device="meta")
    n = math.prod(shape)
    t = torch.tensor(values_of(vals, n), dtype=torch.float64).reshape(shape).to(tdt)
    if view == "T":
        t = t.t()
    elif view == "expand":
        t = t.expand(3, shape[1])
    elif view == "step":
        t = t[..., ::2]
    return t


def main():
    out = []
    for name, dtype, shape, vals, view, opts, default in CASES:
        torch.set_default_dtype(DT[default][0])
        if opts:
            p, th, e, lw = opts
            torch.set_printoptions(precision=p, threshold=th, edgeitems=e, linewidth=lw)
        s = repr(build(dtype, shape, vals, view))
        torch.set_printoptions(profile="default")
        torch.set_default_dtype(torch.float32)
        if isinstance(vals, tuple):
            vdesc = "0, NULL, %s, %s" % (c_double(vals[0]), c_double(vals[1]))
        else:
            vdesc = "%d, (const double[]){%s}, 0, 0" % (len(vals), ", ".join(c_double(v) for v in vals) or "0")
        o = "{%d, %d, %d, %d}" % opts if opts else "{-1, -1, -1, -1}"
        out.append("{\"%s\", %s, %d, {%s}, %s, PV_%s, %s, %s,\n    %s},\n"
                   % (name, DT[dtype][1], len(shape), ", ".join(map(str, shape)) or "0", vdesc,
                 view.upper() or "NONE", o, DT[default][1], c_string(s)))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "print_cases.inc")
    with open(path, "w") as f:
        f.write("/* Generated by tests/gen_print_cases.py: name, dtype, ndim, shape, values, view,\n"
                " * print options, default dtype, torch's repr. */\n")
        f.write("".join(out))


if __name__ == "__main__":
    main()
