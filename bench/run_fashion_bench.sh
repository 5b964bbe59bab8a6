#!/usr/bin/env bash
# run_fashion_bench.sh [BUILD_DIR] [THREADS...] — issue 16's CNN training step
# (examples/fashion's model, batch $BATCH, default 128) in Kiln, eager and
# compiled (`fashion --bench-steps N`), and in PyTorch 1.13 eager
# (bench/torch_fashion.py, same architecture, init, optimizer) side by side:
# for each thread count (default 1 2), ROUNDS (default 3) alternating runs of
# each timing STEPS (default 20) steps after 3 warm-up steps. Each system's
# table entry is its best median over the rounds (the same rule for all);
# every run's line is printed too. Needs the data (scripts/fetch_fashion.sh,
# run first here) and Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 2)
rounds=${ROUNDS:-3}
steps=${STEPS:-20}
batch=${BATCH:-128}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "$(basename "$0"): the PyTorch side needs Debian's python3-torch: apt-get install -y python3-torch" >&2
    exit 2
fi
if [ ! -x "$build/examples/fashion/fashion" ]; then
    echo "$(basename "$0"): no $build/examples/fashion/fashion (needs zlib1g-dev; ninja -C $build)" >&2
    exit 2
fi
scripts/fetch_fashion.sh
echo "run_fashion_bench: $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs," \
     "batch $batch, $steps steps"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for t in "${threads[@]}"; do
    for ((r = 1; r <= rounds; r++)); do
        "$build/examples/fashion/fashion" --bench-steps "$steps" --batch "$batch" --threads "$t" --mode both --limit 10000 \
            | grep '^kiln ' | tee -a "$out"
        /usr/bin/python3 bench/torch_fashion.py --steps "$steps" --batch "$batch" --threads "$t" | tee -a "$out"
    done
done
echo
echo "| threads | batch | Kiln eager ms/step | Kiln compiled ms/step | PyTorch eager ms/step | PyTorch / Kiln eager | PyTorch / Kiln compiled |"
echo "|---|---|---|---|---|---|---|"
# lines: "<sys> <mode> batch B, T threads: median X ms/step ..."
tr -d ',:' <"$out" | awk '
    { k = $5 " " $4; s = $1 $2 " " k
      if (!(s in ms) || $8 < ms[s]) ms[s] = $8
      if (!(k in seen)) { seen[k] = 1; keys[n++] = k } }
    END {
        for (i = 0; i < n; i++) {
            split(keys[i], f, " ")
            e = ms["kilneager " keys[i]]; c = ms["kilncompiled " keys[i]]; p = ms["torcheager " keys[i]]
            printf "| %s | %s | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n", f[1], f[2], e, c, p, p / e, p / c
        }
    }'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
