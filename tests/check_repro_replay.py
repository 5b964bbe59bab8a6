#!/usr/bin/env python3
"""A repro bundle replays against the installed library (src/trace/repro.c).

    check_repro_replay.py MESON BUILD_DIR TEST_REPRO

Runs test_repro with KT_REPRO_DIR set so its bundle is kept, installs the
build into a scratch prefix (meson install --destdir), builds the bundle's
replay.c with `cc replay.c $(pkg-config --cflags --libs kiln)` against it and
checks the exit codes: 1 (reproduced) with the broken lowering switched on,
0 without it.
"""
import glob
import os
import shlex
import subprocess
import sys
import tempfile


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
        bundles = glob.glob(os.path.join(tmp, "out", "kiln_repro_*"))
        if len(bundles) != 1:
            sys.exit(f"expected one bundle, found {bundles}")
        bundle = bundles[0]
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
        exe = os.path.join(tmp, "replay")
        cmd = ["cc", os.path.join(bundle, "replay.c"), "-o", exe] + shlex.split(flags)
        if sanitize:
            cmd.append("-fsanitize=" + sanitize)
        rc, out = run(cmd)
        if rc != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{out}")
        libdirs = [f[2:] for f in shlex.split(flags) if f.startswith("-L")]
        renv = dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs + [os.environ.get("LD_LIBRARY_PATH", "")]),
                    KL_CACHE_DIR=os.path.join(tmp, "cache"))
        renv.pop("KL_TEST_BREAK_LOWERING", None)
        rc, out = run([exe, bundle], env=renv)
        print(f"without the broken rule: exit {rc}: {out.strip()}")
        if rc != 0:
            sys.exit("replay should agree without KL_TEST_BREAK_LOWERING")
        rc, out = run([exe, bundle], env=dict(renv, KL_TEST_BREAK_LOWERING="gelu"))
        print(f"with KL_TEST_BREAK_LOWERING=gelu: exit {rc}: {out.strip()}")
        if rc != 1 or "reproduced: the compiled subgraph differs from eager" not in out:
            sys.exit("replay should reproduce the mismatch (exit 1)")
    print("ok")


if __name__ == "__main__":
    main()
