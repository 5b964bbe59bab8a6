#!/bin/sh
# cuda_gpu_run.sh — runs the CUDA suites and cuda_bench on a machine with a GPU,
# from a folder holding the binaries (test_cuda_runtime, test_cuda_alloc,
# test_cuda_nvrtc, cuda_bench, libcmocka.so.0) and this script; logs go to
# $OUT (default ./out). docs/GPU.md says how the folder is made.
cd "$(dirname "$0")" || exit 1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD:$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
{
    date -u; uname -a; nvidia-smi; lscpu | sed -n '1,20p'
    echo "--- ldconfig"; ldconfig -p | grep -E 'libcuda\.so|libnvrtc\.so|libcublas\.so'
    echo "--- toolkit"; nvcc --version 2>&1 | tail -2; ls -d /usr/local/cuda* 2>&1; ls /usr/local/cuda/lib64 2>&1 | grep -E '^lib(nvrtc|cublas)\.so'
} > "$OUT/env.txt" 2>&1
for t in runtime alloc nvrtc; do
    timeout 240 ./test_cuda_$t > "$OUT/$t.txt" 2>&1
    echo "exit status $?" >> "$OUT/$t.txt"
done
timeout 120 ./cuda_bench > "$OUT/bench.txt" 2>&1
echo "exit status $?" >> "$OUT/bench.txt"
# The same allocator suite on the emulated device, on this machine's CPU.
KL_CUDA_EMULATE=1 timeout 120 ./test_cuda_alloc > "$OUT/alloc_emu.txt" 2>&1
echo "exit status $?" >> "$OUT/alloc_emu.txt"
# Driver-API misuse the suites might hide (leaks, bad frees, bad copies).
if command -v compute-sanitizer > /dev/null; then
    for t in runtime alloc; do
        timeout 150 compute-sanitizer --tool memcheck --leak-check full ./test_cuda_$t > "$OUT/sanitizer_$t.txt" 2>&1
        echo "exit status $?" >> "$OUT/sanitizer_$t.txt"
    done
fi
