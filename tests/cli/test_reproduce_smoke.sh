#!/bin/bash
# `rotary reproduce --scale smoke`: every study end to end with tiny models - report.md with a row per claim,
# claims.json with an allowed verdict for each, every study's directory - then the same command again reuses
# everything (nothing retrained, the same claims), and bad input is refused naming the flag.
#
# usage: bash test_reproduce_smoke.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_reproduce_smoke.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "$0")/cli_helpers.sh"

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }
if ! "$ROTARY" reproduce --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no reproduce command (built without libtorch)"
  exit 0
fi
if ! command -v bible > /dev/null; then
  echo "SKIP: the text studies need \`bible\` (bible-kjv)"
  exit 0
fi

start=$(date +%s)
if "$ROTARY" reproduce --scale smoke --out "$W/r" --cache-dir "$W/cache" > "$W/out" 2> "$W/err"; then
  first=$(( $(date +%s) - start ))
  [ -s "$W/r/report.md" ] || fail "no report.md"
  grep -q "^| seed | claim | the seed | ours | verdict |" "$W/r/report.md" || fail "report.md has no claims table"
  /usr/bin/python3 - "$W/r/claims.json" <<'PY' || fail "claims.json: see above"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["scale"] == "smoke", d["scale"]
claims = d["claims"]
allowed = {"reproduced", "same ordering, within noise", "not reproduced", "not measured"}
assert len(claims) >= 20, len(claims)
for c in claims:
    assert c["verdict"] in allowed, c
    assert c["claim"] and c["theirs"], c
seeds = {c["seed"] for c in claims}
assert seeds == {"000", "001", "002", "003", "004"}, seeds
# At smoke scale every study runs, so every claim is measured except where the build cannot (no torch baseline).
unmeasured = [c for c in claims if c["verdict"] == "not measured"]
assert not unmeasured, unmeasured
PY
  for s in seed000_addition seed000_substring_index seed000_substring_search seed002_text seed002_performer; do
    [ -s "$W/r/$s/report.md" ] || fail "no compare report for $s"
  done
  [ -s "$W/r/seed002_runtime/rope_cost.json" ] || fail "no rope-cost output"
  [ -s "$W/r/seed004_extrapolate/report.md" ] || fail "no extrapolation report"
  [ -s "$W/r/seed001_memory/report.md" ] || fail "no memory report"
  [ -s "$W/r/seed003_decay/decay_model.csv" ] || fail "no measured decay"
  pass "reproduce --scale smoke (${first} s)"

  cp "$W/r/claims.json" "$W/claims_first.json"
  if "$ROTARY" reproduce --scale smoke --out "$W/r" --cache-dir "$W/cache" > "$W/out2" 2> "$W/err2"; then
    grep -q "finished earlier, skipped" "$W/err2" || fail "the rerun did not reuse the finished runs"
    grep -q "reproduce: rotary bench" "$W/err2" && fail "the rerun ran a benchmark again"
    cmp -s "$W/claims_first.json" "$W/r/claims.json" || fail "the rerun's claims differ: $(diff "$W/claims_first.json" "$W/r/claims.json" | head -5)"
    pass "a rerun reuses every study"
  else
    fail "rerun exited $?: $(tail -5 "$W/err2")"
  fi
else
  fail "reproduce exited $?: $(tail -20 "$W/err")"
fi

expect_error "unknown scale" 2 "scale" -- "$ROTARY" reproduce --scale huge --out "$W/bad"
expect_error "unknown study" 2 "seed005_unknown" -- "$ROTARY" reproduce --studies seed005_unknown --out "$W/bad"
expect_error "empty --studies" 2 '--studies = "" is invalid' -- "$ROTARY" reproduce --studies "" --out "$W/bad"
[ -e "$W/bad" ] && fail "a refused reproduce created its output directory"

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all reproduce smoke checks passed"
