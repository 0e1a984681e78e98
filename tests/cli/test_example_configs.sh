#!/bin/bash
# The run descriptions in examples/runs/*.toml load: `rotary train --config F --print-config` accepts each, and
# every key the file sets shows up with the file's value in the resolved JSON (compared with Python's own TOML
# reader, tomllib, which shares nothing with ours). A flag given after --config overrides the file.
#
# usage: bash test_example_configs.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_example_configs.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_example_configs.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

if ! "$ROTARY" train --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no train command (built without libtorch)"
  exit 0
fi

n=0
for f in "$SRC"/examples/runs/*.toml; do
  n=$((n + 1))
  if ! "$ROTARY" train --config "$f" --print-config > "$W/resolved.json" 2> "$W/err"; then
    fail "$(basename "$f"): $(cat "$W/err")"
    continue
  fi
  if /usr/bin/python3 - "$f" "$W/resolved.json" > "$W/diff" 2>&1 <<'PY'; then
import json, sys, tomllib
want = tomllib.load(open(sys.argv[1], "rb"))
got = json.load(open(sys.argv[2]))
def walk(w, g, path):
    for k, v in w.items():
        if k not in g:
            print(f"{path}{k}: missing from the resolved config"); continue
        if isinstance(v, dict):
            walk(v, g[k], f"{path}{k}.")
        elif g[k] != v:
            print(f"{path}{k}: file {v!r}, resolved {g[k]!r}")
walk(want, got, "")
PY
    [ -s "$W/diff" ] && fail "$(basename "$f"): $(cat "$W/diff")" || echo "ok: $(basename "$f")"
  else
    fail "$(basename "$f"): the comparison failed: $(cat "$W/diff")"
  fi
done
[ "$n" -gt 0 ] || fail "no examples/runs/*.toml"

# Flags override the file.
f=$(ls "$SRC"/examples/runs/*.toml | head -1)
"$ROTARY" train --config "$f" --steps 7 --d-model 256 --print-config > "$W/over.json" 2> "$W/err" || fail "override: $(cat "$W/err")"
grep -q '"steps": 7,' "$W/over.json" && grep -q '"d_model": 256,' "$W/over.json" && echo "ok: flags override the file" ||
  fail "flags did not override the file"
# A bad value in the resolved settings is refused before anything runs.
"$ROTARY" train --config "$f" --d-model 30 --n-heads 7 --print-config > /dev/null 2> "$W/err"
[ $? = 2 ] && grep -q "n_heads" "$W/err" && echo "ok: invalid resolved settings exit 2" || fail "bad settings: $(cat "$W/err")"

echo "$fails failed"
[ "$fails" = 0 ]
