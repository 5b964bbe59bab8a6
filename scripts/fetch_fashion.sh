#!/usr/bin/env bash
# fetch_fashion.sh [DATA_DIR] — puts Fashion-MNIST's four IDX files
# (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
# t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz: 60,000 train and
# 10,000 test 28x28 greyscale images with labels 0..9) into DATA_DIR/fashion
# (DATA_DIR default: $KILN_DATA_DIR, else data/ in the repository, git-ignored).
#
# The files ship in Debian's dataset-fashion-mnist package (bookworm). Taken
# from the installed package if there is one; otherwise the package file is
# fetched with `apt-get download` (Debian's own mirrors, no other network) and
# unpacked with `dpkg-deb -x` into a temporary folder: nothing is installed.
# Idempotent and instant when the files are already there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${KILN_DATA_DIR:-$repo/data}}/fashion
rel=usr/share/datasets/fashion-mnist
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

# A usable copy is a gzip file whose header is the IDX magic and item count
# expected for its name (the reader checks the rest).
valid() {
    local f=$1 want
    case ${f##*/} in
        train-images*) want="00000803 0000ea60" ;;
        train-labels*) want="00000801 0000ea60" ;;
        t10k-images*) want="00000803 00002710" ;;
        t10k-labels*) want="00000801 00002710" ;;
    esac
    [ -s "$f" ] && gzip -t "$f" 2>/dev/null &&
        [ "$(gzip -dc "$f" | head -c 8 | od -An -tx1 | tr -d ' \n' | sed 's/^\(.\{8\}\)/\1 /')" = "$want" ]
}

all_valid() {
    for f in "${files[@]}"; do valid "$1/$f" || return 1; done
}

if all_valid "$dir"; then
    exit 0
fi
mkdir -p "$dir"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if all_valid "/$rel"; then
    src=/$rel
else
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    # apt drops root for downloads: let its user write the folder (else a warning).
    [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1 && chown _apt "$tmp"
    echo "fetch_fashion: downloading Debian's dataset-fashion-mnist package (31 MB)"
    if ! (cd "$tmp" && apt-get download -q dataset-fashion-mnist >/dev/null 2>&1); then
        # A bare machine may have no package lists yet.
        $sudo apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
        (cd "$tmp" && apt-get download -q dataset-fashion-mnist >/dev/null)
    fi
    debs=("$tmp"/dataset-fashion-mnist_*.deb)
    dpkg-deb -x "${debs[0]}" "$tmp/pkg"
    src=$tmp/pkg/$rel
fi

for f in "${files[@]}"; do
    if ! valid "$src/$f"; then
        echo "fetch_fashion: $src/$f is missing or not a gzip'd IDX file of the expected kind and count" >&2
        exit 1
    fi
done
# Each file atomically: a concurrent reader sees the old state or the whole file.
for f in "${files[@]}"; do
    cp "$src/$f" "$dir/$f.tmp.$$"
    mv -f "$dir/$f.tmp.$$" "$dir/$f"
done
echo "fetch_fashion: $dir"
