#!/usr/bin/env python3
"""Repro bundles replay against the installed library (src/trace/repro.c).

    check_repro_replay.py MESON BUILD_DIR TEST_REPRO [SANITIZE]

Runs test_repro with KT_REPRO_DIR set so its bundles are kept (one folder per
test), installs the build into a scratch prefix (meson install --destdir),
builds each bundle's replay.c with `cc replay.c $(pkg-config --cflags --libs
kiln)` against it and checks the exit codes: 1 (reproduced) with the test-only
switch that broke the compile on, 0 without it. Every node replays: those without
a typed public form (reductions, views, matmul, creation, several outputs, ...)
through kl_op_call with the node's attribute text.
"""
import glob
import os
import shlex
import subprocess
import sys
import tempfile


# test_repro's bundles (one folder each): the switch that breaks the compile, its value and
# what replay prints when it reproduces.
CASES = {
    "mismatch": ("KL_TEST_BREAK_LOWERING", "gelu", "reproduced: the compiled subgraph differs from eager"),
    "fail": ("KL_TEST_FAIL_LOWERING", "gelu", "reproduced: the compiled call failed"),
    # nodes without a typed public form, called by name: a reduction; masked_fill; the whole
    # graph of a matmul, views, full, where with a wrapped scalar, max_dim, mean, sum, to_dtype,
    # clone and an in-place relu (KL_TEST_REPRO_NO_MINIFY)
    "rowsum": ("KL_TEST_BREAK_LOWERING", "gelu", "reproduced: the compiled subgraph differs from eager"),
    "masked": ("KL_TEST_BREAK_LOWERING", "gelu", "reproduced: the compiled subgraph differs from eager"),
    "whole": ("KL_TEST_BREAK_LOWERING", "gelu", "reproduced: the compiled subgraph differs from eager"),
    "aot_bw": ("KL_TEST_BREAK_LOWERING", "cos", "reproduced: the compiled subgraph differs from eager"),
    "aot_fw": ("KL_TEST_BREAK_LOWERING", "sin", "reproduced: the compiled subgraph differs from eager"),
    "aot_fail": ("KL_TEST_FAIL_LOWERING", "cos", "reproduced: the compiled call failed"),
}


def run(cmd, env=None, cwd=None):
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    meson, build, test_repro = sys.argv[1:4]
    # a sanitized library (b_sanitize) needs the same runtime in the program
    # that links it, as a user building against such a build would do
    sanitize = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "none" else None
    with tempfile.TemporaryDirectory(prefix="kiln_repro_check_") as tmp:
        env = dict(os.environ, KT_REPRO_DIR=os.path.join(tmp, "out"), KL_CACHE_DIR=os.path.join(tmp, "cache"))
        rc, out = run([test_repro], env=env)
        if rc != 0:
            sys.exit(f"test_repro failed ({rc}):\n{out}")
        bundles = {}
        for case in CASES:
            found = glob.glob(os.path.join(tmp, "out", case, "kiln_repro_*"))
            if len(found) != 1:
                sys.exit(f"{case}: expected one bundle, found {found}")
            bundles[case] = found[0]
        dest = os.path.join(tmp, "inst")
        rc, out = run([meson, "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"])
        if rc != 0:
            sys.exit(f"meson install failed ({rc}):\n{out}")
        pcs = glob.glob(os.path.join(dest, "**", "pkgconfig", "kiln.pc"), recursive=True)
        if not pcs:
            sys.exit("no kiln.pc installed")
        penv = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]), PKG_CONFIG_SYSROOT_DIR=dest)
        rc, flags = run(["pkg-config", "--cflags", "--libs", "kiln"], env=penv)
        if rc != 0:
            sys.exit(f"pkg-config failed:\n{flags}")
        libdirs = [f[2:] for f in shlex.split(flags) if f.startswith("-L")]
        renv = dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs + [os.environ.get("LD_LIBRARY_PATH", "")]),
                    KL_CACHE_DIR=os.path.join(tmp, "cache"))
        for switch in ("KL_TEST_BREAK_LOWERING", "KL_TEST_FAIL_LOWERING"):
            renv.pop(switch, None)
        for case, (switch, value, says) in CASES.items():
            bundle = bundles[case]
            exe = os.path.join(tmp, "replay_" + case)
            cmd = ["cc", os.path.join(bundle, "replay.c"), "-o", exe] + shlex.split(flags)
            if sanitize:
                cmd.append("-fsanitize=" + sanitize)
            rc, out = run(cmd)
            if rc != 0:
                sys.exit(f"{case}: {' '.join(cmd)} failed:\n{out}")
            rc, out = run([exe, bundle], env=renv)
            print(f"{case}: without {switch}: exit {rc}: {out.strip()}")
            if rc != 0:
                sys.exit(f"{case}: replay should agree without {switch}")
            rc, out = run([exe, bundle], env=dict(renv, **{switch: value}))
            print(f"{case}: with {switch}={value}: exit {rc}: {out.strip()}")
            if rc != 1 or says not in out:
                sys.exit(f"{case}: replay should reproduce it (exit 1, \"{says}\")")
    print("ok")


if __name__ == "__main__":
    main()
