#!/bin/bash
# `rotary train`, `eval` and `generate` end to end with a tiny model (seconds): the files a run leaves, the
# round trip train -> eval -> generate, Ctrl-C + --resume giving the same loss curve as an uninterrupted run,
# a non-finite loss stopping the run (exit 3), and bad flags / files / resumes exiting 2 with a message that
# names the problem.
#
# usage: bash test_train_cli.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_train_cli.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/cli_helpers.sh"

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }
if ! "$ROTARY" train --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no train command (built without libtorch)"
  exit 0
fi

TINY_SHOWN=(--task addition --max-digits 2 --d-model 16 --n-layers 1 --n-heads 1 --seq-len 32 --batch-size 4
            --eval-batches 1 --eval-problems 2 --threads 1)
TINY=("${TINY_SHOWN[@]}" --no-progress)


# --- 1. a run and its files ------------------------------------------------------------------------------------
if "$ROTARY" train "${TINY_SHOWN[@]}" --steps 10 --eval-interval 5 --out "$W/run" > "$W/train.out" 2> "$W/train.err"; then
  for f in config.json metrics.csv metrics.jsonl checkpoint.pt summary.json; do
    [ -s "$W/run/$f" ] || fail "train left no $f"
  done
  [ "$(wc -l < "$W/run/metrics.jsonl")" = 10 ] || fail "metrics.jsonl has $(wc -l < "$W/run/metrics.jsonl") rows, expected 10"
  [ "$(wc -l < "$W/run/metrics.csv")" = 11 ] || fail "metrics.csv is not header + 10 rows"
  head -1 "$W/run/metrics.csv" | grep -q '^step,loss,lr,tokens_per_s,grad_norm,eval_loss,eval_accuracy' ||
    fail "metrics.csv header: $(head -1 "$W/run/metrics.csv")"
  sed -n 5p "$W/run/metrics.jsonl" | grep -q '"eval_loss"' || fail "no evaluation at step 5"
  grep -q '"eval_loss"' <(sed -n 4p "$W/run/metrics.jsonl") && fail "an evaluation at step 4"
  head -c 8 "$W/run/checkpoint.pt" | grep -q ROTARYCK || fail "checkpoint has no ROTARYCK header"
  grep -q "finished 10 steps" "$W/train.out" || fail "train did not report: $(cat "$W/train.out")"
  grep -q "step 10/10" "$W/train.err" || fail "no progress lines on stderr (not a TTY): $(head -c 300 "$W/train.err")"
  pass "train writes config, metrics, checkpoint, summary"
else
  fail "train exited $?: $(tail -5 "$W/train.err")"
fi

# --- 2. eval and generate from the checkpoint ------------------------------------------------------------------
if "$ROTARY" eval "$W/run" --problems 3 --json > "$W/eval.json" 2> "$W/eval.err"; then
  /usr/bin/python3 - "$W/eval.json" "$W/run/eval/loss_by_position.csv" <<'PY' || fail "eval output"
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["step"] == 10 and j["problems"] == 3, j
assert math.isfinite(j["heldout_loss"]) and 0 < j["heldout_loss"] < 10, j
assert 0 <= j["accuracy_greedy"] <= 1 and 0 <= j["accuracy_sampled"] <= 1, j
rows = open(sys.argv[2]).read().splitlines()
assert rows[0] == "position,loss,weight" and len(rows) == 33, rows[:3]
PY
  pass "eval --json and loss_by_position.csv"
else
  fail "eval exited $?: $(tail -3 "$W/eval.err")"
fi
"$ROTARY" eval "$W/run" --problems 1 --kind rerope --window 8 --seq-len 64 --out "$W/eval_rerope" > "$W/e2.out" 2>&1 &&
  grep -q "encoding rerope" "$W/e2.out" && [ "$(wc -l < "$W/eval_rerope/loss_by_position.csv")" = 65 ] &&
  pass "eval with an inference override at twice the training length" || fail "eval --kind rerope: $(tail -3 "$W/e2.out")"
expect_error "eval: an override of another family" 2 "override.kind" -- "$ROTARY" eval "$W/run" --kind alibi
if out=$("$ROTARY" generate "$W/run" --prompt "?d=12+34;" --max-new 12 2> "$W/gen.err"); then
  case "$out" in "?d=12+34;"?*) pass "generate continues the prompt" ;; *) fail "generate printed '$out'" ;; esac
else
  fail "generate exited $?: $(cat "$W/gen.err")"
fi
expect_error "generate: a character outside the vocabulary" 2 "rotary:" -- "$ROTARY" generate "$W/run" --prompt "Hello"
expect_error "eval: no checkpoint" 2 "no checkpoint" -- "$ROTARY" eval "$W/nothing"

# --- a curriculum stage: --init-from another run (the run's config keeps the path); another shape is refused -----
if "$ROTARY" train "${TINY[@]}" --steps 2 --seed 9 --init-from "$W/run" --out "$W/stage2" > /dev/null 2> "$W/stage2.err"; then
  grep -q "\"init_from\": \"$W/run\"" "$W/stage2/config.json" && pass "train --init-from starts a run from another" ||
    fail "--init-from not in config.json: $(grep init "$W/stage2/config.json")"
else
  fail "train --init-from exited $?: $(tail -3 "$W/stage2.err")"
fi
expect_error "train --init-from a model of another shape" 2 "init_from" -- \
  "$ROTARY" train "${TINY[@]}" --steps 2 --d-model 32 --init-from "$W/run" --out "$W/stage_wide"

# --- 3. bad settings -------------------------------------------------------------------------------------------
expect_error "unknown encoding lists the kinds" 2 "roper" -- "$ROTARY" train "${TINY[@]}" --encoding ropex --out "$W/x"
expect_error "unknown task lists the tasks" 2 "substring_index" -- "$ROTARY" train "${TINY[@]}" --task multiply --out "$W/x"
expect_error "bad number" 2 "--lr" -- "$ROTARY" train "${TINY[@]}" --lr fast --out "$W/x"
expect_error "unknown flag" 2 "--bogus" -- "$ROTARY" train "${TINY[@]}" --bogus --out "$W/x"
expect_error "out-of-range value" 2 "--beta2: value 1.5 is not a finite number in [0, 1]" -- "$ROTARY" train "${TINY[@]}" --beta2 1.5 --out "$W/x"
printf '[optim]\nlearning_rate = 0.1\n' > "$W/bad.toml"
expect_error "unknown field in the TOML file" 2 "optim.learning_rate" -- "$ROTARY" train --config "$W/bad.toml" --out "$W/x"
printf 'steps = 4\n[model]\nd_model = 16\nn_heads = 1\nn_layers = 1\n[task_options]\nmax_digits = 2\n' > "$W/good.toml"
"$ROTARY" train --config "$W/good.toml" --seq-len 16 --batch-size 2 --eval-problems 0 --eval-batches 1 --threads 1 \
  --no-progress --out "$W/toml" > /dev/null 2>&1 && grep -q '"steps": 4' "$W/toml/config.json" &&
  grep -q '"seq_len": 16' "$W/toml/config.json" && pass "TOML file + flags" || fail "train --config good.toml"
[ -d "$W/x" ] && fail "a rejected run created its directory"
expect_error "a fresh run into a used directory" 2 "--resume" -- "$ROTARY" train "${TINY[@]}" --steps 10 --out "$W/run"
expect_error "resume with a changed setting names it" 2 "optim.lr" -- "$ROTARY" train --resume --lr 0.5 --out "$W/run" --no-progress
expect_error "resume without a checkpoint" 2 "nothing to resume" -- "$ROTARY" train --resume --out "$W/none"

# --- 4. non-finite loss -----------------------------------------------------------------------------------------
expect_error "non-finite loss stops with exit 3" 3 "non-finite" -- "$ROTARY" train "${TINY[@]}" --steps 10 --lr 1e30 \
  --warmup 0 --grad-clip 0 --checkpoint-interval 1 --out "$W/nan"
grep -q '"status": "non_finite"' "$W/nan/summary.json" 2> /dev/null || fail "no non_finite summary"

# --- 5. Ctrl-C, then --resume: the same curve as without the interruption --------------------------------------------
LONG=("${TINY[@]}" --steps 3000 --eval-interval 0 --eval-problems 0 --checkpoint-interval 1000)
"$ROTARY" train "${LONG[@]}" --out "$W/full" > /dev/null 2>&1 || fail "uninterrupted long run"
"$ROTARY" train "${LONG[@]}" --out "$W/cut" > /dev/null 2> "$W/cut.err" &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$W/cut/metrics.jsonl" ] && [ "$(wc -l < "$W/cut/metrics.jsonl")" -ge 50 ] && break
  sleep 0.02
done
kill -INT $pid
wait $pid
code=$?
rows=$(wc -l < "$W/cut/metrics.jsonl")
if [ "$code" != 130 ]; then
  fail "SIGINT: exit $code, expected 130 ($(tail -2 "$W/cut.err"))"
elif [ "$rows" -ge 3000 ]; then
  fail "SIGINT arrived after the run finished (test too slow to interrupt it)"
else
  grep -q -- "--resume" "$W/cut.err" || fail "interrupt message does not mention --resume: $(cat "$W/cut.err")"
  "$ROTARY" train --resume --out "$W/cut" --no-progress > /dev/null 2> "$W/resume.err" || fail "resume: $(tail -3 "$W/resume.err")"
  /usr/bin/python3 - "$W/full/metrics.jsonl" "$W/cut/metrics.jsonl" "$rows" <<'PY' && pass "SIGINT at step $rows + --resume = uninterrupted run (bitwise)" || fail "resumed curve differs"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 3000, (len(a), len(b))
bad = [i + 1 for i in range(len(a)) if a[i] != b[i]]
assert not bad, f"steps {bad[:5]} differ: {a[bad[0]-1]} vs {b[bad[0]-1]}"
PY
fi

echo "$fails failed"
[ "$fails" = 0 ]
