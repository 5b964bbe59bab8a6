#!/usr/bin/env bash
# run_charlm_cpu_ab.sh [BUILD_DIR] [REPS] — examples/charlm's step at 1 thread as CPU
# time per step (perf stat's task-clock of 12 + 2 steps minus that of 2 + 2 steps, / 10),
# for a loaded machine where wall-clock medians are not comparable: Kiln compiled and
# eager with causal attention fused (causal = true) and through sdpa's decomposition
# (--mask-attention), and PyTorch 1.13 eager (bench/torch_charlm.py), REPS rounds
# (default 2) alternated in one run. CPU time still moves under load (caches, SMT
# siblings): compare rows of the same round. Needs perf and the fortune files.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
reps=${2:-2}
export OPENBLAS_NUM_THREADS=1
tc() { perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | awk -F, '/task-clock/ { print $1 }'; }
per_step() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b - a) / 10 }'; }
echo "run_charlm_cpu_ab: $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
for rep in $(seq "$reps"); do
    for cfg in compiled: compiled:--mask-attention eager: eager:--mask-attention; do
        mode=${cfg%%:*} extra=${cfg#*:}
        args=(--threads 1 --mode "$mode")
        [ "$mode" = compiled ] && args+=(--compile step)
        [ -n "$extra" ] && args+=("$extra")
        a=$(tc "$build/examples/charlm/charlm" --bench-steps 2 "${args[@]}")
        b=$(tc "$build/examples/charlm/charlm" --bench-steps 12 "${args[@]}")
        echo "round $rep: Kiln $mode ${extra:-(fused causal attention)}: $(per_step "$a" "$b") CPU ms/step (load $(cut -d' ' -f1 /proc/loadavg))"
    done
    a=$(tc /usr/bin/python3 bench/torch_charlm.py --steps 2 --threads 1)
    b=$(tc /usr/bin/python3 bench/torch_charlm.py --steps 12 --threads 1)
    echo "round $rep: PyTorch eager: $(per_step "$a" "$b") CPU ms/step (load $(cut -d' ' -f1 /proc/loadavg))"
done
