#!/bin/bash
# The benchmarks that make seed 002's runtime claim, at toy sizes: each runs, prints JSON with the fields docs/
# quotes, and its ratios are finite and positive; the fused and plain models of `bench train` start from the same
# loss (they compute the same function). Speeds themselves are not tested (docs/bench-*.md hold them).
#
# usage: bash test_bench_smoke.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_bench_smoke.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_bench_smoke.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
PY=/usr/bin/python3

# check <what> <json file> <python expression over j that must be true>
check() {
  if "$PY" -c "import json,math,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($3) else 1)" "$2" 2>"$W/py.txt"; then
    pass "$1"
  else
    fail "$1: $(head -c 300 "$2") $(head -c 300 "$W/py.txt")"
  fi
}

if "$ROTARY" bench rope-cost --seq 16 --batch 2 --heads 3 --dim 8 --trials 1 --min-trial-ms 1 --json > "$W/cost.json"; then
  check "bench rope-cost: methods and ratios" "$W/cost.json" \
    "[m['method'] for m in j['results']][:2] == ['rope_apply', 'additive'] and 0 < j['rope_apply_over_additive'] < math.inf and (not j['machine']['torch'] or 0 < j['torch_rotary_over_torch_additive'] < math.inf)"
else
  fail "bench rope-cost exited $?"
fi
if "$ROTARY" bench rope-cost --dtype bf16 --seq 4 --batch 1 --heads 1 --dim 2 --trials 1 --min-trial-ms 1 --no-torch --json > "$W/cost16.json"; then
  check "bench rope-cost bf16 without torch" "$W/cost16.json" "len(j['results']) == 2 and 'torch_rotary_over_torch_additive' not in j"
else
  fail "bench rope-cost --dtype bf16 exited $?"
fi
expect_error "bench rope-cost --dtype f16" 2 "--dtype = f16" -- "$ROTARY" bench rope-cost --dtype f16
expect_error "bench rope-cost --dim 7" 2 "--dim = 7" -- "$ROTARY" bench rope-cost --dim 7

if "$ROTARY" bench train --seq-len 16 --d-model 32 --n-layers 1 --n-heads 2 --batch 2 --warmup 1 --steps 1 --trials 1 \
     --against learned --json > "$W/train.json"; then
  check "bench train --against learned: three models, overhead reported" "$W/train.json" \
    "len(j['methods']) == 3 and j['methods'][2]['name'] == 'fused, learned' and math.isfinite(j['overhead_percent_vs_against'])"
  check "bench train: fused and plain start from the same loss" "$W/train.json" \
    "abs(j['methods'][0]['first_step_loss'] - j['methods'][1]['first_step_loss']) < 1e-4"
else
  fail "bench train --against exited $?"
fi
expect_error "bench train --against rope (the same encoding)" 2 "--against = rope" -- \
  "$ROTARY" bench train --against rope --seq-len 16 --d-model 32 --n-layers 1 --n-heads 2

# bench checkpoint --engine torch: a tiny random Llama-family model, and a fixture checkpoint; both methods give the
# same greedy tokens, and the rates are finite.
if "$ROTARY" bench checkpoint --engine torch --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ff 96 --vocab 128 \
     --prompt 24 --decode 3 --trials 1 --json > "$W/ckpt.json"; then
  check "bench checkpoint: same tokens, finite rates" "$W/ckpt.json" \
    "j['same_greedy_tokens'] and j['parameters'] > 0 and all(0 < m['decode_tokens_per_s'] < math.inf and 0 < m['weight_read_over_memcpy'] < math.inf for m in j['methods'])"
else
  fail "bench checkpoint exited $?"
fi
if "$ROTARY" bench checkpoint --engine torch --model "$SRC/tests/data/hf_checkpoints/gpt_neox" --prompt 12 --decode 2 \
     --trials 1 --json > "$W/ckpt2.json"; then
  check "bench checkpoint --model: same tokens" "$W/ckpt2.json" "j['same_greedy_tokens'] and j['n_heads'] == 2"
else
  fail "bench checkpoint --model exited $?"
fi
# bench checkpoint on the engine (the default): random bf16 weights (stored), then q8 with a bf16 and a q8 cache, then a
# fixture; finite rates, a weight-read rate against the read probe, the peak resident set.
for extra in "" "--weights q8 --kv-dtype bf16" "--weights q8 --kv-dtype q8"; do
  # shellcheck disable=SC2086
  if "$ROTARY" bench checkpoint --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ff 96 --vocab 128 --prompt 24 \
       --decode 3 --trials 1 --json $extra > "$W/engine.json"; then
    check "bench checkpoint (engine $extra): finite rates, weights ${extra:-bf16}" "$W/engine.json" \
      "j['engine'] == 'engine' and j['weights'] == ('q8' if '$extra' else 'bf16') and 0 < j['decode_tokens_per_s'] < math.inf and 0 < j['prefill_tokens_per_s'] < math.inf and 0 < j['weight_read_over_probe'] < math.inf and j['peak_rss_bytes'] > 0 and len(j['greedy_tokens']) == 3"
  else
    fail "bench checkpoint (engine $extra) exited $?"
  fi
done
if "$ROTARY" bench checkpoint --model "$SRC/tests/data/hf_checkpoints/qwen2" --prompt 12 --decode 2 --trials 1 \
     --json > "$W/engine2.json"; then
  check "bench checkpoint --model on the engine: the stored bf16 weights in place" "$W/engine2.json" \
    "j['weights'] == 'bf16' and j['decode_tokens_per_s'] > 0"
else
  fail "bench checkpoint --model (engine) exited $?"
fi
expect_error "bench checkpoint --engine torch --weights q8" 2 "--weights = q8" -- \
  "$ROTARY" bench checkpoint --engine torch --weights q8 --hidden 64 --layers 1 --heads 4 --kv-heads 2 --ff 96 --vocab 128
# A prompt in chunks of 5 tokens per layer: the same greedy tokens as one chunk of the whole prompt.
for chunk in 5 24; do
  "$ROTARY" bench checkpoint --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ff 96 --vocab 128 --prompt 24 \
    --decode 3 --trials 1 --json --prefill-chunk $chunk > "$W/chunk$chunk.json" || fail "--prefill-chunk $chunk exited $?"
done
/usr/bin/python3 -c "
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a['prefill_chunk'] == 5 and b['prefill_chunk'] == 24 and a['greedy_tokens'] == b['greedy_tokens'], (a, b)
" "$W/chunk5.json" "$W/chunk24.json" && pass "bench checkpoint --prefill-chunk 5 = 24 (greedy tokens)" \
  || fail "bench checkpoint --prefill-chunk: other tokens"
for chunk in 8 512; do  # (512: the default, given)
  expect_error "bench checkpoint --engine torch --prefill-chunk $chunk" 2 "--prefill-chunk = $chunk" -- \
    "$ROTARY" bench checkpoint --engine torch --prefill-chunk $chunk --hidden 64 --layers 1 --heads 4 --kv-heads 2 \
    --ff 96 --vocab 128
done
# bench linear: every weight format (and bf16 / q8 weights with bf16 / q8 activations) at a small shape, decode against the
# read probe, prefill against sgemm.
if "$ROTARY" bench linear --shapes 64x96,33x40 --weight-mib 4 --tokens 9 --trials 1 --threads 1 --json > "$W/linear.json"; then
  check "bench linear: every format and phase per shape, finite rates" "$W/linear.json" \
    "len(j['results']) == 2 * (2 * 6 + 1) and all(0 < r['seconds'] < math.inf for r in j['results']) and all(0 < r['over_read_probe'] < math.inf for r in j['results'] if r['phase'] == 'decode') and {r['method'] for r in j['results']} == {'f32', 'f16', 'bf16', 'q8', 'bf16:bf16', 'q8:q8', 'sgemm_f32'} and isinstance(j['bf16_dot_products'], bool) and isinstance(j['q8_dot_products'], bool)"
else
  fail "bench linear exited $?"
fi
expect_error "bench linear --shapes 64" 2 "--shapes" -- "$ROTARY" bench linear --shapes 64
expect_error "bench linear --formats q8:bf16" 2 "--formats = q8:bf16" -- \
  "$ROTARY" bench linear --shapes 64x96 --weight-mib 1 --tokens 2 --trials 1 --formats q8:bf16
expect_error "bench linear --formats bf16:f16" 2 "--formats activations" -- "$ROTARY" bench linear --formats bf16:f16

# bench memory: toy memories through the exact scan, every FAISS index and the core's page searches; each method
# is timed, scored (recall in [0, 1]) and its work counted (the share of an exact scan's keys; flat scores each once,
# and flat and the certified page searches find the whole exact top-k).
if "$ROTARY" bench memory --sizes 256,1k --head-dim 16 --top-k 8 --queries 5 --threads 1 --ef-search 16,64 \
     --indexes flat,hnsw,ivf,pages,kdtree --pages-read 0,2 --page-size 16 \
     --keys gaussian,clustered --clusters 8 --json > "$W/memory.json"; then
  check "bench memory: every method per size, finite positive latencies, recall in [0, 1], work counted" "$W/memory.json" \
    "len(j['rows']) == 2 * 2 * 9 and all({r['method'] for r in j['rows'] if r['tokens'] == n and r['keys'] == k} == {'exact', 'flat', 'hnsw_ef16', 'hnsw_ef64', 'ivf_nprobe16', 'pages0', 'pages2', 'kdtree0', 'kdtree2'} for n in (256, 1024) for k in ('gaussian', 'clustered')) and all(0 < r['median_ms'] < math.inf and 0 < r['speedup_vs_exact'] < math.inf and 0 <= r['recall'] <= 1 and (r['scored_share_of_scan'] is None if r['kind'] == 'hnsw' else 0 < r['scored_share_of_scan'] < 2) for r in j['rows'])"
  check "bench memory: flat and the certified page searches find the exact top-k; flat scores each key once" "$W/memory.json" \
    "all(r['recall'] == 1 for r in j['rows'] if r['method'] in ('exact', 'flat', 'pages0', 'kdtree0')) and all(r['scored_share_of_scan'] == 1 for r in j['rows'] if r['method'] in ('exact', 'flat')) and all(r['scored_share_of_scan'] < 0.5 for r in j['rows'] if r['method'] in ('pages2', 'kdtree2') and r['tokens'] == 1024) and j['memory_bytes_per_token'] == 2 * 16 * 4 + 8"
else
  fail "bench memory exited $?"
fi
# bench memory --indexes graph: learnt from its own training queries (drawn like the timed ones, 8k rows: past the
# 4,096 a graph is built at); a walk as wide as the memory finds the exact top-k, a narrow one scores a share.
if "$ROTARY" bench memory --sizes 8k --head-dim 16 --top-k 8 --queries 5 --threads 1 --indexes graph \
     --graph-widths 16,16384 --graph-training-queries 2048 --keys clustered --clusters 8 --json > "$W/graph.json"; then
  check "bench memory: the graph at two widths, the wide walk exact, the narrow one a share of the scan" "$W/graph.json" \
    "{r['method'] for r in j['rows']} == {'exact', 'graph_w16', 'graph_w16384'} and all(r['recall'] == 1 and r['graph_width'] == 16384 for r in j['rows'] if r['method'] == 'graph_w16384') and all(0 < r['scored_share_of_scan'] < 0.5 and 0 <= r['recall'] <= 1 and r['graph_width'] == 16 and r['build_s'] > 0 for r in j['rows'] if r['method'] == 'graph_w16')"
else
  fail "bench memory --indexes graph exited $?"
fi
expect_error "bench memory --graph-widths 0" 2 "--graph-widths" -- "$ROTARY" bench memory --indexes graph --graph-widths 0 --sizes 64

# bench memory --mapped: the memory and the page indexes saved in the directory and used from their files; a second
# run opens them (same results, nothing rebuilt), a damaged index is rebuilt (named on stderr), not used.
M=(bench memory --sizes 1k --head-dim 16 --top-k 8 --queries 3 --threads 1 --indexes pages,kdtree --pages-read 0
   --page-size 16 --keys clustered --clusters 8 --cluster-spread 0.05 --mapped "$W/mapped")
if "$ROTARY" "${M[@]}" --json > "$W/mapped1.json" 2> "$W/mapped1.err" &&
   "$ROTARY" "${M[@]}" --json > "$W/mapped2.json" 2> "$W/mapped2.err"; then
  [ "$(ls "$W/mapped" | grep -c '\.mem$')" = 1 ] && [ "$(ls "$W/mapped" | grep -c '\.pages$')" = 2 ] ||
    fail "bench memory --mapped files: $(ls "$W/mapped")"
  check "bench memory --mapped: the certified searches over the mapped files find the exact top-k" "$W/mapped2.json" \
    "j['settings']['mapped'] != '' and {r['method'] for r in j['rows']} == {'exact', 'pages0', 'kdtree0'} and all(r['recall'] == 1 and r['major_faults_per_step'] >= 0 for r in j['rows'])"
  grep -q rebuilding "$W/mapped2.err" && fail "bench memory --mapped rebuilt on the second run: $(cat "$W/mapped2.err")"
  idx=$(ls "$W/mapped"/*kdtree16.pages)
  head -c 100 "$idx" > "$idx.cut" && mv "$idx.cut" "$idx"
  "$ROTARY" "${M[@]}" --json > "$W/mapped3.json" 2> "$W/mapped3.err" || fail "bench memory --mapped after damage exited $?"
  grep -q "rebuilding (rotary: memory_pages.open: .*kdtree16.pages" "$W/mapped3.err" ||
    fail "a damaged index was not named and rebuilt: $(cat "$W/mapped3.err")"
  echo "ok: bench memory --mapped"
else
  fail "bench memory --mapped exited $?: $(tail -3 "$W/mapped1.err" "$W/mapped2.err")"
fi
expect_error "bench memory --cluster-spread -1" 2 "--cluster-spread" -- "$ROTARY" bench memory --cluster-spread -1 --sizes 64
expect_error "bench memory --top-k past the smallest size" 2 "--top-k = 100" -- \
  "$ROTARY" bench memory --sizes 64,1k --top-k 100
expect_error "bench memory --head-dim 7" 2 "--head-dim = 7" -- "$ROTARY" bench memory --head-dim 7 --sizes 64
expect_error "bench memory --indexes annoy" 2 "--indexes = annoy" -- "$ROTARY" bench memory --indexes flat,annoy --sizes 64
expect_error "bench memory --memory-dtype f64" 2 "--memory-dtype = f64" -- "$ROTARY" bench memory --memory-dtype f64 --sizes 64
expect_error "bench memory --pages-read -1" 2 "--pages-read" -- "$ROTARY" bench memory --indexes kdtree --pages-read 0,-1 --sizes 64

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all bench smoke checks passed"
