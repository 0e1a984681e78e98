#!/bin/bash
# runs without libtorch
# A GGUF file as a model (rotary_engine/gguf_model.h): the llama3 fixture (Llama 3.1's scaling, its byte-level BPE
# tokenizer, a tied head) written as a bf16 GGUF file by scripts/gguf_from_checkpoint.py (gguf-py), then `rotary
# generate` on the file prints what it prints on the directory - text through the file's own tokenizer, token ids,
# greedy - and `rotary perplexity` scores the same loss; a file that is not GGUF is refused by name. Exit 77 (skipped)
# without gguf-py or numpy.
#
# usage: bash test_gguf_model.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_gguf_model.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_gguf_model.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
GGUF_PY=${ROTARY_GGUF_PY:-$SRC/tests/gguf_oracle/llama.cpp/gguf-py}
if [ ! -f "$GGUF_PY/gguf/__init__.py" ] || ! /usr/bin/python3 -c "import numpy" 2>/dev/null; then
  echo "SKIPPED: no gguf-py at $GGUF_PY (ROTARY_GGUF_PY, or scripts/setup.sh) or no numpy"
  exit 77
fi
T="timeout 120"
cp -r "$SRC/tests/data/hf_checkpoints/llama3" "$W/llama3"
if ! /usr/bin/python3 "$SRC/scripts/gguf_from_checkpoint.py" "$W/llama3" --gguf-py "$GGUF_PY" --outtype bf16 \
    --out "$W/llama3.gguf" > "$W/convert.out" 2>&1; then
  fail "gguf_from_checkpoint.py: $(tail -c 400 "$W/convert.out")"
  echo "$fails failed"
  exit 1
fi

# The same output from the directory and from the file (the llama file rotates adjacent pairs of permuted rows: the
# logits agree to float32 rounding, so the greedy tokens are the same).
same_output() {
  local what=$1
  shift
  if ! $T "$ROTARY" generate "$W/llama3" "$@" > "$W/dir.out" 2> "$W/dir.err"; then
    fail "$what (directory) exited $?: $(tail -c 300 "$W/dir.err")"
  elif ! $T "$ROTARY" generate "$W/llama3.gguf" "$@" > "$W/gguf.out" 2> "$W/gguf.err"; then
    fail "$what (gguf) exited $?: $(tail -c 300 "$W/gguf.err")"
  elif ! cmp -s "$W/dir.out" "$W/gguf.out"; then
    fail "$what: directory printed '$(head -c 200 "$W/dir.out")', the GGUF file '$(head -c 200 "$W/gguf.out")'"
  elif [ ! -s "$W/gguf.out" ]; then
    fail "$what: nothing printed"
  else
    pass "$what: $(head -c 80 "$W/gguf.out" | tr '\n' ' ')"
  fi
}
same_output "generate --prompt (the file's tokenizer)" --prompt "Hello world, 123" --max-new 12 --temperature 0
echo "1 5 9 3 7 11 2" > "$W/prompt.txt"
same_output "generate --prompt-tokens" --prompt-tokens "$W/prompt.txt" --max-new 16 --temperature 0 --no-stop
same_output "generate --weights q8 (bf16 converted alike)" --prompt-tokens "$W/prompt.txt" --max-new 16 \
  --temperature 0 --no-stop --weights q8

# perplexity: the same loss at the printed precision.
seq 1 40 | awk '{print ($1 * 37) % 300}' > "$W/ids.txt"
for where in "$W/llama3" "$W/llama3.gguf"; do
  if ! $T "$ROTARY" perplexity "$where" --tokens "$W/ids.txt" --lengths 32 --methods native --train-len 16 \
      --out "$W/ppl_$(basename "$where")" > "$W/ppl_$(basename "$where").out" 2>&1; then
    fail "perplexity $where exited: $(tail -c 300 "$W/ppl_$(basename "$where").out")"
  fi
done
loss() { grep -E "^native +[0-9]" "$1" | head -1; }
if [ -z "$(loss "$W/ppl_llama3.out")" ]; then
  fail "perplexity printed no native row: $(tail -c 300 "$W/ppl_llama3.out")"
elif [ "$(loss "$W/ppl_llama3.out")" != "$(loss "$W/ppl_llama3.gguf.out")" ]; then
  fail "perplexity: directory '$(loss "$W/ppl_llama3.out")', GGUF '$(loss "$W/ppl_llama3.gguf.out")'"
else
  pass "perplexity: $(loss "$W/ppl_llama3.gguf.out")"
fi

printf 'GGUF\003\000\000\000' > "$W/truncated.gguf"
expect_error "a truncated GGUF file" 2 "truncated.gguf" -- $T "$ROTARY" generate "$W/truncated.gguf" --prompt hi

echo "$fails failed"
[ "$fails" = 0 ]
