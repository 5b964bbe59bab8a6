#!/bin/sh
# check_attr_slots.sh SRC_DIR — fails, listing them, on positional attribute
# reads or writes (x.i[N], x->f[N], ...) anywhere under SRC_DIR except in
# eager/attrs.h, the generated accessors: attributes are read by name
# (the attrs column of optable.def). Run by `meson test` on src/, and on a planted violation
# (tests/data/attr_slots_bad) where it must fail.
set -u
src=${1:?usage: check_attr_slots.sh SRC_DIR}
hits=$(grep -rnE '(\.|->)[[:space:]]*[if][[:space:]]*\[' "$src" \
         --include='*.c' --include='*.h' --include='*.def' --include='*.cpp' |
       grep -v '/eager/attrs\.h:')
if [ -n "$hits" ]; then
    echo "positional attribute slots used outside src/eager/attrs.h (use the named accessors):"
    echo "$hits"
    exit 1
fi
echo "no positional attribute slots outside src/eager/attrs.h"
