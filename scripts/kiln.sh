#!/usr/bin/env bash
# kiln.sh — one entry point for a fresh Debian 12 machine (run as root):
#   scripts/kiln.sh demo    install what is missing, build, train the digits MLP,
#                           then a short kiln-bench summary
#   scripts/kiln.sh test    install what is missing, build, run every suite
#   scripts/kiln.sh asan    the suites again under AddressSanitizer + UBSan
#   scripts/kiln.sh fuzz    build the libFuzzer targets (clang-16, ASan + UBSan,
#                           build-fuzz) and run each for KILN_FUZZ_SECONDS (50)
#   scripts/kiln.sh fuzz-ci the same targets, deterministic and bounded (.ci/run):
#                           a fixed -seed, a fixed number of inputs each, starting
#                           from the seed corpora only
#   scripts/kiln.sh tsan    the threaded suites under ThreadSanitizer (gcc, build-tsan)
#   scripts/kiln.sh valgrind  memcheck over a subset of the suites (build-valgrind,
#                           without -march=native; installs valgrind)
#   scripts/kiln.sh setup   only install and build
# Set KILN_BUILD to choose the build folder (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD:-build}

# Debian packages the build, the tests and the later layers need.
packages=(gcc g++ pkg-config meson ninja-build libcmocka-dev libopenblas-dev libdlpack-dev llvm-16-dev clang-16 zlib1g-dev
    libclang-rt-16-dev) # libclang-rt-16-dev: clang-16's libFuzzer and sanitizer runtimes (scripts/kiln.sh fuzz)

install_missing() {
    local missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "kiln: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get -o DPkg::Lock::Timeout=300 update -q
    $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
}

configure() { # folder, extra meson args...
    local dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@"
    fi
    ninja -C "$dir"
}

cmd=${1:-demo}
[ "$cmd" = valgrind ] && packages+=(valgrind)
install_missing
case "$cmd" in
setup) configure "$build" ;;
demo)
    configure "$build"
    bash scripts/fetch_digits.sh
    "$build/examples/digits/digits"
    # then a short look at the standard workloads on this machine (docs/BENCH.md;
    # small sizes and a quick method: for real numbers run kiln-bench itself)
    echo
    echo "kiln: kiln-bench --size small --mode eager,FUSE (the full tool: $build/bench/kiln-bench --help)"
    "$build/bench/kiln-bench" --size small --mode eager,FUSE --min-time 0.1 --svg "$build/kiln-bench.svg"
    ;;
test)
    configure "$build"
    bash scripts/fetch_digits.sh || echo "kiln: digits data unavailable; the digits test will be skipped"
    bash scripts/fetch_fashion.sh || echo "kiln: Fashion-MNIST unavailable; the fashion test will be skipped"
    meson test -C "$build" -v --num-processes 1
    ;;
asan)
    configure "$build-asan" -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false
    bash scripts/fetch_digits.sh || echo "kiln: digits data unavailable; the digits test will be skipped"
    bash scripts/fetch_fashion.sh || echo "kiln: Fashion-MNIST unavailable; the fashion test will be skipped"
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        meson test -C "$build-asan" -v --num-processes 1 --timeout-multiplier 4
    ;;
tsan)
    # ThreadSanitizer over the suites that run Kiln from many threads: the
    # pool (runtime), tests/test_threads.c (concurrent first calls of one
    # compiled function, forward + backward, scopes at thread exit, two
    # processes sharing the kernel cache), the hardening suite (thread
    # exit) and compile_async (kernels compiled on the pool and on background
    # threads while calls run: tiered calls, the interpreter tier, release,
    # exit; ~8 s here; its fork test skips itself under TSan). OpenBLAS is not instrumented, so TSan cannot see how its worker
    # threads synchronize: tests/tsan.supp names what that leaves (with why).
    if [ ! -f "$build-tsan/build.ninja" ]; then
        meson setup "$build-tsan" -Db_sanitize=thread -Dbuildtype=debugoptimized -Db_lundef=false
    fi
    suites=(runtime threads hardening compile_async)
    ninja -C "$build-tsan" $(printf 'tests/test_%s ' "${suites[@]}")
    TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$PWD/tests/tsan.supp} \
        meson test -C "$build-tsan" -v --num-processes 1 --timeout-multiplier 4 --no-rebuild "${suites[@]}"
    ;;
valgrind)
    # memcheck over a representative subset (tensors, views, eager ops, index
    # ops, autograd, the IR and its passes, the memory plan) on a build without
    # -march=native: valgrind 3.19 cannot decode AVX-512. objcache is left out:
    # it counts LLVM's cache entries, and kernels run on the interpreter. For the
    # same reason compiled kernels run on the interpreter (LLVM's JIT targets
    # the host's whole ISA) and OpenBLAS keeps the Haswell kernels the test
    # environment pins (OPENBLAS_CORETYPE, tests/meson.build).
    if [ ! -f "$build-valgrind/build.ninja" ]; then
        meson setup "$build-valgrind" -Dnative=false -Dbuildtype=debugoptimized
    fi
    suites=(core index autograd ir plan)
    ninja -C "$build-valgrind" $(printf 'tests/test_%s ' "${suites[@]}")
    KL_CPU_BACKEND=interp meson test -C "$build-valgrind" --no-rebuild -v --num-processes 1 --timeout-multiplier 20 \
        --wrapper "valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite -q" \
        "${suites[@]}"
    ;;
fuzz | fuzz-ci)
    # The library with coverage for libFuzzer (-fsanitize=fuzzer-no-link),
    # the targets linked with -fsanitize=fuzzer (tests/meson.build); line
    # tables only for the stack traces (full -g made the build several times
    # slower).
    if [ ! -f "$build-fuzz/build.ninja" ]; then
        CC=clang-16 CXX=clang++-16 meson setup "$build-fuzz" -Dfuzzers=true -Dbuildtype=debugoptimized \
            -Db_sanitize=address,undefined -Db_lundef=false \
            "-Dc_args=-fsanitize=fuzzer-no-link -gline-tables-only" \
            "-Dcpp_args=-fsanitize=fuzzer-no-link -gline-tables-only"
    fi
    targets=(npy ops safetensors dlpack kcache)
    ninja -C "$build-fuzz" $(printf 'tests/fuzz_%s_lf ' "${targets[@]}")
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
    # fuzz-ci: one thread, so the coverage that steers libFuzzer does not
    # depend on how the pool's workers were scheduled (run to run, the same
    # seed then makes the same inputs)
    [ "$cmd" = fuzz-ci ] && export KL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    secs=${KILN_FUZZ_SECONDS:-50}
    # fuzz-ci: inputs per target, sized so the set takes about 2.5 minutes on
    # a loaded 2-core machine (docs/HARDENING.md has the measurements);
    # fuzz_ops runs each program eagerly and compiled twice, hence its few.
    declare -A runs=([npy]=30000 [ops]=1500 [safetensors]=30000 [dlpack]=20000 [kcache]=8000)
    status=0
    for t in "${targets[@]}"; do
        mkdir -p "$build-fuzz/artifacts"
        log="$build-fuzz/artifacts/$t.log"
        rc=0
        if [ "$cmd" = fuzz-ci ]; then
            # The same inputs every run: a fixed seed, a fixed count and a
            # fresh corpus holding only what this run adds to the seeds, so a
            # failure is a finding that reproduces, never the luck of the draw.
            corpus="$build-fuzz/ci-corpus/$t"
            rm -rf "$corpus"
            mkdir -p "$corpus"
            echo "kiln: fuzzing $t: ${runs[$t]} inputs, seed 1"
            start=$SECONDS
            timeout -s INT 900 "$build-fuzz/tests/fuzz_${t}_lf" -seed=1 -runs="${runs[$t]}" -timeout=20 \
                -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$build-fuzz/artifacts/$t-" \
                "$corpus" "tests/fuzz/$t" >"$log" 2>&1 || rc=$?
            echo "kiln: fuzz_$t: $((SECONDS - start)) s"
        else
            # new inputs go to $build-fuzz/corpus/<t>; tests/fuzz/<t> (the seeds) is only read
            mkdir -p "$build-fuzz/corpus/$t"
            echo "kiln: fuzzing $t for ${secs}s"
            # libFuzzer reads the whole corpus before it looks at the clock: a
            # grown corpus is cut short by SIGINT (a clean exit, not a finding).
            timeout -s INT $((secs + 30)) "$build-fuzz/tests/fuzz_${t}_lf" -max_total_time="$secs" -timeout=20 \
                -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$build-fuzz/artifacts/$t-" \
                "$build-fuzz/corpus/$t" "tests/fuzz/$t" >"$log" 2>&1 || rc=$?
            if [ $rc -eq 124 ] && grep -q "run interrupted" "$log"; then rc=0; fi
        fi
        if [ $rc -ne 0 ]; then
            status=1
            echo "kiln: fuzz_$t found a problem (input in $build-fuzz/artifacts/; replay it with" \
                "$build/tests/fuzz_$t <file>):" >&2
            grep -E "ERROR|SUMMARY|fuzz_$t:|runtime error|run interrupted" "$log" | head -20 >&2 || true
        fi
        grep -E "stat::number_of_executed_units|stat::peak_rss_mb|cov:" "$log" | tail -3 || true
    done
    exit $status
    ;;
*)
    echo "usage: scripts/kiln.sh demo|test|asan|tsan|fuzz|fuzz-ci|valgrind|setup" >&2
    exit 2
    ;;
esac
