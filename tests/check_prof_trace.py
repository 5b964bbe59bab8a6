#!/usr/bin/env python3
"""Checks a Chrome trace written by kl_profiler_stop (tests/test_prof.c).

usage: check_prof_trace.py TRACE.json eager|compiled|cap N
Exits non-zero, saying what is wrong, if the file does not parse as JSON or
lacks the events the named scenario made."""
import json
import sys


def fail(msg):
    print("check_prof_trace:", msg)
    sys.exit(1)


path, scenario = sys.argv[1], sys.argv[2]
with open(path) as f:
    doc = json.load(f)  # must parse
events = doc["traceEvents"]
for e in events:
    for k in ("name", "ph", "pid", "tid"):
        if k not in e:
            fail("event without %s: %r" % (k, e))
    if e["ph"] == "X" and (e["dur"] < 0 or e["ts"] < 0):
        fail("bad times: %r" % e)
    if e["ph"] not in ("X", "i", "M"):
        fail("unknown ph: %r" % e)
real = [e for e in events if e["ph"] != "M"]


def find(cat, name=None, pred=lambda e: True):
    return [e for e in real if e.get("cat") == cat and (name is None or e["name"] == name) and pred(e)]


def inside(inner, outer):
    return (inner["tid"] == outer["tid"] and inner["ts"] >= outer["ts"] - 0.001
            and inner["ts"] + inner.get("dur", 0) <= outer["ts"] + outer["dur"] + 0.001)


if scenario == "eager":
    adds = find("op", "add")
    if len(adds) != 2:
        fail("expected 2 add events, got %d" % len(adds))
    a = adds[0]["args"]
    if a["shapes"] != [[2, 3], [2, 3]] or a["dtypes"] != ["f32", "f32"] or a["device"] != "cpu" or a["bytes"] != 24:
        fail("add args: %r" % a)
    mm = find("op", "matmul")
    if len(mm) != 1 or mm[0]["args"]["shapes"] != [[2, 3], [3, 4]] or mm[0]["args"]["bytes"] != 32:
        fail("matmul: %r" % mm)
    sc = find("op", "mul_", lambda e: e["args"]["dtypes"] == ["f32", "f64 scalar"])
    if len(sc) != 1 or sc[0]["args"]["bytes"] != 0:
        fail("in-place mul by a scalar: %r" % find("op", "mul_"))
    if find("op", pred=lambda e: e["args"]["device"] == "meta"):
        fail("meta ops recorded")
    # eager events are in time order on one thread
    ts = [e["ts"] for e in find("op")]
    if ts != sorted(ts):
        fail("events out of order")
elif scenario == "compiled":
    calls = find("compiled_call", "mlp")
    if len(calls) != 3:
        fail("expected 3 calls of mlp, got %d" % len(calls))
    tr = find("trace", "trace", lambda e: e["args"]["fn"] == "mlp")
    if len(tr) != 2:
        fail("expected 2 traces of mlp, got %d" % len(tr))
    if tr[0]["args"] != {"fn": "mlp", "entry": 0, "why": "first call"}:
        fail("trace args: %r" % tr[0]["args"])
    if not tr[1]["args"]["why"].startswith("input 1 changed from [4,8] float32"):
        fail("second trace's reason: %r" % tr[1]["args"])
    if len(find("compile", "passes")) != 2 or len(find("compile", "codegen")) != 2:  # brk's trace broke
        fail("passes/codegen events")
    hits = find("cache", "cache hit")
    if len(hits) != 1 or hits[0]["args"] != {"fn": "mlp", "entry": 0} or hits[0]["ph"] != "i":
        fail("cache hit: %r" % hits)
    rc = find("recompile", "recompile")
    if len(rc) != 1 or not rc[0]["args"]["reason"].startswith("input 1 changed"):
        fail("recompile: %r" % rc)
    ks = find("kernel")
    if len(ks) != 3:
        fail("expected 3 kernel runs, got %d" % len(ks))
    for k in ks:
        if "gelu" not in k["args"]["ops"] or "add" not in k["args"]["ops"] or not any(inside(k, c) for c in calls):
            fail("kernel event: %r" % k)
    if ks[0]["args"]["shapes"][0] != [4, 16]:
        fail("kernel shapes: %r" % ks[0]["args"])
    libs = find("library", "matmul")
    if len(libs) != 6 or not all(any(inside(l, c) for c in calls) for l in libs):
        fail("library matmuls: %d" % len(libs))
    fb = find("fallback")
    if len(fb) != 1 or "trace break" not in fb[0]["args"]["reason"]:
        fail("fallback: %r" % fb)
elif scenario == "cap":
    n = int(sys.argv[3])
    if len(real) != n or doc["otherData"]["max_events"] != n or doc["otherData"]["events"] != n:
        fail("cap: %d events, otherData %r" % (len(real), doc["otherData"]))
    if doc["otherData"]["dropped"] != 100 - n:
        fail("dropped: %r" % doc["otherData"])
    # the newest survive: the last op was an add of a [7]-shaped tensor
    if real[-1]["args"]["shapes"] != [[7], [7]]:
        fail("newest event: %r" % real[-1])
else:
    fail("unknown scenario " + scenario)
print("ok", scenario, len(real), "events")
