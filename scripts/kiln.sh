#!/usr/bin/env bash
# kiln.sh — one entry point for a fresh Debian 12 machine (run as root):
#   scripts/kiln.sh demo    install what is missing, build, train the digits MLP,
#                           then a short kiln-bench summary
#   scripts/kiln.sh test    install what is missing, build, run every suite
#   scripts/kiln.sh asan    the suites again under AddressSanitizer + UBSan
#   scripts/kiln.sh setup   only install and build
# Set KILN_BUILD to choose the build folder (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD:-build}

# Debian packages the build, the tests and the later layers need.
packages=(gcc g++ pkg-config meson ninja-build libcmocka-dev libopenblas-dev libdlpack-dev llvm-16-dev clang-16 zlib1g-dev)

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
    meson test -C "$build" -v --num-processes 1
    ;;
asan)
    configure "$build-asan" -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false
    bash scripts/fetch_digits.sh || echo "kiln: digits data unavailable; the digits test will be skipped"
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        meson test -C "$build-asan" -v --num-processes 1 --timeout-multiplier 4
    ;;
*)
    echo "usage: scripts/kiln.sh demo|test|asan|setup" >&2
    exit 2
    ;;
esac
