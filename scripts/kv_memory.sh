#!/usr/bin/env bash
# Seed 001's key-value task through the retrieval memory (issue 23; docs/memory.md, docs/tasks.md): a curriculum of
# five training runs, each started from the one before (--init-from), then `rotary memory` on the last.
#   1. one_letter: one-letter keys, objects of 2-12 pairs filling L = 160, RoPE: the lookup forms (99.5% at L);
#   2. two_letters: two-letter keys (prompts past 2L need them: 26 one-letter keys run out), ReRoPE w = 64 at
#      L = 128: the lookup carries over and is retrained on two letters within a few hundred steps;
#   3.-5. near keys (--kv-near-keys: a key is an earlier one with one letter changed, at chance 0.5, then 1, then
#      with every object of 8 pairs), so that a lookup matching one letter of two is punished - at 64L an object
#      holds ~630 pairs, ~48 of them sharing a letter with the asked key.
# Then the memory at L, 8L and 64L (the rerope policy; the ReRoPE model's own) and the searches on its keys.
# ~50 min (one thread each, so the runs repeat those of docs/tasks.md bitwise). Usage: scripts/kv_memory.sh
# [OUT_DIR] (default runs/kv_memory); a rerun skips finished runs and resumes an interrupted one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/runs/kv_memory}"
rotary="$root/build/lab/rotary"
[ -x "$rotary" ] || bash "$root/scripts/build.sh" --target rotary
mkdir -p "$out"
model=(--task kv_retrieval --d-model 64 --n-heads 4 --n-layers 2 --batch-size 32 --lr 3e-3 --init fan_in
       --tie-embeddings false --fused false --seed 1 --kv-queries 2 --threads 1)
run() {  # run DIR FLAGS...: trains unless DIR holds a finished run
  local dir="$1"; shift
  if [ -f "$dir/summary.json" ]; then echo "kv_memory: $dir finished already"; return; fi
  local resume=()
  [ -f "$dir/checkpoint.pt" ] && resume=(--resume)
  "$rotary" train "${model[@]}" "$@" --out "$dir" "${resume[@]}"
}
run "$out/one_letter" --kv-key-len 1 --kv-pairs 12 --kv-min-pairs 2 --seq-len 160 --steps 4000 --eval-interval 500 --eval-problems 200
two=(--kv-key-len 2 --kv-pairs 8 --seq-len 128 --encoding rerope --window 64 --eval-interval 500 --eval-problems 200)
run "$out/two_letters" "${two[@]}" --kv-min-pairs 2 --steps 4000 --init-from "$out/one_letter"
run "$out/near_half" "${two[@]}" --kv-min-pairs 2 --steps 3000 --kv-near-keys 0.5 --init-from "$out/two_letters"
run "$out/near_all" "${two[@]}" --kv-min-pairs 2 --steps 3000 --kv-near-keys 1 --lr 1e-3 --init-from "$out/near_half"
run "$out/near_all_8" "${two[@]}" --steps 4000 --kv-near-keys 1 --lr 1e-3 --kv-min-pairs 8 --init-from "$out/near_all"
exec "$rotary" memory --checkpoint "$out/near_all_8" --lengths 1,8,64 --policies rerope,exact --top-k 1,2,8 \
    --baselines trained --indexes flat,kdtree,graph --problems 100 --threads 1 --out "$out/memory"
