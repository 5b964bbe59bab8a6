#!/usr/bin/env bash
# run_charlm_bench.sh [BUILD_DIR] [STEPS] [THREADS] — issue 16's transformer
# comparison: examples/charlm's training step (forward, loss, backward,
# clipping, AdamW) timed in Kiln, eagerly and compiled (`charlm
# --bench-steps N`), and in PyTorch 1.13 eager (bench/torch_charlm.py, the
# same model, initialisation, batch and optimizer), one after the other in
# one run with the same thread count (default: STEPS 20, THREADS 2). Each
# prints the median of STEPS steps after two warm-up steps. Extra arguments
# for both sides (a smaller model for a smoke test) come from $CHARLM_ARGS,
# e.g. CHARLM_ARGS="--layers 1 --heads 2 --embed 16 --context 16".
# Needs the fortune files (scripts/fetch_fortunes.sh) and Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-20}
threads=${3:-2}
read -r -a extra <<<"${CHARLM_ARGS:-}"
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "$(basename "$0"): the PyTorch side needs Debian's python3-torch: apt-get install -y python3-torch" >&2
    exit 2
fi
echo "run_charlm_bench: $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$build/examples/charlm/charlm" --bench-steps "$steps" --threads "$threads" "${extra[@]}" | tee -a "$out"
/usr/bin/python3 bench/torch_charlm.py --steps "$steps" --threads "$threads" "${extra[@]}" | tee -a "$out"
echo
echo "| threads | Kiln eager ms/step | Kiln compiled step ms/step | Kiln compiled forward + kl_backward ms/step | PyTorch eager ms/step | PyTorch / Kiln eager | PyTorch / Kiln compiled step | PyTorch / Kiln compiled forward |"
echo "|---|---|---|---|---|---|---|---|"
awk -v t="$threads" '
    $1 == "bench" && $2 == "eager" { ke = $4 }
    $1 == "bench" && $2 == "compiled" && $3 == "median" { kc = $4 }
    $1 == "bench" && $2 == "compiled-forward" { kf = $4 }
    $1 == "torch" && $2 == "eager" { pt = $4 }
    END { printf "| %s | %.2f | %.2f | %.2f | %.2f | %.2fx | %.2fx | %.2fx |\n", t, ke, kc, kf, pt, pt / ke, pt / kc, pt / kf }' "$out"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
