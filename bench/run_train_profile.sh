#!/usr/bin/env bash
# run_train_profile.sh [BUILD_DIR] [THREADS] [BATCH...] — where the digits
# training step's time goes, per mode (issue 15: "where GEMMs bound it, show the
# profile (GEMM share of the step) and the ratio on the non-GEMM part").
#
# For each batch (default 64 256) and mode (eager, compiled whole step, compiled
# forward + kl_backward), runs `KB_MODE=<mode> BUILD_DIR/bench/train_bench`
# under `perf record` (one mode per process, >= 2 s of steps) and reads the
# share of CPU samples in OpenBLAS (the GEMMs) from `perf report --sort dso`.
# Setup, tracing and LLVM (libLLVM's samples, printed apart) are in the same
# process but are a small part of it. non-GEMM ms = median x (1 - GEMM share):
# an estimate, since the share is of CPU samples (at 2 threads a spinning
# worker's samples count too), not of wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-1}
shift 2 || shift $# || true
batches=("$@")
[ ${#batches[@]} -eq 0 ] && batches=(64 256)
command -v perf >/dev/null || { echo "$(basename "$0"): needs perf (apt-get install -y linux-perf)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "run_train_profile: $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, $threads threads"
echo
echo "| batch | mode | median ms/step | OpenBLAS (GEMM) share | libLLVM share | non-GEMM ms/step | eager / mode, whole step | eager / mode, non-GEMM part |"
echo "|---|---|---|---|---|---|---|---|"
for b in "${batches[@]}"; do
    eager_ms="" eager_ng=""
    for mode in eager compiled fwd; do
        KB_MODE=$mode perf record -q -F 4000 -o "$tmp/perf.data" -- "$build/bench/train_bench" "$threads" "$b" >"$tmp/out" 2>"$tmp/err" ||
            { cat "$tmp/err" >&2; exit 1; }
        ms=$(awk '/ batch /{print $4}' "$tmp/out")
        perf report -i "$tmp/perf.data" --sort dso --stdio 2>/dev/null >"$tmp/rep"
        gemm=$(awk '/libopenblas/{gsub("%","",$1); s+=$1} END{printf "%.1f", s+0}' "$tmp/rep")
        llvm=$(awk '/libLLVM/{gsub("%","",$1); s+=$1} END{printf "%.1f", s+0}' "$tmp/rep")
        ng=$(awk -v m="$ms" -v g="$gemm" 'BEGIN{printf "%.3f", m*(1-g/100)}')
        [ "$mode" = eager ] && eager_ms=$ms eager_ng=$ng
        r1=$(awk -v a="$eager_ms" -v b="$ms" 'BEGIN{printf "%.2fx", a/b}')
        r2=$(awk -v a="$eager_ng" -v b="$ng" 'BEGIN{printf "%.2fx", a/b}')
        echo "| $b | $mode | $ms | $gemm% | $llvm% | $ng | $r1 | $r2 |"
    done
done
