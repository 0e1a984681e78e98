#!/usr/bin/env bash
# The retrieval memory's searches on a language model's keys (issue 23; docs/memory.md "The searches on a text
# model's keys"): two KJV text models (BPE 2,000, d_model 128 x 2 layers x 4 heads, L = 128, 1,500 steps x batch
# 32), one with RoPE and one with ReRoPE w = 64, trained side by side on one thread each (~11 min), then
# `rotary memory` on each at L, 8L, 64L and 1024L (131,072 tokens): the loss on 32 tokens after each prompt through
# the memory, and the searches' recall@32, keys scored and step time (~10 min each, side by side).
# Usage: scripts/text_memory.sh [OUT_DIR] (default runs/text_memory); a rerun skips finished runs and scored cells
# and resumes an interrupted training.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/runs/text_memory}"
rotary="$root/build/lab/rotary"
[ -x "$rotary" ] || bash "$root/scripts/build.sh" --target rotary
command -v bible > /dev/null || { echo "text_memory: the KJV text needs bible-kjv (apt-get install bible-kjv)" >&2; exit 2; }
mkdir -p "$out"
model=(--task text --d-model 128 --n-layers 2 --n-heads 4 --seq-len 128 --batch-size 32 --steps 1500 --lr 3e-3
       --warmup 100 --eval-interval 500 --eval-batches 2 --eval-problems 0 --threads 1 --seed 1)
train() {  # train DIR FLAGS...: unless DIR holds a finished run
  local dir="$1"; shift
  if [ -f "$dir/summary.json" ]; then echo "text_memory: $dir finished already"; return; fi
  local resume=()
  [ -f "$dir/checkpoint.pt" ] && resume=(--resume)
  "$rotary" train "${model[@]}" "$@" --out "$dir" "${resume[@]}"
}
memory=(--lengths 1,8,64,1024 --top-k 32 --problems 4 --index-problems 3 --threads 1)
train "$out/rope" --encoding rope &
rope=$!
train "$out/rerope" --encoding rerope --window 64
wait "$rope"
"$rotary" memory --checkpoint "$out/rope" "${memory[@]}" --policies exact,rerope --baselines trained,rerope \
    --indexes flat,ivf,kdtree,kdtree16,graph,graph256,graph384,graph512 --out "$out/rope_memory" &
rope=$!
"$rotary" memory --checkpoint "$out/rerope" "${memory[@]}" --policies rerope,exact --baselines trained \
    --indexes flat,ivf,kdtree,kdtree16,graph,graph256 --out "$out/rerope_memory"
wait "$rope"
echo "text_memory: reports in $out/rope_memory/report.md and $out/rerope_memory/report.md"
