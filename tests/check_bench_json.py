#!/usr/bin/env python3
"""check_bench_json.py — kiln-bench's --json output against docs/BENCH.md's schema.

Runs kiln-bench at the small size (quick method: the numbers are not looked
at, only their presence and types), once with PyTorch made unavailable (the
torch columns must say "not installed", never vanish), checks every key and
type, the rows' coverage (each workload x mode), the SVG (well-formed XML with
a bar per timed row) and the errors for bad arguments.

Usage: check_bench_json.py KILN_BENCH
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

exe = sys.argv[1]
NUM = (int, float)
TOP = {"schema": str, "kiln_version": str, "config": str, "date": str, "device": str, "threads": int,
       "size": str, "method": dict, "limits": dict, "torch": dict, "rows": list}
METHOD = {"warmup": int, "min_runs": int, "min_time_s": NUM}
LIMITS = {"stream_copy_gbs": NUM, "stream_add_gbs": NUM, "sgemm_gflops": NUM, "from_cache": bool}
NULLABLE_NUM = (int, float, type(None))
NULLABLE_INT = (int, type(None))
ROW = {"workload": str, "size": str, "standard_size": bool, "mode": str, "status": str, "note": str,
       "median_s": NULLABLE_NUM, "q1_s": NULLABLE_NUM, "q3_s": NULLABLE_NUM, "iqr_s": NULLABLE_NUM,
       "runs": int, "noisy": bool, "speedup_vs_eager": NULLABLE_NUM, "kernels": NULLABLE_INT,
       "library_calls": NULLABLE_INT, "compile_cold_ms": NULLABLE_NUM, "compile_cached_ms": NULLABLE_NUM,
       "first_call_ms": NULLABLE_NUM, "check": (str, type(None)), "floor_bytes": NULLABLE_NUM,
       "flops": NULLABLE_NUM, "achieved": NULLABLE_NUM, "achieved_unit": (str, type(None)),
       "roofline_fraction": NULLABLE_NUM}
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


def keys(obj, spec, where):
    expect(isinstance(obj, dict), f"{where}: not an object")
    if not isinstance(obj, dict):
        return
    expect(set(obj) == set(spec), f"{where}: keys {sorted(obj)} != {sorted(spec)}")
    for k, t in spec.items():
        if k in obj:
            v = obj[k]
            ok = isinstance(v, t) and not (t in (int, NULLABLE_INT) and isinstance(v, bool))
            expect(ok, f"{where}.{k}: {v!r} is not {t}")


svg = os.path.join(tempfile.mkdtemp(prefix="kiln_bench_test_"), "bench.svg")
env = dict(os.environ, KILN_BENCH_PYTHON="/nonexistent/python3")
workloads, modes = ["chain5", "mlp", "adamw", "digits_step"], ["eager", "TRACE_ONLY", "NO_FUSE", "FUSE"]
cmd = [exe, "--size", "small", "--workload", ",".join(workloads), "--min-time", "0", "--min-runs", "3",
       "--warmup", "1", "--threads", "2", "--json", "--quiet", "--compare", "torch", "--svg", svg]
p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
expect(p.returncode == 0, f"exit status {p.returncode}; stderr: {p.stderr[-2000:]}")
doc = json.loads(p.stdout)
keys(doc, TOP, "top")
expect(doc["schema"] == "kiln-bench/1", "schema name")
expect(doc["size"] == "small" and doc["threads"] == 2 and doc["device"] == "cpu", "size/threads/device echo")
expect("OpenBLAS core" in doc["config"], "config names the OpenBLAS core")
keys(doc["method"], METHOD, "method")
keys(doc["limits"], LIMITS, "limits")
for k in ("stream_copy_gbs", "stream_add_gbs", "sgemm_gflops"):
    expect(doc["limits"][k] > 0, f"limits.{k} > 0")
expect(doc["limits"]["from_cache"] is False, "a quick run neither reads nor writes the day's cache")
expect(doc["torch"]["requested"] is True, "torch requested")
names = [s["name"] for s in doc["torch"]["systems"]]
expect(names == ["torch_eager", "torchscript", "torch_compile"], f"torch systems {names}")
for s in doc["torch"]["systems"]:
    keys(s, {"name": str, "status": str, "detail": str}, "torch.systems[]")
    expect(s["status"] == "not installed", f"{s['name']} without python: {s['status']}")
rows = doc["rows"]
for i, r in enumerate(rows):
    keys(r, ROW, f"rows[{i}]")
seen = {(r["workload"], r["mode"]) for r in rows}
for w in workloads:
    for m in modes + ["torch_eager", "torchscript", "torch_compile"]:
        expect((w, m) in seen, f"no row for {w} {m}")
for r in rows:
    where = f"{r['workload']} {r['mode']}"
    if r["mode"].startswith("torch"):
        expect(r["status"] == "not installed" and r["median_s"] is None, f"{where}: {r['status']}")
        continue
    expect(r["status"] == "ok", f"{where}: {r['status']} {r['note']}")
    expect(r["median_s"] > 0 and r["q1_s"] <= r["median_s"] <= r["q3_s"] and r["runs"] >= 3, f"{where}: stats")
    expect(abs(r["iqr_s"] - (r["q3_s"] - r["q1_s"])) <= 1e-6 * r["q3_s"] + 1e-12, f"{where}: iqr")
    expect(r["speedup_vs_eager"] > 0, f"{where}: speedup")
    if r["mode"] == "eager":
        expect(r["kernels"] is None and r["check"] is None and r["compile_cold_ms"] is None, f"{where}: eager")
        expect(abs(r["speedup_vs_eager"] - 1) < 1e-9, f"{where}: eager's speedup is 1")
    else:
        expect(r["check"] == "ok", f"{where}: check {r['check']}")
        expect(r["kernels"] >= 1 and 0 <= r["library_calls"] <= r["kernels"], f"{where}: counts")
        expect(r["compile_cold_ms"] >= 0 and r["compile_cached_ms"] >= 0 and r["first_call_ms"] > 0, f"{where}: compile")
    if r["workload"] == "chain5":
        expect(r["floor_bytes"] == 8 * 65536 and r["flops"] is None, f"{where}: floor")
        expect(r["achieved_unit"] == "GB/s" and r["roofline_fraction"] > 0, f"{where}: GB/s")
    if r["workload"] == "mlp":
        expect(r["flops"] > 0 and r["achieved_unit"] == "GFLOP/s", f"{where}: GFLOP/s")
    if r["workload"] == "digits_step":
        expect(r["achieved"] is None and r["roofline_fraction"] is None, f"{where}: overhead-bound, no floor")
fuse = {r["workload"]: r for r in rows if r["mode"] == "FUSE"}
expect(fuse["chain5"]["kernels"] == 1 and fuse["chain5"]["library_calls"] == 0, "chain5 FUSE is one kernel")
expect(fuse["mlp"]["library_calls"] == 3, "mlp FUSE: two matmuls and the last bias add dispatched")

# the SVG: well-formed, one bar per timed row
root = ET.parse(svg).getroot()
bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.find("{http://www.w3.org/2000/svg}title") is not None]
timed = [r for r in rows if r["status"] == "ok"]
expect(len(bars) == len(timed), f"{len(bars)} bars for {len(timed)} timed rows")

# PyTorch's side through a stand-in script (the real one needs torch): its
# results become rows, its errors error rows, a system it calls unavailable
# "not installed" rows
fake = os.path.join(os.path.dirname(svg), "fake_torch.py")
with open(fake, "w") as f:
    f.write("import sys\n"
            "print('SYS torch_eager ok torch 9.9')\n"
            "print('SYS torchscript ok torch.jit.script')\n"
            "print('SYS torch_compile not-installed torch.compile needs PyTorch >= 2')\n"
            "print('RES chain5 torch_eager 65536 0.002 0.001 0.003 12')\n"
            "print('ERR chain5 torchscript RuntimeError: scripted badly')\n"
            "print('RES gelu torch_eager 65536 0.004 0.004 0.004 10')\n"
            "print('RES gelu torchscript 65536 0.001 0.001 0.001 10')\n")
env2 = dict(os.environ, KILN_BENCH_PYTHON=sys.executable, KILN_BENCH_TORCH_SCRIPT=fake)
p = subprocess.run([exe, "--size", "small", "--workload", "chain5,gelu", "--mode", "eager", "--min-time", "0",
                    "--min-runs", "3", "--warmup", "0", "--json", "--quiet", "--compare", "torch"],
                   env=env2, capture_output=True, text=True, timeout=300)
expect(p.returncode == 1, f"an error row makes the exit status 1, got {p.returncode}")
doc2 = json.loads(p.stdout)
by = {(r["workload"], r["mode"]): r for r in doc2["rows"]}
for r in doc2["rows"]:
    keys(r, ROW, "fake torch row")
expect([s["status"] for s in doc2["torch"]["systems"]] == ["ok", "ok", "not installed"], "fake torch systems")
r = by[("chain5", "torch_eager")]
expect(r["status"] == "ok" and r["median_s"] == 0.002 and r["q1_s"] == 0.001 and r["runs"] == 12 and r["noisy"],
       f"chain5 torch_eager parsed: {r}")
eager = by[("chain5", "eager")]["median_s"]
expect(abs(r["speedup_vs_eager"] - eager / 0.002) <= 1e-6 * eager / 0.002, "torch speedup is Kiln eager / torch")
r = by[("chain5", "torchscript")]
expect(r["status"] == "error" and "scripted badly" in r["note"] and r["median_s"] is None, f"error row: {r}")
for w in ("chain5", "gelu"):
    r = by[(w, "torch_compile")]
    expect(r["status"] == "not installed" and "PyTorch >= 2" in r["note"], f"{w} torch_compile: {r}")
expect(by[("gelu", "torchscript")]["median_s"] == 0.001, "gelu torchscript parsed")

# --device cuda on the emulated device (docs/GPU.md): the rows run there, checked
# against eager there, and get no roofline (the limits are the CPU's)
env3 = dict(os.environ, KL_CUDA_EMULATE="1")
p = subprocess.run([exe, "--device", "cuda", "--size", "small", "--workload", "chain5", "--mode", "eager,FUSE",
                    "--min-time", "0", "--min-runs", "2", "--warmup", "0", "--json", "--quiet"],
                   env=env3, capture_output=True, text=True, timeout=500)
expect(p.returncode == 0, f"--device cuda (emulated): status {p.returncode}, {p.stderr[-500:]}")
if p.returncode == 0:
    doc3 = json.loads(p.stdout)
    expect(doc3["device"] == "cuda", "device echo")
    for r in doc3["rows"]:
        keys(r, ROW, "cuda row")
        expect(r["status"] == "ok" and r["roofline_fraction"] is None, f"cuda {r['mode']}: {r['status']} {r['note']}")
    expect([r["check"] for r in doc3["rows"]] == [None, "ok"], "cuda FUSE checked against cuda eager")

# bad arguments: exit 2 and a message naming the problem
for args, needle in [(["--mode", "FAST"], "unknown mode \"FAST\""), (["--size", "huge"], "unknown size \"huge\""),
                     (["--workload", "chain6"], "unknown workload \"chain6\""), (["--threads", "0"], "--threads 0"),
                     (["--compare", "jax"], "only 'torch'"), (["--bogus"], "unknown option --bogus"),
                     (["--threads"], "--threads needs a value")]:
    q = subprocess.run([exe] + args, capture_output=True, text=True, timeout=60)
    expect(q.returncode == 2 and needle in q.stderr, f"{args}: status {q.returncode}, stderr {q.stderr!r}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"kiln-bench --json: {len(rows)} rows, schema ok; SVG {len(bars)} bars; bad arguments refused")
