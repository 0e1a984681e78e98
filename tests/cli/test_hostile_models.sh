#!/bin/bash
# Hostile model directories and outputs against `rotary perplexity`, `generate`, `freqs` and `compare` (issue 25):
# products of user numbers that overflow, FIFOs and directories where files belong, changed weights, non-finite
# losses, a tokenizer that covers fewer ids than the embedding, and two commands on one output directory. Every
# bad input exits 2 naming what is wrong; nothing hangs (each command runs under `timeout`: 124 = it hung).
#
# usage: bash test_hostile_models.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_hostile_models.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_hostile_models.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"
if ! "$ROTARY" perplexity --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no perplexity command (built without libtorch)"
  exit 0
fi
T="timeout 60"

# A scratch copy of a fixture checkpoint: scratch <family> <name> [python statements editing the dict `c`].
scratch() {
  cp -r "$FIX/$1" "$W/$2"
  if [ $# -gt 2 ]; then
    /usr/bin/python3 - "$W/$2/config.json" "$3" <<'PY'
import json, sys
path, edit = sys.argv[1], sys.argv[2]
c = json.load(open(path))
exec(edit)
json.dump(c, open(path, "w"))
PY
  fi
}
/usr/bin/python3 -c "import random; random.seed(1); print(' '.join(str(random.randrange(64)) for _ in range(200)))" > "$W/ids.txt"

# ---- Sizes: windows x (longest + 1) overflows int64 (was SIGSEGV: the copy read outside the stream), and the
# default lengths L, 2L, 4L from a config whose L is 2^53 (was exit 71 after an overflowed bound passed). The
# stream holds 3000 tokens, more than the wrapped products (2048 and 512), which therefore passed the bound.
/usr/bin/python3 -c "import random; random.seed(2); print(' '.join(str(random.randrange(64)) for _ in range(3000)))" > "$W/ids3k.txt"
expect_error "perplexity: windows x (longest + 1) past 2^63" 2 "windows x (longest length + 1) = 2048 x" -- \
  $T "$ROTARY" perplexity "$FIX/gpt_neox" --tokens "$W/ids3k.txt" --train-len 16 --lengths 64,8796093022208k \
  --windows 2048 --out "$W/ovf" --no-progress
scratch gpt_neox neox_long 'c["max_position_embeddings"] = 2**53'
expect_error "perplexity: default lengths past 2^53" 2 "lengths = 18014398509481984 is invalid" -- \
  $T "$ROTARY" perplexity "$W/neox_long" --tokens "$W/ids3k.txt" --windows 512 --out "$W/ovf2" --no-progress

# ---- Files that are not regular files: refused by name, never a blocking open.
expect_error "perplexity: --tokens DIR" 2 "token id file = $W (a directory)" -- \
  $T "$ROTARY" perplexity "$FIX/gpt_neox" --tokens "$W" --train-len 16 --lengths 16 --out "$W/d" --no-progress
mkfifo "$W/ids.fifo"
expect_error "perplexity: --tokens FIFO" 2 "ids.fifo (a FIFO)" -- \
  $T "$ROTARY" perplexity "$FIX/gpt_neox" --tokens "$W/ids.fifo" --train-len 16 --lengths 16 --out "$W/d" --no-progress
scratch mistral fifo_config
rm "$W/fifo_config/config.json" && mkfifo "$W/fifo_config/config.json"
expect_error "perplexity: config.json a FIFO" 2 "config.json (a FIFO)" -- \
  $T "$ROTARY" perplexity "$W/fifo_config" --tokens "$W/ids.txt" --out "$W/d" --no-progress
expect_error "freqs --hf-config FIFO" 2 "config.json (a FIFO)" -- $T "$ROTARY" freqs --hf-config "$W/fifo_config/config.json"
expect_error "eval of a FIFO" 2 "checkpoint = $W/ids.fifo (a FIFO)" -- $T "$ROTARY" eval "$W/ids.fifo"
scratch mistral fifo_weights
rm "$W/fifo_weights/model.safetensors" && mkfifo "$W/fifo_weights/model.safetensors"
expect_error "perplexity: model.safetensors a FIFO" 2 "model.safetensors (a FIFO)" -- \
  $T "$ROTARY" perplexity "$W/fifo_weights" --tokens "$W/ids.txt" --out "$W/d" --no-progress
scratch mistral dir_config
rm "$W/dir_config/config.json" && mkdir "$W/dir_config/config.json"
expect_error "perplexity: config.json a directory" 2 "config.json (a directory)" -- \
  $T "$ROTARY" perplexity "$W/dir_config" --tokens "$W/ids.txt" --out "$W/d" --no-progress

# ---- Results reused only for the same weights: a cell of the old model is not reported after the weights change.
scratch llama2 weights
run_cell() {  # <out> -> stderr in $W/cell.err
  $T "$ROTARY" perplexity "$W/weights" --tokens "$W/ids.txt" --train-len 16 --lengths 32 --methods native --out "$W/$1" \
    > /dev/null 2> "$W/cell.err"
}
run_cell cells && run_cell cells && grep -q "done earlier" "$W/cell.err" \
  && pass "perplexity: unchanged weights reuse the cell" || fail "unchanged weights: $(tail -c 300 "$W/cell.err")"
# (the weights are identified by content: an mtime alone changes nothing, one changed byte of a tensor does)
touch -d "2001-01-01" "$W/weights/model-00002-of-00002.safetensors"
run_cell cells
grep -q "done earlier" "$W/cell.err" && pass "perplexity: the same weights with another mtime reuse the cell" \
  || fail "an mtime alone made the cell computed again: $(tail -c 300 "$W/cell.err")"
/usr/bin/python3 - "$W/weights/model-00002-of-00002.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
name = next(k for k in sorted(header) if k != "__metadata__")
data[8 + n + header[name]["data_offsets"][0]] ^= 1  # the low byte of its first element: still finite
open(path, "wb").write(bytes(data))
PY
touch -d "2001-01-01" "$W/weights/model-00002-of-00002.safetensors"  # the same size and mtime as before
run_cell cells
grep -q "done earlier" "$W/cell.err" && fail "perplexity: a cell of other weights (one byte of a shard) was reused" \
  || pass "perplexity: changed weights are scored again"

# ---- Non-finite losses: exit 3 as training does, the cell stored as NaN and reused (not recomputed) on a rerun.
scratch llama2 overflow 'c["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1e300, "original_max_position_embeddings": 32}'
$T "$ROTARY" perplexity "$W/overflow" --tokens "$W/ids.txt" --lengths 32 --methods native --out "$W/nan" \
  > "$W/nan.out" 2> "$W/nan.err"
code=$?
[ $code = 3 ] && grep -q "the loss is not finite in" "$W/nan.err" && pass "perplexity: non-finite loss exits 3" \
  || fail "non-finite loss: exit $code: $(tail -c 300 "$W/nan.err")"
grep -q "nan\|NaN" "$W/nan.out" && pass "perplexity: the table shows NaN" || fail "no NaN in the table: $(cat "$W/nan.out")"
$T "$ROTARY" perplexity "$W/overflow" --tokens "$W/ids.txt" --lengths 32 --methods native --out "$W/nan" \
  > /dev/null 2> "$W/nan2.err"
code=$?
[ $code = 3 ] && grep -q "done earlier" "$W/nan2.err" && pass "perplexity: a NaN cell is reused" \
  || fail "NaN cell rerun: exit $code: $(tail -c 300 "$W/nan2.err")"

# ---- generate: a sentencepiece-style tokenizer covering ids 0..39 of a 64-row embedding (padding rows past the
# tokenizer): the continuation keeps the space before its first word, and no padding id is ever produced.
scratch llama2 spm
/usr/bin/python3 - "$W/spm/tokenizer.json" <<'PY'
import json, sys
vocab = {"▁a": 0, "▁b": 1}
vocab.update({"▁w%d" % i: i for i in range(2, 40)})
json.dump({"version": "1.0", "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
           "post_processor": None,
           "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                     "vocab": vocab, "merges": []}},
          open(sys.argv[1], "w"), ensure_ascii=False)
PY
for temperature in 0 1; do
  if $T "$ROTARY" generate "$W/spm" --prompt "a b" --max-new 24 --temperature $temperature --seed 3 \
       > "$W/gen.out" 2> "$W/gen.err"; then
    grep -Eq '^a b( (a|b|w[0-9]+))+$' "$W/gen.out" && pass "generate (temperature $temperature): words joined with spaces" \
      || fail "generate printed '$(cat "$W/gen.out")'"
  else
    fail "generate (temperature $temperature) exited $?: $(tail -c 300 "$W/gen.err")"
  fi
done

# ---- generate on a run directory without checkpoint.pt: says there is no checkpoint (not "model_type = missing").
mkdir -p "$W/run" && echo '{"task": "addition"}' > "$W/run/config.json"
expect_error "generate: run directory without checkpoint.pt" 2 "no checkpoint at $W/run" -- \
  $T "$ROTARY" generate "$W/run" --prompt "1+1"

# ---- Two compares on one --out: the second is refused naming the first's pid; a compare killed with SIGKILL
# takes its `rotary train` children with it.
TINY=(--task addition --max-digits 2 --d-model 16 --n-layers 1 --n-heads 1 --seq-len 32 --batch-size 4 --steps 100000
      --eval-interval 100000 --eval-batches 1 --eval-problems 2 --threads 1 --encodings rope,roper --seeds 1 --jobs 2)
"$ROTARY" compare "${TINY[@]}" --out "$W/cmp" --no-progress > /dev/null 2>&1 &
first=$!
children=""
for _ in $(seq 1 300); do
  children=$(ps -o pid= --ppid "$first" | tr -d ' ' | tr '\n' ' ')
  [ -s "$W/cmp/.rotary.lock" ] && [ -n "$children" ] && break
  sleep 0.1
done
expect_error "compare: a second on the same --out" 2 "in use by another rotary command, pid $first" -- \
  $T "$ROTARY" compare "${TINY[@]}" --out "$W/cmp" --no-progress
[ -n "$children" ] && pass "compare started its runs ($children)" || fail "compare started no \`rotary train\`"
kill -9 "$first"
wait "$first" 2> /dev/null
alive=""
for _ in $(seq 1 100); do
  alive=""
  for c in $children; do kill -0 "$c" 2> /dev/null && alive="$alive $c"; done
  [ -z "$alive" ] && break
  sleep 0.1
done
if [ -z "$alive" ]; then
  pass "compare's children end with it"
else
  fail "compare's children outlived it:$alive"
  for c in $alive; do kill -9 "$c"; done
fi

echo "$fails failed"
[ "$fails" = 0 ]
