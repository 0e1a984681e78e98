#!/bin/bash
# runs without libtorch
# The build without libtorch (ROTARY_WITH_TORCH=OFF, issue 44): its rotary links no libtorch, runs every
# checkpoint command on the engine (generate, perplexity, bench checkpoint, template, chat), says in --help which
# commands are absent, and refuses what needs torch by name. With ROTARY_TORCH_BUILD set to the full build's rotary
# (scripts/test.sh sets it), its tokens on every fixture family equal the full build's, greedy and sampled.
#
# usage: bash test_torch_free.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_torch_free.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_torch_free.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"

if "$ROTARY" --help | grep -q "built without libtorch"; then
  if ldd "$ROTARY" | grep -E "libtorch|libc10" > "$W/ldd"; then fail "links libtorch: $(cat "$W/ldd")"; else pass "no libtorch linked"; fi
  for cmd in generate perplexity template chat; do
    if "$ROTARY" --help | grep -qE "^  $cmd "; then pass "$cmd present"; else fail "$cmd missing from --help"; fi
  done
  if "$ROTARY" bench --help | grep -qE "^  checkpoint "; then pass "bench checkpoint present"; else fail "bench checkpoint missing"; fi
  if "$ROTARY" --help | grep -qE "^  train "; then fail "train listed in a build without libtorch"; else pass "train absent"; fi
  echo "1 2 3 4 5" > "$W/prompt.ids"
  expect_error "--engine torch" 2 "--engine = torch is invalid; allowed: engine (this rotary is built without libtorch" -- \
    "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/prompt.ids" --engine torch
  mkdir -p "$W/run"
  expect_error "a lab run" 2 "a Hugging Face model directory" -- "$ROTARY" generate "$W/run" --prompt x
  seq 1 60 | tr '\n' ' ' > "$W/text.ids"
  "$ROTARY" perplexity "$FIX/llama3" --tokens "$W/text.ids" --lengths 16,32 --methods native,rerope \
    --train-len 16 --out "$W/ppl" --no-progress > "$W/ppl.out" 2>&1 && grep -q "report:" "$W/ppl.out" &&
    pass "perplexity runs" || fail "perplexity: $(cat "$W/ppl.out")"
  "$ROTARY" bench checkpoint --model "$FIX/qwen2" --prompt 8 --decode 2 --trials 1 > "$W/bench.out" 2>&1 &&
    pass "bench checkpoint runs" || fail "bench checkpoint: $(cat "$W/bench.out")"
else
  fail "$ROTARY --help does not say it is built without libtorch (run this test on the ROTARY_WITH_TORCH=OFF build)"
fi

if [ -n "${ROTARY_TORCH_BUILD:-}" ]; then
  echo "3 14 15 9 2 6" > "$W/prompt.ids"
  for family in llama2 llama3 mistral qwen2 gpt_neox; do
    for sampling in "--temperature 0" "--temperature 0.8 --seed 7"; do
      # shellcheck disable=SC2086
      a=$("$ROTARY" generate "$FIX/$family" --prompt-tokens "$W/prompt.ids" --max-new 12 $sampling 2>&1)
      # shellcheck disable=SC2086
      b=$("$ROTARY_TORCH_BUILD" generate "$FIX/$family" --prompt-tokens "$W/prompt.ids" --max-new 12 $sampling 2>&1)
      if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$family $sampling: tokens equal the full build's ($a)"
      else fail "$family $sampling: '$a' here, '$b' in the full build"; fi
    done
  done
else
  echo "note: ROTARY_TORCH_BUILD unset: tokens not compared with the full build (scripts/test.sh compares them)"
fi
echo "$fails failed"
[ "$fails" = 0 ]
