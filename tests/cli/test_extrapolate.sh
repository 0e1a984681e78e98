#!/bin/bash
# `rotary extrapolate` end to end on tiny models (text at L = 24 tested at 24 and 48, kv_retrieval, a 2-window
# sweep): the seed-shaped table, report.md with its PNGs, results.csv; a rerun reuses every model and cell; bad
# input exits 2 naming the field. `rotary decay`: the bound's CSV and PNG, and the measurement on the tiny model.
#
# usage: bash test_extrapolate.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_extrapolate.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }
if ! "$ROTARY" extrapolate --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no extrapolate command (built without libtorch)"
  exit 0
fi

# The bound needs no corpus.
if "$ROTARY" decay --head-dim 4 --max-distance 50 --out "$W/decay" > "$W/dout" 2> "$W/derr"; then
  # B(d) = (1 + 2 |cos(0.495 d)|) / 2 for head dim 4, base 10000 (docs/decay.md).
  awk -F, 'NR > 1 { want = (1 + 2 * sqrt(cos(0.495 * $1)^2)) / 2; if ((($2 - want)^2) > 1e-14) bad++ }
           END { exit bad > 0 || NR != 52 }' "$W/decay/decay_bound.csv" && echo "ok: decay bound CSV" ||
    fail "decay_bound.csv: $(head -3 "$W/decay/decay_bound.csv")"
  if command -v gnuplot > /dev/null; then
    [ "$(head -c 4 "$W/decay/decay_bound.png" | tail -c 3)" = PNG ] || fail "decay_bound.png missing"
  fi
else
  fail "decay exited $?: $(tail -3 "$W/derr")"
fi
"$ROTARY" decay --scaling ntk,bogus --out "$W/decay2" > /dev/null 2> "$W/derr2"
[ $? = 2 ] && grep -q "bogus" "$W/derr2" && echo "ok: unknown scaling refused" || fail "bad scaling: $(cat "$W/derr2")"

if ! command -v bible > /dev/null; then
  echo "SKIP: the KJV text needs bible-kjv (Debian); extrapolate not run"
  echo "$fails failed"
  [ "$fails" = 0 ]
  exit
fi

TINY=(--cache-dir "$W/cache" --text-vocab 128 --kv-pairs 1 --d-model 32 --n-layers 1 --n-heads 2 --seq-len 24
      --batch-size 4 --steps 6 --eval-interval 0 --eval-batches 1 --eval-problems 2 --threads 1 --lengths 1,2
      --methods rope,ntk,dynamic,rerope --window 8 --sweep 4,24 --windows 2 --retrieval --problems 2 --out "$W/x")
if "$ROTARY" extrapolate "${TINY[@]}" > "$W/out" 2> "$W/err"; then
  grep -q "^| method | 24 (train) | 48 (repeated) | 48 (non-repeated) | 48 kv retrieval |" "$W/out" ||
    fail "no seed-shaped table header: $(head -3 "$W/out")"
  for row in "RoPE" "RoPE-log n†" "NTK-fixed" "NTK-dynamic-log n†" "ReRoPE-w8" "ReRoPE-w8-log n†"; do
    grep -q "^| $row | [0-9.]*% | [0-9.]*% | [0-9.]*% | [0-9.]*% |$" "$W/out" || fail "no row '$row': $(cat "$W/out")"
  done
  [ -s "$W/x/report.md" ] && [ -s "$W/x/results.csv" ] || fail "no report.md / results.csv"
  # 4 methods x 2 log-n x 2 lengths x (text, repeated, retrieval) + sweep 2 windows x 2 log-n x 2 lengths x 2.
  [ "$(tail -n +2 "$W/x/results.csv" | wc -l)" = 64 ] || fail "results.csv rows: $(wc -l < "$W/x/results.csv")"
  grep -q "^| 24 (= L) |" "$W/x/report.md" || fail "no w = L row in the sweep table"
  if command -v gnuplot > /dev/null; then
    for p in loss_vs_position loss_vs_length accuracy_vs_length repeated_vs_length retrieval_vs_length window_sweep; do
      [ "$(head -c 4 "$W/x/$p.png" 2> /dev/null | tail -c 3)" = PNG ] || fail "$p.png missing or not a PNG"
      grep -q "($p.png)" "$W/x/report.md" || fail "report.md does not show $p.png"
    done
  fi
  echo "ok: extrapolate tiny run"
else
  fail "extrapolate exited $?: $(tail -5 "$W/err")"
fi

# Rerun: both models and every cell are reused, the table is the same.
"$ROTARY" extrapolate "${TINY[@]}" > "$W/out2" 2> "$W/err2" || fail "rerun exited $?: $(tail -3 "$W/err2")"
[ "$(grep -c "finished earlier (.*), reused" "$W/err2")" = 2 ] && [ "$(grep -c ": done earlier$" "$W/err2")" = 64 ] &&
  echo "ok: rerun reuses models and cells" || fail "rerun recomputed: $(head -5 "$W/err2")"
cmp -s <(sed '$d' "$W/out") <(sed '$d' "$W/out2") || fail "rerun table differs"

# The trained model's decay.
"$ROTARY" decay --checkpoint "$W/x/text_model" --windows 2 --samples 64 --out "$W/dm" > "$W/dmout" 2> "$W/dmerr" &&
  [ -s "$W/dm/decay_model.csv" ] && grep -q "^distance,bound,bound_relative,abs_score" "$W/dm/decay_model.csv" &&
  echo "ok: decay measured on the text model" || fail "decay --checkpoint: $(tail -3 "$W/dmerr")"

# Bad input: exit 2 and a message naming the field.
expect_error() {  # <what grep must find> <extra flags...>
  local want=$1; shift
  "$ROTARY" extrapolate "${TINY[@]}" --out "$W/bad" "$@" > /dev/null 2> "$W/berr"
  local code=$?
  [ $code = 2 ] && grep -q -- "$want" "$W/berr" && echo "ok: refused $*" || fail "$* gave $code: $(cat "$W/berr")"
}
expect_error "methods = rerope2 is invalid; allowed: rope, pi, ntk" --methods rope,rerope2
expect_error "window = 25 is invalid" --window 25
expect_error "lengths = 0 is invalid" --lengths 0,2
expect_error "encoding.kind = roper is invalid" --encoding roper
expect_error "logn-variants = sometimes" --logn-variants sometimes
[ ! -d "$W/bad/text_model" ] || fail "a refused run started training"

echo "$fails failed"
[ "$fails" = 0 ]
