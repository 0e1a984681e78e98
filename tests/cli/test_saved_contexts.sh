#!/bin/bash
# runs without libtorch
# Saved contexts and stored cells against what a user's files go through (issue 48): a context is one unit bound to
# the weights by content (a fine-tuned copy with the same embeddings, another --weights, a symlink loop in place of a
# layer file are refused by name); settings a save could never keep are refused before the prompt is read; and
# perplexity's stored cells are keyed by the weights' content, so copies made with their mtime kept (cp -p, rsync
# -a, tar) behind a switched --model symlink give their own losses, not the first model's "done earlier".
#
# usage: bash test_saved_contexts.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_saved_contexts.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_saved_contexts.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"
if ! "$ROTARY" generate --help 2>/dev/null | grep -q -- "--save-context"; then
  echo "SKIP: this rotary has no checkpoint generate"
  exit 0
fi
T="timeout 120"
/usr/bin/python3 -c "import random; random.seed(5); print(' '.join(str(random.randrange(64)) for _ in range(40)))" > "$W/ids.txt"
# 5,000 ids: a prompt long enough for generate's progress lines ("prompt: N / M tokens"), which show that the prompt
# was read.
/usr/bin/python3 -c "import random; random.seed(6); print(' '.join(str(random.randrange(64)) for _ in range(5000)))" > "$W/long.txt"

# A copy of a fixture whose one weight of one layer differs (a fine-tune that kept the embeddings): the low byte of
# the first element of model.layers.1.mlp.down_proj.weight flipped (the value stays finite).
cp -r "$FIX/llama3" "$W/tuned"
/usr/bin/python3 - "$W/tuned/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
name = next(k for k in header if k.startswith("model.layers.1.") and "down_proj.weight" in k)
start = 8 + n + header[name]["data_offsets"][0]
data[start] ^= 1
open(path, "wb").write(bytes(data))
PY

# ---- A context bound to the weights by content (was: accepted when the shape and three embedding rows agreed).
if $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/ids.txt" --max-new 0 --save-context "$W/ctx" \
     --no-progress > /dev/null 2> "$W/save.err"; then
  pass "generate --save-context"
  [ -f "$W/ctx/context.json" ] && pass "the manifest is written" || fail "no context.json: $(ls "$W/ctx")"
else
  fail "generate --save-context exited $?: $(cat "$W/save.err")"
fi
expect_error "generate --context of another model's weights (same embeddings)" 2 "other weights" -- \
  $T "$ROTARY" generate "$W/tuned" --prompt-tokens "$W/ids.txt" --max-new 2 --context "$W/ctx" --no-progress
expect_error "generate --context saved with weights as stored, run with --weights q8" 2 "saved with weights" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/ids.txt" --max-new 2 --context "$W/ctx" --weights q8 --no-progress
if $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/ids.txt" --max-new 2 --context "$W/ctx" --no-progress \
     > /dev/null 2> "$W/open.err"; then
  pass "generate --context of the same model"
else
  fail "generate --context exited $?: $(cat "$W/open.err")"
fi
# A symlink loop in place of a layer file: exit 2 naming it (was exit 70, an uncaught filesystem error).
cp -r "$W/ctx" "$W/loop"
rm "$W/loop/layer0.kv" && ln -s layer0.kv "$W/loop/layer0.kv"
expect_error "generate --context with a symlink loop for a layer file" 2 "$W/loop/layer0.kv" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/ids.txt" --max-new 2 --context "$W/loop" --no-progress
# A directory that no save finished (no manifest): refused, naming what is missing.
rm "$W/loop/context.json"
expect_error "generate --context of a save that did not finish" 2 "no context.json" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/ids.txt" --max-new 2 --context "$W/loop" --no-progress

# ---- Saves that could never be made, refused before the prompt is read (was: after it - minutes on a long prompt).
: > "$W/a_file"
before_prompt() {  # <what> <text> -- command...: exit 2 with <text>, and no progress line (the prompt was not read)
  local what=$1 text=$2
  shift 3
  expect_error "$what" 2 "$text" -- "$@"
  if grep -q "^prompt: " "$W/err.txt"; then fail "$what: refused only after the prompt was read"; else pass "$what: before the prompt"; fi
}
before_prompt "generate --save-context onto a regular file" "$W/a_file" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/long.txt" --max-new 1 --save-context "$W/a_file"
before_prompt "generate --save-context with --scaling dynamic" "dynamic" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/long.txt" --max-new 1 --save-context "$W/dyn" --scaling dynamic
before_prompt "generate --save-context with --memory unlimiformer" "unlimiformer" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/long.txt" --max-new 1 --save-context "$W/unl" \
  --memory unlimiformer --memory-window 16 --top-k 2

# ---- Perplexity's cells keyed by content: two checkpoints of one shape with the same mtimes behind one symlink.
cp -r "$FIX/llama3" "$W/first"
touch -r "$W/tuned/model.safetensors" "$W/first/model.safetensors"  # the same mtime on both files, as cp -p leaves
[ "$(stat -c %s "$W/first/model.safetensors")" = "$(stat -c %s "$W/tuned/model.safetensors")" ] || fail "sizes differ"
ln -s "$W/first" "$W/model"
PPL=(perplexity "$W/model" --tokens "$W/long.txt" --lengths 32 --methods native --windows 2 --out "$W/ppl")  # (the progress lines say "done earlier")
if $T "$ROTARY" "${PPL[@]}" > "$W/ppl1.txt" 2>&1; then
  rm "$W/model" && ln -s "$W/tuned" "$W/model"
  if $T "$ROTARY" "${PPL[@]}" > "$W/ppl2.txt" 2>&1; then
    if grep -q "done earlier" "$W/ppl2.txt"; then
      fail "perplexity reused a cell of other weights: $(grep "done earlier" "$W/ppl2.txt")"
    else
      pass "perplexity: other weights behind the same path and mtime are scored again"
    fi
  else
    fail "perplexity on the second model exited $?: $(tail -3 "$W/ppl2.txt")"
  fi
  # And the same weights again (a copy at another path, same content) are reused, not recomputed.
  if $T "$ROTARY" "${PPL[@]}" > "$W/ppl3.txt" 2>&1 && grep -q "done earlier" "$W/ppl3.txt"; then
    pass "perplexity: the same weights reuse their cell"
  else
    fail "perplexity: the same weights did not reuse their cell: $(tail -3 "$W/ppl3.txt")"
  fi
else
  fail "perplexity exited $?: $(tail -3 "$W/ppl1.txt")"
fi

echo "$fails failed"
[ "$fails" = 0 ]
