#!/bin/bash
# `rotary compare` with 2 encodings x 2 seeds of a tiny run: the table, report.md and its PNG plots; a rerun skips
# the finished runs; a changed setting into the same directory and an unknown encoding are refused.
#
# usage: bash test_compare_tiny.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_compare_tiny.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }
if ! "$ROTARY" compare --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no compare command (built without libtorch)"
  exit 0
fi

TINY=(--task addition --max-digits 2 --d-model 16 --n-layers 1 --n-heads 1 --seq-len 32 --batch-size 4 --steps 20
      --eval-interval 10 --eval-batches 1 --eval-problems 2 --threads 1 --encodings rope,roper --seeds 2)
if "$ROTARY" compare "${TINY[@]}" --out "$W/cmp" > "$W/out" 2> "$W/err"; then
  for enc in rope roper; do
    grep -q "^| $enc | 2 |" "$W/out" || fail "no table row for $enc: $(cat "$W/out")"
    for s in 0 1; do [ -s "$W/cmp/$enc/seed$s/summary.json" ] || fail "no summary for $enc seed $s"; done
  done
  grep -q "report: $W/cmp/report.md" "$W/out" || fail "report path not printed"
  [ -s "$W/cmp/report.md" ] || fail "no report.md"
  if command -v gnuplot > /dev/null; then
    for p in loss eval_loss accuracy; do
      [ "$(head -c 4 "$W/cmp/$p.png" 2> /dev/null | tail -c 3)" = PNG ] || fail "$p.png missing or not a PNG"
      grep -q "($p.png)" "$W/cmp/report.md" || fail "report.md does not show $p.png"
    done
  fi
  echo "ok: compare 2 x 2"
else
  fail "compare exited $?: $(tail -5 "$W/err")"
fi

# One after the other in this process (--jobs 1) gives the same numbers as side by side in `rotary train`
# processes (the default on a machine with 2 cores and --threads 1; forced here with --jobs 2).
"$ROTARY" compare "${TINY[@]}" --jobs 2 --out "$W/cmp_par" > "$W/out_par" 2> "$W/err_par" || fail "compare --jobs 2 exited $?: $(tail -3 "$W/err_par")"
"$ROTARY" compare "${TINY[@]}" --jobs 1 --out "$W/cmp_seq" > "$W/out_seq" 2> "$W/err_seq" || fail "compare --jobs 1 exited $?"
grep -q "2 at a time" "$W/err_par" || fail "--jobs 2 did not run side by side: $(head -3 "$W/err_par")"
[ -s "$W/cmp_par/rope/seed0/train.log" ] || fail "no train.log of a child run"
# (Every column but tokens/s, the 8th field of a row split at '|': timing differs from run to run.)
rows() { grep '^| ro' "$1" | awk -F'|' 'BEGIN { OFS = "|" } { $8 = ""; print }'; }
cmp -s <(rows "$W/out_par") <(rows "$W/out_seq") && echo "ok: --jobs 2 = --jobs 1" ||
  fail "side by side differs from one after the other: $(grep '^| ro' "$W/out_par" "$W/out_seq")"

# Rerun: every run is skipped.
"$ROTARY" compare "${TINY[@]}" --out "$W/cmp" > "$W/out2" 2> "$W/err2" || fail "rerun exited $?"
[ "$(grep -c "finished earlier, skipped" "$W/err2")" = 4 ] && echo "ok: rerun skips finished runs" ||
  fail "rerun did not skip: $(cat "$W/err2")"
cmp -s <(grep '^| rope' "$W/out") <(grep '^| rope' "$W/out2") || fail "rerun table differs"

"$ROTARY" compare "${TINY[@]}" --steps 21 --out "$W/cmp" > /dev/null 2> "$W/err3"
[ $? = 2 ] && grep -q "steps" "$W/err3" && echo "ok: changed settings refused" || fail "changed steps: $(cat "$W/err3")"
"$ROTARY" compare "${TINY[@]}" --encodings rope,rot --out "$W/cmp2" > /dev/null 2> "$W/err4"
[ $? = 2 ] && grep -q "rot" "$W/err4" && [ ! -d "$W/cmp2/rope" ] && echo "ok: unknown encoding refused before any run" ||
  fail "unknown encoding: $(cat "$W/err4")"

"$ROTARY" compare "${TINY[@]}" --target-loss -1 --out "$W/cmp_target" > /dev/null 2> "$W/err_target"
[ $? = 2 ] && grep -q -- "--target-loss: value -1" "$W/err_target" && [ ! -d "$W/cmp_target" ] &&
  echo "ok: a bad --target-loss is refused before any run" || fail "bad --target-loss: $(cat "$W/err_target")"

# SIGTERM to the compare process alone (not its process group): it passes the signal on, every child saves its
# checkpoint and stops, and compare exits 143. (It used to wait on in a restarted waitpid until a child ended on
# its own, and never passed the signal on.)
LONG=("${TINY[@]}" --steps 100000 --eval-interval 0 --checkpoint-interval 100000 --jobs 2)
setsid "$ROTARY" compare "${LONG[@]}" --out "$W/cmp_int" > /dev/null 2> "$W/err_int" &
pid=$!
# Both children must be training (a step in their metrics.csv: their signal handlers are in place) before the
# signal; on a loaded machine "started" alone came too early, and a child killed before it began saved nothing.
for _ in $(seq 300); do
  n=0
  for s in 0 1; do [ "$(cat "$W/cmp_int/rope/seed$s/metrics.csv" 2> /dev/null | wc -l)" -ge 2 ] && n=$((n + 1)); done
  [ "$n" = 2 ] && break
  sleep 0.2
done
kill -TERM "$pid"
for _ in $(seq 150); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
if kill -0 "$pid" 2> /dev/null; then
  fail "compare still running 30 s after SIGTERM"
  pkill -KILL -f "$W/cmp_int"; kill -KILL "$pid"
else
  wait "$pid"
  code=$?
  [ "$code" = 143 ] || fail "SIGTERM: compare exited $code, expected 143: $(tail -3 "$W/err_int")"
  [ -s "$W/cmp_int/rope/seed0/checkpoint.pt" ] && [ -s "$W/cmp_int/rope/seed1/checkpoint.pt" ] &&
    echo "ok: SIGTERM to compare alone stops its children with their checkpoints" ||
    fail "no checkpoints after SIGTERM: $(ls -R "$W/cmp_int" | head)"
  pgrep -f "$W/cmp_int" > /dev/null && fail "training processes left running after SIGTERM"
fi

echo "$fails failed"
[ "$fails" = 0 ]
