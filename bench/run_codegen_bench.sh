#!/usr/bin/env bash
# run_codegen_bench.sh [BUILD_DIR] [THREADS...] — compiled-code speed (issue 5):
# BUILD_DIR/bench/codegen_bench (Kiln eager, compiled, interpreter backend
# where built, hand-fused C, STREAM and sgemm) and bench/torch_codegen.py
# (PyTorch 1.13 eager and TorchScript) back to back for each thread count
# (default 1 2), then one markdown table per thread count with every ratio
# taken from this one run. Raw lines are printed as they come (and kept in
# $KB_RAW if set). Extra filters for both programs: FILTER="chain5 gelu/65536".
# Takes ~10 minutes; do not run it while the machine is busy (see `uptime`).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 2)
read -r -a filter <<<"${FILTER:-}"
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "$(basename "$0"): the PyTorch side needs Debian's python3-torch: apt-get install -y python3-torch" >&2
    exit 2
fi
raw=${KB_RAW:-$(mktemp)}
[ -n "${KB_RAW:-}" ] || trap 'rm -f "$raw"' EXIT
: >"$raw"
echo "run_codegen_bench: $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs," \
     "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes')," \
     "KL_CPU_BACKEND=${KL_CPU_BACKEND:-(unset)}"
for t in "${threads[@]}"; do
    # a fresh, empty kernel cache per run, so the first call is a cold compile
    cache=$(mktemp -d)
    KL_CACHE_DIR=$cache "$build/bench/codegen_bench" "$t" "${filter[@]}" | sed "s/^/$t /" | tee -a "$raw"
    rm -rf "$cache"
    /usr/bin/python3 bench/torch_codegen.py "$t" "${filter[@]}" | sed "s/^/$t /" | tee -a "$raw"
done
echo
/usr/bin/python3 - "$raw" <<'EOF'
import sys
from collections import defaultdict

res = {}                       # (threads, wl, size, system) -> (median, q1, q3, bytes, flops)
first = {}                     # (threads, wl, size, system) -> (first ms, compile ms, kernels, check)
limit = defaultdict(dict)      # threads -> name -> (ms, rate)
order = defaultdict(list)      # threads -> [(wl, size)]
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 2:
        continue
    t, kind = f[0], f[1]
    if kind == "RES":
        key = (t, f[2], f[3])
        if key[1:] not in order[t]:
            order[t].append(key[1:])
        res[key + (f[4],)] = tuple(float(v) for v in f[5:10])
    elif kind == "FIRST":
        first[(t, f[2], f[3], f[4])] = (float(f[5]), float(f[6]), f[7], f[8])
    elif kind == "LIMIT":
        limit[t][f[2]] = (float(f[3]), float(f[4]))


def ms(k):
    r = res.get(k)
    return f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" if r else "–"


def ratio(a, b):
    ra, rb = res.get(a), res.get(b)
    return f"{ra[0] / rb[0]:.2f}x" if ra and rb else "–"


for t in order:
    lim = limit[t]
    bw = max(lim.get("stream_copy", (0, 0))[1], lim.get("stream_add", (0, 0))[1])
    print(f"### {t} thread{'s' if t != '1' else ''}\n")
    print("Machine, same run: " + ", ".join(
        f"{n} {v[1]:.1f} {'GFLOP/s' if n == 'sgemm' else 'GB/s'}" for n, v in lim.items()) + "\n")
    print("| workload | size | Kiln eager ms | compiled ms | interp ms | fused C ms | torch eager ms | TorchScript ms "
          "| compiled GB/s (% DRAM) | eager / compiled | compiled / fused C | torch eager / compiled "
          "| TorchScript / compiled |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for wl, size in order[t]:
        k = lambda s: (t, wl, size, s)  # noqa: E731
        c = res.get(k("kiln_compiled"))
        if c and c[3] > 0:
            gbs = c[3] / (c[0] * 1e-3) / 1e9
            rate = f"{gbs:.1f} ({100 * gbs / bw:.0f}%)" if bw else f"{gbs:.1f}"
        elif c and c[4] > 0:
            gf = c[4] / (c[0] * 1e-3) / 1e9
            sg = lim.get("sgemm", (0, 0))[1]
            rate = f"{gf:.0f} GFLOP/s ({100 * gf / sg:.0f}% sgemm)" if sg else f"{gf:.0f} GFLOP/s"
        else:
            rate = "–"
        print(f"| {wl} | {size} | {ms(k('kiln_eager'))} | {ms(k('kiln_compiled'))} | {ms(k('kiln_interp'))} "
              f"| {ms(k('fused_c'))} | {ms(k('torch_eager'))} | {ms(k('torch_script'))} | {rate} "
              f"| {ratio(k('kiln_eager'), k('kiln_compiled'))} | {ratio(k('kiln_compiled'), k('fused_c'))} "
              f"| {ratio(k('torch_eager'), k('kiln_compiled'))} | {ratio(k('torch_script'), k('kiln_compiled'))} |")
    print("\nFirst call of a fresh kl_compile (trace + passes + kernel compile + one run): cold (kiln_compiled, "
          "empty KL_CACHE_DIR) and again from a second kl_compile (kiln_again: kernels from the disk cache); "
          "minus the steady median, and that per kernel (kernels = kl_fn_stats.kernels, which counts matmuls "
          "too); compile_ms from kl_fn_stats; the check against eager (rtol 1e-3, atol 1e-4):\n")
    print("| workload | size | system | first call ms | first call − median ms | per kernel | compile_ms | kernels "
          "| check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (tt, wl, size, s), v in first.items():
        if tt != t:
            continue
        if s == "fused_c":  # only its check
            print(f"| {wl} | {size} | {s} | – | – | – | – | – | {v[3]} |")
            continue
        r = res.get((t, wl, size, "kiln_compiled" if s == "kiln_again" else s))
        extra = f"{v[0] - r[0]:.2f}" if r else "–"
        per = f"{(v[0] - r[0]) / int(v[2]):.2f}" if r and int(v[2]) > 0 else "–"
        print(f"| {wl} | {size} | {s} | {v[0]:.2f} | {extra} | {per} | {v[1]:.2f} | {v[2]} | {v[3]} |")
    print()
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
