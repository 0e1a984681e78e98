#!/bin/bash
# Hostile input at the command line (issue 13): every numeric option of every command states its range in --help
# and refuses what is outside it (no wrap, no clamp, no nan); lists refuse repeats; incompatible flags, a setting
# that could only fail after training, a bad SIMD target and a tampered checkpoint all exit 2 with the field named,
# before any work; stale temporary files of a killed run are removed on the next start.
#
# usage: bash test_hostile_input.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_hostile_input.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/cli_helpers.sh"

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }


# --- 1. every numeric option of every command states a range ----------------------------------------------------
# The subcommands, recursively, from the "Subcommands:" sections of --help.
subcommands() {  # <path words...>
  "$ROTARY" "$@" --help 2>/dev/null | awk '/^Subcommands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}'
}
commands=()
walk() {
  local subs
  subs=$(subcommands "$@")
  if [ -z "$subs" ]; then commands+=("$*"); return; fi
  for s in $subs; do walk "$@" "$s"; done
}
walk
[ ${#commands[@]} -ge 8 ] || fail "found only ${#commands[@]} commands: ${commands[*]}"
unranged=0
for c in "${commands[@]}"; do
  # Option lines: "  --name TYPE[:validator...]  help". A numeric TYPE must carry our range validator.
  while read -r line; do
    fail "rotary $c: numeric option without a stated range: $line"
    unranged=$((unranged + 1))
  done < <("$ROTARY" $c --help 2>/dev/null | grep -E '^ +(-[a-z],)?--[a-z0-9-]+ +(INT|UINT|FLOAT)' |
           grep -vE '(INT|UINT|FLOAT)( ...)?:(finite )?in \[')
done
[ $unranged -eq 0 ] && pass "every numeric option of ${#commands[@]} commands states its range"

# --- 2. numbers are never wrapped, clamped or nan -------------------------------------------------------------
if "$ROTARY" train --help > /dev/null 2>&1; then
  expect_error "a negative seed" 2 "--seed" -- "$ROTARY" train --seed -1 --print-config
  expect_error "a length past 32 bits" 2 "--seq-len" -- "$ROTARY" train --seq-len 4294967298 --print-config
  expect_error "a number past 64 bits" 2 "--steps" -- "$ROTARY" train --steps 99999999999999999999 --print-config
  expect_error "nan" 2 "--lr" -- "$ROTARY" train --lr nan --print-config
  expect_error "inf" 2 "--dropout" -- "$ROTARY" train --dropout 1e999 --print-config
  expect_error "hex" 2 "--batch-size" -- "$ROTARY" train --batch-size 0x10 --print-config
  expect_error "threads beyond the bound" 2 "--threads" -- "$ROTARY" train --threads 100000 --print-config
  if "$ROTARY" train --seq-len 010 --print-config > "$W/cfg.json" 2>&1 && grep -q '"seq_len": 10,' "$W/cfg.json"; then
    pass "a leading zero is decimal, not octal"
  else
    fail "--seq-len 010: $(head -c 300 "$W/cfg.json")"
  fi
  expect_error "lengths past 32 bits" 2 "--lengths = 4294967298" -- \
    "$ROTARY" extrapolate --lengths 1,4294967298 --out "$W/x"
  expect_error "a method twice" 2 "twice" -- "$ROTARY" extrapolate --methods rope,ntk,rope --out "$W/x"
  expect_error "an encoding twice" 2 "twice" -- "$ROTARY" compare --encodings rope,roper,rope --out "$W/c"
  expect_error "a decay distance beyond the bound" 2 "--max-distance" -- \
    "$ROTARY" decay --max-distance 2000000000 --out "$W/d"
  expect_error "a scaling twice" 2 "twice" -- "$ROTARY" decay --scaling ntk,ntk --out "$W/d"
  [ -e "$W/x" ] || [ -e "$W/c" ] || [ -e "$W/d" ] && fail "a refused experiment created its output directory"

  # --- 3. incompatible flags and settings that could only fail later: refused before training -------------------
  TINY=(--task addition --max-digits 2 --d-model 16 --n-layers 1 --n-heads 1 --seq-len 32 --batch-size 4
        --eval-batches 1 --eval-problems 2 --threads 1 --no-progress)
  expect_error "--resume with --overwrite" 2 "--resume excludes --overwrite" -- \
    "$ROTARY" train "${TINY[@]}" --resume --overwrite --out "$W/r"
  expect_error "eval problems longer than learned positions" 2 "eval_problems" -- \
    "$ROTARY" train "${TINY[@]}" --encoding learned --max-seq-len 32 --max-digits 8 --seq-len 16 --steps 2 \
    --out "$W/learned"
  [ -e "$W/learned/checkpoint.pt" ] && fail "the refused run trained and saved a checkpoint"

  # --- 4. a checkpoint changed by one digit is damaged, not resumed; stale temporaries go ------------------------
  if "$ROTARY" train "${TINY[@]}" --steps 4 --eval-interval 2 --out "$W/run" > /dev/null 2>&1; then
    dead=$(sh -c 'echo $$')  # a pid that has exited
    touch "$W/run/checkpoint.pt.tmp.$dead" "$W/run/metrics.csv.tmp.$dead"
    cp "$W/run/checkpoint.pt" "$W/good.pt"
    /usr/bin/python3 - "$W/run/checkpoint.pt" <<'EOF' || fail "could not edit the checkpoint"
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
i = b.find(b'"step":4')
assert i >= 0, "no step in the metadata"
b[i + 7] = ord('2')  # step 4 -> 2: a state the run passed through
open(p, 'wb').write(b)
EOF
    expect_error "a checkpoint with a changed step" 2 "is damaged" -- \
      "$ROTARY" train "${TINY[@]}" --steps 8 --eval-interval 2 --resume --out "$W/run"
    cp "$W/good.pt" "$W/run/checkpoint.pt"
    # Resuming the finished run loads the untouched checkpoint and, at its start, removes the stale files.
    if "$ROTARY" train "${TINY[@]}" --steps 4 --eval-interval 2 --resume --out "$W/run" > "$W/resume.out" 2>&1; then
      pass "the untouched checkpoint resumes"
    else
      fail "the untouched checkpoint does not resume: $(tail -3 "$W/resume.out")"
    fi
    if ls "$W/run" | grep -q '\.tmp\.'; then fail "stale temporary files survived the next start: $(ls "$W/run")"
    else pass "stale temporary files of a dead process removed"; fi
  else
    fail "the tiny run failed"
  fi
fi

# --- 5. a bad SIMD target is refused at load, naming the variable ------------------------------------------------
expect_error "ROTARY_SIMD_TARGET=bogus" 2 "ROTARY_SIMD_TARGET" -- env ROTARY_SIMD_TARGET=bogus "$ROTARY" freqs --head-dim 8
expect_error "a head dim past 32 bits" 2 "--head-dim" -- "$ROTARY" freqs --head-dim 4294967304

if [ $fails -ne 0 ]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "all passed"
