#!/bin/bash
# The command-line faults of issue 48 (a new user's attempts): settings that changed nothing, flags ignored without
# the flag they need, output cut at a NUL byte, work past the documented bounds, misleading messages, empty values
# read as "not given", empty list items dropped. Each must be refused naming the flag (exit 2), or be fixed; every
# command runs under `timeout` (124 = it hung or started the unbounded work).
#
# usage: bash test_cli_faults.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_cli_faults.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_cli_faults.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"
T="timeout 60"

# ---- Torch-free commands: bench linear, freqs, the help.
# bench linear: a shape inside --shapes' range whose weights pass any machine's memory (4 TiB as q8 + float32
# buffers) is refused before it allocates (was: allocated until the OOM killer or exit 71).
expect_error "bench linear: --shapes past MemAvailable" 2 "--shapes = 1048576x1048576 (" -- \
  $T "$ROTARY" bench linear --shapes 1048576x1048576 --formats q8 --weight-mib 1 --trials 1
grep -qF "MemAvailable" "$W/err.txt" && pass "bench linear names MemAvailable" || fail "no MemAvailable: $(cat "$W/err.txt")"
expect_error "bench linear: --shapes 4x4, (an empty item)" 2 "item 2 of 2 is empty" -- \
  $T "$ROTARY" bench linear --shapes 4x4, --formats f32 --weight-mib 1 --trials 1
grep -qF -- "--shapes = 4x4," "$W/err.txt" && pass "the empty item's flag is named" || fail "$(cat "$W/err.txt")"

# A config whose head_dim is odd: the message names head_dim's value, not the partial rotary factor (was
# "head_dim = 1 (int(33 * 1) = 33)").
/usr/bin/python3 -c "import json; print(json.dumps({'head_dim': 33, 'num_attention_heads': 2, 'hidden_size': 66}))" \
  > "$W/head33.json"
expect_error "freqs: head_dim 33" 2 "head_dim = 33 is invalid; allowed: an even number" -- \
  $T "$ROTARY" freqs --hf-config "$W/head33.json"

# rotary --help: reproduce's seeds are its studies' (seed 001's study is there too).
"$ROTARY" --help > "$W/help.txt" 2>&1
if "$ROTARY" reproduce --help > "$W/rhelp.txt" 2>&1; then
  grep -qF "seeds 000, 001, 002, 003, 004" "$W/help.txt" && pass "rotary --help: reproduce's seeds" \
    || fail "rotary --help: $(grep reproduce "$W/help.txt")"
  grep -qF "seed001_memory" "$W/rhelp.txt" && pass "reproduce --help lists seed001_memory" \
    || fail "reproduce --help lacks seed001_memory"
fi

if ! "$ROTARY" perplexity --help > /dev/null 2>&1; then
  echo "SKIP: this rotary has no perplexity / generate (built without libtorch)"
  echo "$fails failed"
  [ "$fails" = 0 ]
  exit
fi

/usr/bin/python3 -c "import random; random.seed(1); print(' '.join(str(random.randrange(64)) for _ in range(40)))" > "$W/ids.txt"
PPL=(perplexity "$FIX/llama2" --tokens "$W/ids.txt" --train-len 16 --lengths 32 --methods native --no-progress)
GEN=(generate "$FIX/llama2" --prompt-tokens "$W/ids.txt" --max-new 2 --no-progress)

# ---- perplexity --kv-dtype q8: its one-pass scoring stores no KV rows, so q8 computed f32's losses labelled q8.
expect_error "perplexity --kv-dtype q8" 2 "--kv-dtype = q8 is invalid; allowed: f32, bf16, f16 for perplexity" -- \
  $T "$ROTARY" "${PPL[@]}" --out "$W/q8" --kv-dtype q8
[ ! -e "$W/q8/cells" ] && pass "perplexity --kv-dtype q8: refused before any work" || fail "q8: cells written"

# ---- Flags that mean something only with another: refused naming both, also at their default value.
for flag in "--top-k 32" "--memory-window 8" "--search exact" "--memory-dtype f32"; do
  name=${flag%% *}
  expect_error "generate $flag without --memory" 2 "$name = ${flag#* } is invalid; allowed: only with --memory" -- \
    $T "$ROTARY" "${GEN[@]}" $flag
  expect_error "perplexity $flag without --memory" 2 "$name = ${flag#* } is invalid; allowed: only with --memory" -- \
    $T "$ROTARY" "${PPL[@]}" --out "$W/dep" $flag
done
expect_error "generate --page-size without a page search" 2 "--page-size = 32 is invalid; allowed: only with --search pages" -- \
  $T "$ROTARY" "${GEN[@]}" --memory exact --page-size 32
expect_error "perplexity --page-size without a page search" 2 "--page-size = 16 is invalid; allowed: only with --search pages" -- \
  $T "$ROTARY" "${PPL[@]}" --out "$W/dep" --memory exact --search faiss-flat --page-size 16
for flag in "--hidden 896" "--layers 2" "--heads 2" "--kv-heads 1" "--ff 64" "--vocab 151936"; do
  expect_error "bench checkpoint --model with $flag" 2 "${flag%% *} = ${flag#* } is invalid; allowed: only without --model" -- \
    $T "$ROTARY" bench checkpoint --model "$FIX/llama2" --prompt 4 --decode 1 --trials 1 $flag
done
# (still accepted where they mean something)
$T "$ROTARY" "${GEN[@]}" --memory exact --memory-window 8 --top-k 4 --search kdtree --page-size 4 > /dev/null 2> "$W/ok.txt" \
  && pass "generate: the memory flags with --memory" || fail "memory flags with --memory: $(head -c 300 "$W/ok.txt")"

# ---- Output: every byte, a NUL included (was cut at the NUL by printf("%s")).
printf 'ab\0cd' > "$W/nul.txt"
printf 'ab\0cd\n' > "$W/nul.expected"
if $T "$ROTARY" generate "$FIX/llama3" --prompt-file "$W/nul.txt" --max-new 0 --no-progress > "$W/nul.out" 2> "$W/nul.err"; then
  cmp -s "$W/nul.out" "$W/nul.expected" && pass "generate echoes a prompt holding a NUL whole" \
    || fail "generate's output: $(od -c "$W/nul.out" | head -3)"
else
  fail "generate --prompt-file with a NUL: $(head -c 300 "$W/nul.err")"
fi

# ---- A prompt past kMaxSequenceLength (2^20 tokens with --max-new), with or without --memory: refused before
# its prefill (was: accepted, hours of prefill on a real model).
/usr/bin/python3 -c "import sys; sys.stdout.write('1 ' * (2**20 + 1))" > "$W/long_ids.txt"
expect_error "generate: 2^20 + 1 prompt ids" 2 "--prompt-tokens tokens + --max-new = 1048577 + 0 is invalid" -- \
  $T "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/long_ids.txt" --max-new 0 --no-progress
expect_error "generate: 2^20 + 1 prompt ids through a memory" 2 "at most 2^20" -- \
  $T "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/long_ids.txt" --max-new 0 --memory exact --no-progress
"$ROTARY" generate --help | tr -s ' \n' ' ' | grep -qF "at most 2^20, with or without --memory" \
  && pass "generate --help states the bound" || fail "generate --help lacks the prompt bound"

# ---- Empty values given explicitly: refused by name, never read as "not given".
expect_error "generate --save-context \"\"" 2 "--save-context" -- $T "$ROTARY" "${GEN[@]}" --save-context ""
expect_error "generate --context \"\"" 2 "--context" -- $T "$ROTARY" "${GEN[@]}" --context ""
expect_error "generate --weights \"\"" 2 "--weights: value \"\" (empty) is invalid" -- $T "$ROTARY" "${GEN[@]}" --weights ""
expect_error "perplexity --weights \"\"" 2 "--weights: value \"\" (empty) is invalid" -- \
  $T "$ROTARY" "${PPL[@]}" --out "$W/e" --weights ""
expect_error "generate --memory \"\"" 2 "--memory: value \"\" (empty) is invalid" -- $T "$ROTARY" "${GEN[@]}" --memory ""
expect_error "perplexity --memory \"\"" 2 "--memory: value \"\" (empty) is invalid" -- \
  $T "$ROTARY" "${PPL[@]}" --out "$W/e" --memory ""
expect_error "generate --prompt \"\"" 2 "--prompt: value \"\" (empty) is invalid" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt "" --max-new 1 --no-progress
: > "$W/empty.txt"
expect_error "generate: an empty --prompt-file" 2 "--prompt-file = $W/empty.txt (an empty file) is invalid" -- \
  $T "$ROTARY" generate "$FIX/llama3" --prompt-file "$W/empty.txt" --max-new 1 --no-progress
expect_error "generate --memory-window 0" 2 "--memory-window" -- $T "$ROTARY" "${GEN[@]}" --memory exact --memory-window 0

# ---- Empty list items: refused naming the flag and the item.
expect_error "perplexity --lengths 32," 2 "--lengths = 32, is invalid; allowed: a comma-separated list without empty items (item 2 of 2 is empty)" -- \
  $T "$ROTARY" "${PPL[@]}" --out "$W/l" --lengths 32,
expect_error "perplexity --lengths 16,,32" 2 "(item 2 of 3 is empty)" -- \
  $T "$ROTARY" "${PPL[@]}" --out "$W/l" --lengths 16,,32

# ---- Allowed lists that are exactly what is accepted.
expect_error "generate --search pages0" 2 "faiss-flat, faiss-hnsw or faiss-ivf" -- \
  $T "$ROTARY" "${GEN[@]}" --memory exact --search pages0
grep -qF "flat, hnsw, ivf" "$W/err.txt" && fail "--search pages0 lists the lab's index names" || pass "--search lists its own names"
expect_error "generate --memory-dtype q8" 2 "--memory-dtype = q8 is invalid; allowed: f32, bf16, f16" -- \
  $T "$ROTARY" "${GEN[@]}" --memory exact --memory-dtype q8
expect_error "generate --memory-dtype f64 (named by no list)" 2 "--memory-dtype = f64 is invalid; allowed: f32, bf16, f16" -- \
  $T "$ROTARY" "${GEN[@]}" --memory exact --memory-dtype f64

echo "$fails failed"
[ "$fails" = 0 ]
