#!/usr/bin/env python3
"""Every public header compiles on its own, included first, as strict C99 and
as C++: a user may include any one of them (kiln/compile.h before kiln.h, say),
so none may lean on a type that only a later header defines.

    check_headers.py INCLUDE_DIR GENERATED_INCLUDE_DIR -- CC... [-- CXX...]
    check_headers.py --self-test -- CC...
"""
import os
import subprocess
import sys
import tempfile

HEADERS = ["kiln.h", "kiln/nn.h", "kiln/cuda.h", "kiln/compile.h", "kiln/profiler.h", "kiln/bench.h"]


def compile_alone(cmd, lang, std, dirs, header):
    src = '#include "%s"\nint kt_header_alone;\n' % header
    args = cmd + ["-x", lang, "-std=" + std, "-pedantic-errors", "-Wall", "-Werror", "-fsyntax-only"]
    args += ["-I" + d for d in dirs] + ["-"]
    r = subprocess.run(args, input=src, text=True, capture_output=True)
    return r.returncode, r.stderr


def split_commands(argv):
    parts, cur = [], []
    for a in argv:
        if a == "--":
            parts.append(cur)
            cur = []
        else:
            cur.append(a)
    parts.append(cur)
    return parts


def self_test(cc):
    """The check must fail on a header that uses a type it never declares."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "bad.h"), "w") as f:
            f.write("int bad(kl_undeclared *x);\n")
        with open(os.path.join(d, "good.h"), "w") as f:
            f.write("typedef struct kl_x kl_x;\nint good(kl_x *x);\n")
        bad, _ = compile_alone(cc, "c", "c99", [d], "bad.h")
        good, err = compile_alone(cc, "c", "c99", [d], "good.h")
    if bad == 0 or good != 0:
        print("self-test failed: bad.h rc %d, good.h rc %d %s" % (bad, good, err))
        return 1
    print("self-test: the check fails on an undeclared type and passes a sound header")
    return 0


def main():
    parts = split_commands(sys.argv[1:])
    if parts[0] == ["--self-test"]:
        return self_test(parts[1])
    dirs, cc = parts[0], parts[1]
    cxx = parts[2] if len(parts) > 2 else []
    failed = 0
    for h in HEADERS:
        for cmd, lang, std in ((cc, "c", "c99"), (cxx, "c++", "c++17")):
            if not cmd:
                continue
            rc, err = compile_alone(cmd, lang, std, dirs, h)
            if rc:
                failed += 1
                print("%s alone as %s (%s): failed\n%s" % (h, lang, std, err))
            else:
                print("%s alone as %s: ok" % (h, lang))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
