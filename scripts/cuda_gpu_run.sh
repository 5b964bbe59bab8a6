#!/bin/sh
# cuda_gpu_run.sh — runs every CUDA suite on the real driver, then the GPU
# benchmarks, on a machine with a GPU. Run from the repository root with the
# binaries unpacked in .gpu/ (docs/GPU.md, "How to run the GPU suites"):
#   OUT=/some/folder sh scripts/cuda_gpu_run.sh [suites|bench|all]
# Logs: $OUT/env.txt, $OUT/summary.txt and $OUT/logs.tgz (one log per suite,
# per benchmark, per sanitizer run). Suites run in parallel (one process
# each); the benchmarks run after them, alone. KILN_GPU_SANITIZER=1 adds
# compute-sanitizer over four suites; KILN_GPU_SIZES, KILN_GPU_TORCH_S tune the benches.
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=$REPO/.gpu
WHAT=${1:-all}
OUT=${OUT:-$REPO/.gpu/out}
LOG=$BIN/logs
mkdir -p "$OUT" "$LOG"
export LD_LIBRARY_PATH="$BIN:$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
export KL_CACHE_DIR="$BIN/kernel-cache" KL_NUM_THREADS=2
export KT_NPY_DIR="$REPO/tests/data/npy" KT_FIXTURES_DIR="$REPO/tests/fixtures"
export KT_INCLUDE_DIR="$REPO/include" KT_TESTS_DIR="$REPO/tests" KT_PYTHON="$(command -v python3)"
cd "$BIN" || exit 1
{
    date -u; uname -a; nvidia-smi; lscpu | sed -n '1,20p'
    echo "--- ldconfig"; ldconfig -p | grep -E 'libcuda\.so|libnvrtc\.so|libcublas\.so'
    echo "--- toolkit"; nvcc --version 2>&1 | tail -2
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' 2>&1
} > "$OUT/env.txt" 2>&1

if [ "$WHAT" != bench ]; then
    start=$(date +%s)
    ls test_cuda_* | xargs -P 16 -I{} sh -c \
        'timeout 300 ./{} > logs/{}.txt 2>&1; echo "exit status $?" >> logs/{}.txt'
    echo "suites: $(( $(date +%s) - start )) s wall" >> "$LOG/timing.txt"
    # Driver-API misuse the suites might hide (leaks, bad frees, bad copies).
    if [ -n "$KILN_GPU_SANITIZER" ] && command -v compute-sanitizer > /dev/null; then
        for t in runtime alloc tensor blas; do
            timeout 200 compute-sanitizer --tool memcheck --leak-check full ./test_cuda_$t \
                > "$LOG/sanitizer_$t.txt" 2>&1 &
        done
        wait
    fi
fi
if [ "$WHAT" != suites ]; then
    start=$(date +%s)
    timeout 120 ./cuda_bench > "$LOG/cuda_bench.txt" 2>&1
    echo "exit status $?" >> "$LOG/cuda_bench.txt"
    # issue 13's targets, then the same with CUDA's fast math
    timeout 120 ./cuda_speed_bench > "$LOG/cuda_speed_bench.txt" 2>&1
    echo "exit status $?" >> "$LOG/cuda_speed_bench.txt"
    KL_CUDA_FAST_MATH=1 KL_CACHE_DIR="$BIN/kernel-cache-fast" timeout 120 ./cuda_speed_bench \
        > "$LOG/cuda_speed_bench_fast.txt" 2>&1
    echo "exit status $?" >> "$LOG/cuda_speed_bench_fast.txt"
    for s in ${KILN_GPU_SIZES:-medium large}; do
        timeout 200 ./kiln-bench --device cuda --size $s --quiet --json > "$LOG/kiln_bench_$s.json" 2> "$LOG/kiln_bench_$s.err"
        echo "exit status $?" >> "$LOG/kiln_bench_$s.err"
    done
    echo "benches: $(( $(date +%s) - start )) s wall" >> "$LOG/timing.txt"
    # PyTorch on the same GPU (the image's torch), streamed line by line so a
    # timeout keeps what finished; kiln-bench reads the same lines.
    start=$(date +%s)
    PYTHONUNBUFFERED=1 timeout ${KILN_GPU_TORCH_S:-240} python3 "$REPO/bench/torch_workloads.py" --device cuda \
        --size large --threads 2 > "$LOG/torch_large.txt" 2>&1
    echo "exit status $?" >> "$LOG/torch_large.txt"
    echo "torch: $(( $(date +%s) - start )) s wall" >> "$LOG/timing.txt"
fi
{
    cat "$LOG/timing.txt" 2>/dev/null
    for f in "$LOG"/*.txt "$LOG"/*.err; do
        [ -f "$f" ] || continue
        echo "== $(basename "$f"): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) \]' "$f" | tr '\n' ' ') $(tail -1 "$f")"
        grep -E '^\[  FAILED  \] [a-z_]|ERROR SUMMARY' "$f" | head -20
    done
} > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$BIN" logs
