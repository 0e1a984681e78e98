#!/bin/bash
# runs without libtorch
# docs/README.md is the index of the documentation: every page and figure in docs/ must be named there, and every
# page it links must exist, so that a new page cannot go unlisted and a renamed one cannot leave a dead link.
#
# usage: bash test_docs_index.sh <rotary binary (unused)> <source dir>
set -u
SRC=${2:?usage: test_docs_index.sh <rotary binary> <source dir>}
INDEX="$SRC/docs/README.md"
fails=0
[ -f "$INDEX" ] || { echo "FAIL: $INDEX is missing"; exit 1; }
checked=0
for f in "$SRC"/docs/*.md "$SRC"/docs/*.png; do
  name=$(basename "$f")
  [ "$name" = README.md ] && continue
  checked=$((checked + 1))
  grep -qF "$name" "$INDEX" || { echo "FAIL: docs/$name is not in docs/README.md"; fails=$((fails + 1)); }
done
for link in $(grep -oE '\]\([^)]+\)' "$INDEX" | sed 's/^](//; s/)$//'); do
  [ -f "$SRC/docs/$link" ] || { echo "FAIL: docs/README.md links $link, which does not exist"; fails=$((fails + 1)); }
done
[ "$checked" -gt 0 ] || { echo "FAIL: no pages found in $SRC/docs"; exit 1; }
echo "$checked pages and figures checked, $fails failure(s)"
[ "$fails" -eq 0 ]
