#!/usr/bin/env bash
# fetch_fortunes.sh [DATA_DIR] — puts the plain-text fortune cookie files of
# Debian's fortunes-min and fortunes packages (bookworm: 43 files, about
# 2.5 MB of English text, fortunes separated by lines holding only "%") into
# DATA_DIR/fortunes/ (default DATA_DIR: $KILN_DATA_DIR, else data/ in the
# repository, git-ignored), for examples/charlm.
#
# Only the text files are kept: not the strfile indexes (*.dat) nor the *.u8
# links to the same text. Each package's files come from the installed
# package if there is one; otherwise the package file is fetched with
# `apt-get download` (Debian's own mirrors, no other network) and unpacked with
# `dpkg-deb -x` into a temporary folder: nothing is installed. Idempotent and
# instant when the files are already there (DATA_DIR/fortunes/SOURCES, written
# last, names the package versions they came from).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${KILN_DATA_DIR:-$repo/data}}
dest=$dir/fortunes
packages=(fortunes-min fortunes)
rel=usr/share/games/fortunes

# A usable copy has its SOURCES stamp and the files every version ships.
valid() {
    [ -s "$1/SOURCES" ] && [ -s "$1/fortunes" ] && [ -s "$1/literature" ] && [ -s "$1/riddles" ] &&
        [ -s "$1/computers" ] && [ -s "$1/science" ]
}

if valid "$dest"; then
    exit 0
fi
mkdir -p "$dir"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/out"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
# apt drops root for downloads: let its user write the folder (else a warning).
[ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1 && chown _apt "$tmp"
updated=no
for pkg in "${packages[@]}"; do
    version=$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$pkg" 2>/dev/null || true)
    if [ "${version%% *}" = installed ]; then
        root=/
        echo "$pkg ${version#* } (installed)" >>"$tmp/out/SOURCES"
        files=$(dpkg -L "$pkg" | grep "^/$rel/" || true)
    else
        echo "fetch_fortunes: downloading Debian's $pkg package"
        if ! (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1); then
            # A bare machine may have no package lists yet.
            if [ $updated = no ]; then
                $sudo apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
                updated=yes
            fi
            (cd "$tmp" && apt-get download -q "$pkg" >/dev/null)
        fi
        debs=("$tmp/${pkg}"_*.deb)
        root=$tmp/pkg-$pkg
        dpkg-deb -x "${debs[0]}" "$root"
        echo "$pkg $(dpkg-deb -f "${debs[0]}" Version) (${debs[0]##*/})" >>"$tmp/out/SOURCES"
        files=$(cd "$root" && find "$rel" -mindepth 1 -maxdepth 1 | sed 's|^|/|')
    fi
    for f in $files; do
        src=$root/${f#/}
        name=${f##*/}
        # Text only: no strfile indexes, no links (the *.u8 names of the same files).
        [ -f "$src" ] && [ ! -L "$src" ] && [ "${name%.dat}" = "$name" ] || continue
        cp "$src" "$tmp/out/$name"
    done
done

if ! valid "$tmp/out"; then
    echo "fetch_fortunes: the packages did not yield the expected fortune files" >&2
    exit 1
fi
# Atomic as far as a folder goes: a reader sees the old folder or the new one.
rm -rf "$dest.tmp.$$"
cp -r "$tmp/out" "$dest.tmp.$$"
rm -rf "$dest"
mv "$dest.tmp.$$" "$dest"
echo "fetch_fortunes: $dest ($(ls "$dest" | grep -vc '^SOURCES$') files, $(cat "$dest"/* | wc -c) bytes)"
