#!/usr/bin/env python3
"""check_layers.py — layers only include downward.

Reads every `#include "..."` in src/**/*.{c,h,cpp,def} and fails on an edge
the architecture (docs/ARCHITECTURE.md) does not allow:

    eager <- autograd <- ir <- trace / codegen_llvm / codegen_nvrtc
    nn on eager + autograd
    bench on eager (its error record); everything else through include/
    src/init.c (the composition root) may include everything

An include resolves like the compiler's quoted include: the including file's
folder first, then include/ (the public header: always allowed), then the
layer folders (a name found in several is an error: the path would decide).
A name found nowhere is external (LLVM, system) and not checked. Each layer's
meson.build must declare `<layer>_may_include = [...]` (its include path) within
the same rule, so the build and this check cannot drift apart.

Usage: check_layers.py ROOT      check the tree at ROOT (exit 1 on any violation)
       check_layers.py --self-test   prove the check fails on bad fake trees
"""
import os
import re
import sys
import tempfile

# The rule: which layers each layer may include besides itself and include/.
ALLOWED = {
    'eager': set(),
    'autograd': {'eager'},
    'nn': {'eager', 'autograd'},
    'ir': {'eager', 'autograd'},
    'trace': {'eager', 'autograd', 'ir'},
    'codegen_llvm': {'eager', 'autograd', 'ir'},
    'codegen_nvrtc': {'eager', 'ir'},
    # kl_bench and the standard workloads: every layer through the public
    # header only, eager's error record (core.h) included
    'bench': {'eager'},
}
ROOT_FILES = {'init.c'}  # files directly in src/ that may include every layer
SUFFIXES = ('.c', '.h', '.cpp', '.def')
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
DECL_RE = re.compile(r'^\s*(\w+)_may_include\s*=\s*\[([^\]]*)\]', re.M)


def _layer_of(src, path):
    """The layer folder of path (under src), '' for a file directly in src/."""
    rel = os.path.relpath(path, src)
    parts = rel.split(os.sep)
    return parts[0] if len(parts) > 1 else ''


def _resolve(root, src, includer, name):
    """(kind, value): ('public', None), ('file', path), ('ambiguous', paths) or ('external', None)."""
    local = os.path.normpath(os.path.join(os.path.dirname(includer), name))
    if os.path.isfile(local):
        return 'file', local
    if os.path.isfile(os.path.join(root, 'include', name)):
        return 'public', None
    found = [os.path.join(src, l, name) for l in sorted(os.listdir(src))
             if os.path.isdir(os.path.join(src, l)) and os.path.isfile(os.path.join(src, l, name))]
    if len(found) > 1:
        return 'ambiguous', found
    if found:
        return 'file', found[0]
    return 'external', None


def check(root):
    """Every violation in the tree at root, as 'file:line: message' strings."""
    src = os.path.join(root, 'src')
    bad = []
    for d in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, d)) and d not in ALLOWED:
            bad.append(f'src/{d}: not a known layer: add it to ALLOWED in tests/check_layers.py '
                       f'and to docs/ARCHITECTURE.md')
    for dirpath, _, files in sorted(os.walk(src)):
        for fn in sorted(files):
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root)
            if fn == 'meson.build':
                bad += _check_meson(src, path, rel)
                continue
            if not fn.endswith(SUFFIXES):
                continue
            layer = _layer_of(src, path)
            if layer == '' and fn not in ROOT_FILES:
                bad.append(f'{rel}: a source file in src/ outside every layer (only {sorted(ROOT_FILES)} may be)')
                continue
            with open(path, encoding='utf-8', errors='replace') as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE_RE.match(line)
                    if m:
                        msg = _check_edge(root, src, path, layer, m.group(1))
                        if msg:
                            bad.append(f'{rel}:{lineno}: {msg}')
    return bad


def _check_edge(root, src, path, layer, name):
    kind, value = _resolve(root, src, path, name)
    if kind in ('public', 'external'):
        return None
    if kind == 'ambiguous':
        where = ', '.join(os.path.relpath(p, root) for p in value)
        return f'"{name}" is ambiguous: found in {where}'
    target = _layer_of(src, value)
    if os.path.relpath(value, root).split(os.sep)[0] != 'src':
        return f'"{name}" resolves outside src/ ({os.path.relpath(value, root)})'
    if layer == '':  # the composition root
        return None
    if target == layer or target in ALLOWED.get(layer, set()):
        return None
    target_name = target or 'the composition root (src/)'
    allowed = ', '.join(sorted(ALLOWED.get(layer, set()))) or 'nothing but itself'
    return (f'forbidden edge {layer} -> {target_name}: includes "{name}" '
            f'({os.path.relpath(value, os.path.dirname(src))}); {layer} may include {allowed}')


def _check_meson(src, path, rel):
    layer = _layer_of(src, path)
    if layer == '':
        return []
    with open(path, encoding='utf-8') as f:
        text = f.read()
    decl = [m for m in DECL_RE.finditer(text) if m.group(1) == layer]
    if not decl:
        return [f'{rel}: declares no {layer}_may_include (the layers its include path names)']
    out = []
    for m in decl:
        lineno = text.count('\n', 0, m.start()) + 1
        for dep in re.findall(r"'([^']*)'", m.group(2)):
            if dep not in ALLOWED.get(layer, set()):
                out.append(f'{rel}:{lineno}: {layer}_may_include names {dep}: forbidden edge {layer} -> {dep}')
    return out


# ---- self-test: the check must fail on bad trees ----------------------------------------

def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)


def _fake_tree(root, extra):
    files = {
        'include/kiln.h': '',
        'src/eager/core.h': '#include "kiln.h"\n',
        'src/eager/core.c': '#include "core.h"\n#include <stdlib.h>\n',
        'src/eager/meson.build': 'eager_may_include = []\n',
        'src/autograd/autograd.h': '#include "core.h"\n',
        'src/autograd/meson.build': "autograd_may_include = ['eager']\n",
        'src/ir/ir.h': '#include "autograd.h"\n#include "core.h"\n',
        'src/ir/meson.build': "ir_may_include = ['eager', 'autograd']\n",
        'src/trace/trace.h': '#include "ir.h"\n',
        'src/trace/meson.build': "trace_may_include = ['eager', 'autograd', 'ir']\n",
        'src/codegen_llvm/cg.h': '#include "ir.h"\n#include "llvm/IR/Module.h"\n',
        'src/codegen_llvm/meson.build': "codegen_llvm_may_include = ['eager', 'autograd', 'ir']\n",
        'src/nn/nn.c': '#include "autograd.h"\n',
        'src/nn/meson.build': "nn_may_include = ['eager', 'autograd']\n",
        'src/init.c': '#include "trace.h"\n#include "cg.h"\n#include "nn.c"\n',
    }
    files.update(extra)
    for rel, text in files.items():
        _write(root, rel, text)


def self_test():
    cases = [
        ({}, []),  # the clean tree passes
        ({'src/eager/core.c': '#include "core.h"\n\n#include "trace.h"\n'},
         ['src/eager/core.c:3: forbidden edge eager -> trace: includes "trace.h" (src/trace/trace.h); '
          'eager may include nothing but itself']),
        ({'src/ir/lower.c': '#include "ir.h"\n#include "../trace/trace.h"\n'},
         ['src/ir/lower.c:2: forbidden edge ir -> trace: includes "../trace/trace.h" (src/trace/trace.h); '
          'ir may include autograd, eager']),
        ({'src/codegen_llvm/cg.c': '#include "cg.h"\n#include "trace.h"\n'},  # sideways
         ['src/codegen_llvm/cg.c:2: forbidden edge codegen_llvm -> trace: includes "trace.h" (src/trace/trace.h); '
          'codegen_llvm may include autograd, eager, ir']),
        ({'src/nn/optim.c': '  #  include "ir.h"\n'},
         ['src/nn/optim.c:1: forbidden edge nn -> ir: includes "ir.h" (src/ir/ir.h); nn may include autograd, eager']),
        ({'src/autograd/meson.build': "autograd_may_include = ['eager', 'trace']\n"},
         ['src/autograd/meson.build:1: autograd_may_include names trace: forbidden edge autograd -> trace']),
        ({'src/ir/meson.build': "# nothing declared\n"},
         ['src/ir/meson.build: declares no ir_may_include (the layers its include path names)']),
        ({'src/gpu/k.c': ''}, ['src/gpu: not a known layer: add it to ALLOWED in tests/check_layers.py '
                               'and to docs/ARCHITECTURE.md']),
        ({'src/glue.c': '#include "trace.h"\n'},
         ["src/glue.c: a source file in src/ outside every layer (only ['init.c'] may be)"]),
        ({'src/trace/ir.h': '', 'src/eager/x.c': '#include "ir.h"\n'},
         ['src/codegen_llvm/cg.h:1: "ir.h" is ambiguous: found in src/ir/ir.h, src/trace/ir.h',
          'src/eager/x.c:1: "ir.h" is ambiguous: found in src/ir/ir.h, src/trace/ir.h']),
    ]
    failed = 0
    for extra, want in cases:
        with tempfile.TemporaryDirectory() as root:
            _fake_tree(root, extra)
            got = check(root)
        if got != want:
            failed += 1
            print(f'self-test: with {sorted(extra)}\n  want {want}\n  got  {got}', file=sys.stderr)
    print(f'check_layers self-test: {len(cases) - failed}/{len(cases)} cases as expected')
    return 1 if failed else 0


def main(argv):
    if len(argv) == 2 and argv[1] == '--self-test':
        return self_test()
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    bad = check(argv[1])
    for b in bad:
        print(b, file=sys.stderr)
    print(f'check_layers: {len(bad)} violation(s)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
