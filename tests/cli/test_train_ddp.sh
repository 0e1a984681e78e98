#!/bin/bash
# Data-parallel training: `rotary train --nproc 2` (two processes, torch c10d / Gloo over a FileStore) must follow
# the single-process loss curve for the same global batch.
#
# Both runs see the same rows (every rank draws the whole global batch from the same data RNG and keeps its
# half) and the same parameters, so only the float32 summation order differs: one process sums the loss and the
# gradients over 8 rows at once, two processes sum 4 + 4 rows and add the halves in the all-reduce. That is
# ~1e-7 relative per step; AdamW divides by sqrt(v), which can amplify it in the first steps, so we allow 1e-4
# relative on every step's loss. A bug in the data split (ranks training on the same rows, or on rows the single
# process never sees) or in the averaging (gradients summed over ranks twice, or not at all) moves the loss by
# percents within a few steps.
#
# usage: bash test_train_ddp.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_train_ddp.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }
if ! "$ROTARY" train --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no train command (built without libtorch)"
  exit 0
fi

RUN=(--task addition --max-digits 2 --d-model 16 --n-layers 1 --n-heads 1 --seq-len 32 --batch-size 8 --steps 30
     --lr 3e-3 --warmup 5 --eval-interval 15 --eval-batches 1 --eval-problems 2 --threads 1 --no-progress)
"$ROTARY" train "${RUN[@]}" --out "$W/single" > /dev/null 2> "$W/single.err" || fail "single process: $(tail -3 "$W/single.err")"
"$ROTARY" train "${RUN[@]}" --nproc 2 --out "$W/ddp" > "$W/ddp.out" 2> "$W/ddp.err" || fail "--nproc 2: $(tail -5 "$W/ddp.err")"

/usr/bin/python3 - "$W/single/metrics.jsonl" "$W/ddp/metrics.jsonl" <<'PY' || fail "loss curves differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 30, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    rel = abs(x["loss"] - y["loss"]) / abs(x["loss"])
    worst = max(worst, rel)
    assert rel <= 1e-4, f'step {x["step"]}: loss {x["loss"]} single vs {y["loss"]} with 2 processes'
    if "eval_loss" in x:
        assert abs(x["eval_loss"] - y["eval_loss"]) <= 1e-4 * abs(x["eval_loss"]), (x, y)
assert a[-1]["loss"] < a[0]["loss"], "no learning: the comparison would be vacuous"
print(f"ok: 30 steps, largest relative loss difference {worst:.2e}")
PY
# Rank 0 alone reports; the store file is cleaned up; a batch that does not split evenly is refused.
[ "$(grep -c "finished 30 steps" "$W/ddp.out")" = 1 ] || fail "expected one report from rank 0: $(cat "$W/ddp.out")"
ls -a "$W/ddp" | grep -q ddp_store && fail "the FileStore file was left behind"
"$ROTARY" train "${RUN[@]}" --batch-size 7 --nproc 2 --out "$W/odd" > /dev/null 2> "$W/odd.err"
[ $? = 2 ] && grep -q "batch_size = 7" "$W/odd.err" && echo "ok: odd batch refused" || fail "odd batch: $(cat "$W/odd.err")"

echo "$fails failed"
[ "$fails" = 0 ]
