#!/usr/bin/env bash
# fetch_digits.sh [DATA_DIR] — puts digits.csv.gz (the UCI optical handwritten
# digits: 1,797 8x8 images, 64 features 0..16 and a label per line) into
# DATA_DIR (default: $KILN_DATA_DIR, else data/ in the repository, git-ignored).
#
# The file ships in Debian's python3-sklearn package. Taken from the installed
# package if there is one; otherwise the package file is fetched with
# `apt-get download` (Debian's own mirrors, no other network) and unpacked with
# `dpkg-deb -x` into a temporary folder: nothing is installed. Idempotent and
# instant when the file is already there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${KILN_DATA_DIR:-$repo/data}}
dest=$dir/digits.csv.gz
rel=usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz

# A usable copy is a gzip file of 1,797 non-empty lines.
valid() {
    [ -s "$1" ] && gzip -t "$1" 2>/dev/null && [ "$(gzip -dc "$1" | grep -c .)" -eq 1797 ]
}

if valid "$dest"; then
    exit 0
fi
mkdir -p "$dir"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -f "/$rel" ]; then
    cp "/$rel" "$tmp/digits.csv.gz"
else
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    # apt drops root for downloads: let its user write the folder (else a warning).
    [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1 && chown _apt "$tmp"
    echo "fetch_digits: downloading Debian's python3-sklearn package for digits.csv.gz"
    if ! (cd "$tmp" && apt-get download -q python3-sklearn >/dev/null 2>&1); then
        # A bare machine may have no package lists yet.
        $sudo apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
        (cd "$tmp" && apt-get download -q python3-sklearn >/dev/null)
    fi
    debs=("$tmp"/python3-sklearn_*.deb)
    dpkg-deb -x "${debs[0]}" "$tmp/pkg"
    found=$(find "$tmp/pkg" -path '*/sklearn/datasets/data/digits.csv.gz' -print -quit)
    if [ -z "$found" ]; then
        echo "fetch_digits: ${debs[0]##*/} has no sklearn/datasets/data/digits.csv.gz" >&2
        exit 1
    fi
    cp "$found" "$tmp/digits.csv.gz"
fi

if ! valid "$tmp/digits.csv.gz"; then
    echo "fetch_digits: digits.csv.gz is not a gzip file of 1797 lines" >&2
    exit 1
fi
# Atomic: a concurrent reader sees the old state or the whole file.
cp "$tmp/digits.csv.gz" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "fetch_digits: $dest"
