#!/usr/bin/env python3
"""check_errors.py — docs/errors.md stays true to the header and the tests.

    check_errors.py ROOT          check ROOT/include/kiln.h, ROOT/docs/errors.md, ROOT/tests
    check_errors.py --self-test   prove each rule fails on a broken fake tree

Rules:
 1. every code of KL_STATUS_MAP in kiln.h has a "## KL_ERR_<NAME> (<value>)"
    section in errors.md with the header's value, and no section names a code
    the header lacks;
 2. each section has an "Example:" with a message in backticks, a "Cause:" and
    a "What to do:" paragraph;
 3. every code but OK is produced by some test: a KT_EXPECT_ERROR(KL_ERR_<NAME>,
    "needle") in a tests/*.c file that tests/meson.build builds, and the
    section's example contains one such needle, so the example is a message a
    test really sees (KT_EXPECT_ERROR fails the test unless the status is the
    code and the message contains the needle).
"""
import os
import re
import sys
import tempfile

MAP_ENTRY = re.compile(r"X\(\s*([A-Z_]+)\s*,\s*(-?\d+)\s*,")
SECTION = re.compile(r"^## KL_ERR_([A-Z_]+) \((-?\d+)\)\s*$", re.M)
EXPECT = re.compile(r'KT_EXPECT_ERROR\(\s*KL_ERR_([A-Z_]+)\s*,\s*"((?:[^"\\]|\\.)*)"\s*\)')


def header_codes(text):
    start = text.find("#define KL_STATUS_MAP(X)")
    if start < 0:
        return None
    end = text.find("\n\n", start)
    return {name: int(val) for name, val in MAP_ENTRY.findall(text[start:end])}


def built_test_sources(tests_dir):
    """The .c files tests/meson.build names (a file no test builds proves nothing)."""
    with open(os.path.join(tests_dir, "meson.build")) as f:
        build = f.read()
    return sorted(set(re.findall(r"'([A-Za-z0-9_]+\.c)'", build)))


def c_unescape(s):
    return re.sub(r'\\(["\\])', r"\1", s)


def check(root):
    errors = []
    with open(os.path.join(root, "include", "kiln.h")) as f:
        codes = header_codes(f.read())
    if not codes:
        return ["include/kiln.h: no KL_STATUS_MAP entries found"]
    with open(os.path.join(root, "docs", "errors.md")) as f:
        doc = f.read()
    heads = list(SECTION.finditer(doc))
    sections = {}
    for i, m in enumerate(heads):
        body = doc[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(doc)]
        if m.group(1) in sections:
            errors.append(f"docs/errors.md: KL_ERR_{m.group(1)} has two sections")
        sections[m.group(1)] = (int(m.group(2)), body)
    for name in sections:
        if name not in codes:
            errors.append(f"docs/errors.md: KL_ERR_{name} is not a code of KL_STATUS_MAP")

    tests_dir = os.path.join(root, "tests")
    needles = {}
    for src in built_test_sources(tests_dir):
        path = os.path.join(tests_dir, src)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for name, needle in EXPECT.findall(f.read()):
                needles.setdefault(name, set()).add(c_unescape(needle))

    for name, value in codes.items():
        if name not in sections:
            errors.append(f"docs/errors.md: no section for KL_ERR_{name}")
            continue
        doc_value, body = sections[name]
        if doc_value != value:
            errors.append(f"docs/errors.md: KL_ERR_{name} is {value} in kiln.h, {doc_value} in the doc")
        ex = re.search(r"^Example: `(.*)`", body, re.M)
        for part in ("Cause:", "What to do:"):
            if not re.search(r"^" + re.escape(part) + r" \S", body, re.M):
                errors.append(f"docs/errors.md: KL_ERR_{name} has no '{part}' paragraph")
        if not ex:
            errors.append(f"docs/errors.md: KL_ERR_{name} has no 'Example: `message`' line")
            continue
        if name == "OK":
            continue
        found = needles.get(name, set())
        if not found:
            errors.append(f"KL_ERR_{name}: no test asserts it (no KT_EXPECT_ERROR(KL_ERR_{name}, \"...\") "
                          "in a file tests/meson.build builds)")
        elif not any(n and n in ex.group(1) for n in found):
            errors.append(f"docs/errors.md: the example of KL_ERR_{name} contains none of the messages the "
                          f"tests expect for it (e.g. {sorted(found)[:3]})")
    return errors


GOOD_HEADER = """#define KL_STATUS_MAP(X) \\
    X(OK, 0, "no error") \\
    X(SHAPE, -2, "bad shapes") \\
    X(OOM, -7, "out of memory")

"""
GOOD_DOC = """# Errors
## KL_ERR_OK (0)
Example: ``
Cause: none.
What to do: nothing.
## KL_ERR_SHAPE (-2)
Example: `kl_add: shapes [2] and [3] cannot broadcast`
Cause: shapes.
What to do: fix them.
## KL_ERR_OOM (-7)
Example: `kl_exp: out of memory allocating 32 bytes on cpu`
Cause: memory.
What to do: free some.
"""
GOOD_TEST = """KT_EXPECT_ERROR(KL_ERR_SHAPE, "cannot broadcast");
KT_EXPECT_ERROR(KL_ERR_OOM, "kl_exp: out of memory");
"""
GOOD_MESON = "suite_tests = {'a': ['eager', ['test_a.c']]}\n"


def fake_tree(header=GOOD_HEADER, doc=GOOD_DOC, test=GOOD_TEST, meson=GOOD_MESON):
    root = tempfile.mkdtemp(prefix="check_errors_")
    for rel, text in (("include/kiln.h", header), ("docs/errors.md", doc), ("tests/test_a.c", test),
                      ("tests/meson.build", meson)):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    return root


def self_test():
    cases = {
        "good tree": ({}, None),
        "a code without a section": ({"header": GOOD_HEADER.replace(
            'X(OOM, -7, "out of memory")', 'X(OOM, -7, "out of memory") \\\n    X(IO, -10, "io")')},
            "no section for KL_ERR_IO"),
        "a section for an unknown code": ({"doc": GOOD_DOC + "## KL_ERR_BOGUS (-99)\nExample: `x`\n"},
                                          "KL_ERR_BOGUS is not a code"),
        "a wrong value": ({"doc": GOOD_DOC.replace("KL_ERR_OOM (-7)", "KL_ERR_OOM (-8)")}, "is -7 in kiln.h"),
        "no example": ({"doc": GOOD_DOC.replace("Example: `kl_exp", "Exemple: `kl_exp")},
                       "KL_ERR_OOM has no 'Example"),
        "no cause": ({"doc": GOOD_DOC.replace("Cause: shapes.", "")}, "KL_ERR_SHAPE has no 'Cause:'"),
        "no remedy": ({"doc": GOOD_DOC.replace("What to do: free some.", "")}, "no 'What to do:'"),
        "a code no test asserts": ({"test": GOOD_TEST.replace("KL_ERR_OOM", "KL_ERR_SHAPE")},
                                   "KL_ERR_OOM: no test asserts it"),
        "a test file no test builds": ({"meson": "suite_tests = {}\n"}, "KL_ERR_SHAPE: no test asserts it"),
        "an example no test sees": ({"doc": GOOD_DOC.replace("cannot broadcast", "do not match")},
                                    "the example of KL_ERR_SHAPE contains none"),
    }
    bad = 0
    for what, (kw, expect) in cases.items():
        errs = check(fake_tree(**kw))
        ok = (not errs) if expect is None else any(expect in e for e in errs)
        if not ok:
            bad += 1
            print(f"self-test FAILED: {what}: expected {expect!r}, got {errs}")
    if bad:
        return 1
    print(f"check_errors self-test: {len(cases)} cases behave")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    errors = check(argv[1])
    for e in errors:
        print(e)
    if errors:
        return 1
    print("docs/errors.md: every status code documented, each produced by a test")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
