#!/bin/bash
# One sampler for both engines (issue 48): `rotary generate` on a checkpoint prints the same token ids for the same
# --seed on the torch-free engine (the default) and on the nn model (--engine torch), sampled at --temperature 0.8
# and greedy, on every fixture family; another seed prints others.
#
# usage: bash test_generate_engines.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_generate_engines.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_generate_engines.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"
if ! "$ROTARY" generate --help 2>/dev/null | grep -q -- "--engine"; then
  echo "SKIP: this rotary has no checkpoint generate"
  exit 0
fi
T="timeout 120"
echo "1 5 9 3 7" > "$W/prompt.txt"

for family in llama2 llama3 mistral qwen2 gpt_neox; do
  for setting in "--temperature 0.8 --seed 3" "--temperature 0.8 --seed 4" "--temperature 0"; do
    # shellcheck disable=SC2086  # the setting is two flags
    if ! $T "$ROTARY" generate "$FIX/$family" --prompt-tokens "$W/prompt.txt" --max-new 16 $setting \
        > "$W/engine.out" 2> "$W/engine.err"; then
      fail "$family $setting (engine) exited $?: $(tail -c 300 "$W/engine.err")"
      continue
    fi
    # shellcheck disable=SC2086
    if ! $T "$ROTARY" generate "$FIX/$family" --prompt-tokens "$W/prompt.txt" --max-new 16 $setting --engine torch \
        > "$W/torch.out" 2> "$W/torch.err"; then
      fail "$family $setting (--engine torch) exited $?: $(tail -c 300 "$W/torch.err")"
      continue
    fi
    if [ "$(wc -w < "$W/engine.out")" != 21 ]; then
      fail "$family $setting: not the prompt and 16 ids: $(cat "$W/engine.out")"
    elif cmp -s "$W/engine.out" "$W/torch.out"; then
      pass "$family $setting: the same ids on both engines"
    else
      fail "$family $setting: engine '$(cat "$W/engine.out")' vs torch '$(cat "$W/torch.out")'"
    fi
    cp "$W/engine.out" "$W/$family.${setting// /_}"
  done
  if [ -s "$W/$family.--temperature_0.8_--seed_3" ] && cmp -s "$W/$family.--temperature_0.8_--seed_3" \
      "$W/$family.--temperature_0.8_--seed_4"; then
    fail "$family: seeds 3 and 4 printed the same ids (the check would not see the seed)"
  fi
done

echo "$fails failed"
[ "$fails" = 0 ]
