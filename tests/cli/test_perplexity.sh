#!/bin/bash
# runs without libtorch
# rotary perplexity end to end on the fixture checkpoints (tests/data/hf_checkpoints): every method, with and
# without log-n, from text through the checkpoint's own tokenizer and from a token-id file; the table, CSV and
# report are written; a rerun reuses every cell; a changed text is scored again; bad settings and inputs are
# refused naming the setting, before any cell is written. And `rotary generate` on a checkpoint.
#
# usage: bash test_perplexity.sh <rotary binary> <source dir>
# It runs in the build without libtorch (scripts/test.sh: a rotary that starts in milliseconds, not a second), with
# the full build's rotary (ROTARY_TORCH_BUILD) for what needs the nn model (--engine torch); or in the full build,
# whose rotary does both.
set -u
ROTARY=${1:?usage: test_perplexity.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_perplexity.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
FIX="$SRC/tests/data/hf_checkpoints"
ALL=native,rope,pi,ntk,ntk_mixed,dynamic,yarn,rerope,leaky_rerope
TORCH=${ROTARY_TORCH_BUILD:-}
if [ -z "$TORCH" ] && ! "$ROTARY" --help | grep -q "built without libtorch"; then TORCH=$ROTARY; fi
[ -n "$TORCH" ] || echo "note: no rotary with libtorch (ROTARY_TORCH_BUILD unset): the --engine torch checks are skipped"

# Text: the README (byte-level BPE of the Llama-3-style fixture tokenizer: ~1 token per byte).
head -c 3000 "$SRC/README.md" > "$W/text.txt"
if "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16,32,64 --methods "$ALL" --logn both \
     --window 8 --windows 2 --out "$W/run" --no-progress > "$W/out.txt" 2> "$W/err.txt"; then
  pass "perplexity: every method +/- log-n on llama3 from text"
  rows=$(($(wc -l < "$W/run/results.csv") - 1))
  [ "$rows" = 54 ] && pass "results.csv: 9 methods x 2 log-n x 3 lengths" || fail "results.csv has $rows rows, not 54"
  grep -q "^Leaky ReRoPE-w8-k16-log n†" "$W/out.txt" && pass "table printed" || fail "no table: $(head -c 300 "$W/out.txt")"
  grep -q "^| native |" "$W/run/report.md" && pass "report.md" || fail "report.md lacks the table"
  cp "$W/run/results.csv" "$W/run0.csv"
  # Losses are finite numbers, and at T = L every factor method computes plain RoPE (factor max(1, T / L) = 1).
  /usr/bin/python3 - "$W/run/results.csv" <<'PY' && pass "losses finite; factor methods = rope at L" || fail "results.csv values"
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert all(math.isfinite(float(r["tail_loss"])) and math.isfinite(float(r["full_loss"])) for r in rows)
at_l = {r["method"]: float(r["tail_loss"]) for r in rows if r["length"] == "16"}
for m in ("pi", "ntk", "ntk_mixed", "dynamic", "yarn"):
    assert abs(at_l[m] - at_l["rope"]) < 1e-9 * abs(at_l["rope"]), (m, at_l[m], at_l["rope"])
# The windows' scored tokens are the same at every length: whole-window loss at T = L equals the tail loss.
for r in rows:
    if r["length"] == "16":
        assert abs(float(r["full_loss"]) - float(r["tail_loss"])) < 1e-9 * abs(float(r["tail_loss"]))
PY
else
  fail "perplexity exited $?: $(tail -c 500 "$W/err.txt")"
fi

# A rerun reuses every cell (nothing computed again), and the table is the same.
if "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16,32,64 --methods "$ALL" --logn both \
     --window 8 --windows 2 --out "$W/run" > "$W/out2.txt" 2> "$W/err2.txt"; then
  reused=$(grep -c "done earlier" "$W/err2.txt")
  [ "$reused" = 54 ] && pass "rerun reuses all 54 cells" || fail "rerun reused $reused of 54 cells"
  # (the last line, "report: ... (N s)", holds this invocation's time)
  diff <(grep -v '^report:' "$W/out.txt") <(grep -v '^report:' "$W/out2.txt") > /dev/null \
    && pass "rerun table" || fail "rerun printed another table: $(diff "$W/out.txt" "$W/out2.txt" | head -5)"
else
  fail "rerun exited $?"
fi
# Another text: the cells are not reused.
head -c 3000 "$SRC/docs/testing.md" > "$W/other.txt"
"$ROTARY" perplexity "$FIX/llama3" --text "$W/other.txt" --lengths 16 --methods native --window 8 --out "$W/run" \
  > /dev/null 2> "$W/err3.txt"
grep -q "done earlier" "$W/err3.txt" && fail "a cell of another text was reused" || pass "another text is scored again"

# The same cells on the nn model (--engine torch): the engine's losses agree (both float32: ~1e-6 of a loss of ~4),
# and the engine's own cells are not reused for another runtime or weight format.
if [ -z "$TORCH" ]; then
  :
elif "$TORCH" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16,32,64 --methods native,rerope,dynamic \
     --window 8 --windows 2 --engine torch --out "$W/run" --no-progress > /dev/null 2> "$W/err4.txt"; then
  grep -q "done earlier" "$W/err4.txt" && fail "--engine torch reused the engine's cells" || pass "--engine torch computes its own cells"
  /usr/bin/python3 - "$W/run0.csv" "$W/run/results.csv" <<'PY' && pass "engine and torch losses agree" || fail "engine and torch losses differ"
import csv, sys
engine = {(r["method"], r["logn"], r["length"]): float(r["tail_loss"]) for r in csv.DictReader(open(sys.argv[1]))}
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == 9
for r in rows:  # the CSV keeps 6 significant digits of losses ~17: 2e-4 is its rounding and float32's together
    assert abs(float(r["tail_loss"]) - engine[(r["method"], r["logn"], r["length"])]) < 2e-4, r
PY
else
  fail "perplexity --engine torch exited $?: $(tail -c 300 "$W/err4.txt")"
fi
# (--weights q8 and the block formats take q8 activations unless told otherwise: --activations auto)
for w in "q8 --activations f32" bf16 "bf16 --activations bf16" q8 q8_0 q4_0; do
  tag=${w// /_}
  if "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16,32,64 --methods native --window 8 --windows 2 \
       --weights $w --kv-dtype bf16 --out "$W/q_$tag" --no-progress > /dev/null 2> "$W/err5.txt"; then
    pass "perplexity --weights $w --kv-dtype bf16"
  else
    fail "perplexity --weights $w exited $?: $(tail -c 300 "$W/err5.txt")"
  fi
done
/usr/bin/python3 - "$W/run0.csv" "$W/q_q8_--activations_f32/results.csv" "$W/q_bf16/results.csv" \
  "$W/q_bf16_--activations_bf16/results.csv" "$W/q_q8/results.csv" "$W/q_q8_0/results.csv" "$W/q_q4_0/results.csv" \
  <<'PY' && pass "q8, q8_0 and bf16 (f32, bf16 and q8 activations) losses within 0.1 of the float32 ones, q4_0 within 1.0" || fail "q8 / q8_0 / q4_0 / bf16 losses"
import csv, sys
base = {(r["method"], r["length"]): float(r["tail_loss"]) for r in csv.DictReader(open(sys.argv[1])) if r["logn"] == "0"}
for path in sys.argv[2:]:
    # Q4_0's step is its block's max |w| / 8, 16x q8's, on logits of +-40 (random weights): measured 0.15-0.58 (q8: 0.02)
    bound = 1.0 if "q4_0" in path else 0.1
    for r in csv.DictReader(open(path)):
        ref = base[(r["method"], r["length"])]
        assert abs(float(r["tail_loss"]) - ref) < bound, (path, r, ref)
PY
[ -n "$TORCH" ] && expect_error "perplexity --engine torch --kv-dtype bf16" 2 "--kv-dtype = bf16" -- \
  "$TORCH" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --engine torch --kv-dtype bf16 --out "$W/x"
expect_error "perplexity --weights int4" 2 "--weights = \"int4\"" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --weights int4 --out "$W/x"
# --activations auto resolves before the cells are keyed: --weights q8's cells are those of --activations q8.
"$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16,32,64 --methods native --window 8 --windows 2 \
  --weights q8 --activations q8 --kv-dtype bf16 --out "$W/q_q8" > /dev/null 2> "$W/err6.txt"
reused=$(grep -c "done earlier" "$W/err6.txt")
[ "$reused" = 3 ] && pass "--weights q8 (auto) and --activations q8 share their cells" \
  || fail "--activations q8 reused $reused of auto's 3 cells: $(tail -c 300 "$W/err6.txt")"
expect_error "perplexity --weights q4_k on rows of 32" 2 "rows of a whole number of q4_k blocks (256 weights" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --weights q4_k --out "$W/x"
[ -n "$TORCH" ] && expect_error "perplexity --activations q8 with --engine torch" 2 "--activations = q8" -- \
  "$TORCH" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --engine torch --activations q8 --out "$W/x"
expect_error "perplexity --activations bf16 --weights q8" 2 "--activations = bf16 with --weights q8" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --weights q8 --activations bf16 --out "$W/x"
expect_error "perplexity --activations q8 --weights bf16" 2 "--activations = q8 with --weights bf16" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --weights bf16 --activations q8 --out "$W/x"
expect_error "perplexity --activations q8 as stored" 2 "q8 with tensor" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --activations q8 --out "$W/x"
expect_error "perplexity --activations f16" 2 "--activations = \"f16\"" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --activations f16 --out "$W/x"
expect_error "generate --activations bf16 on f16 weights" 2 "stored as f16" -- \
  "$ROTARY" generate "$FIX/mistral" --prompt x --max-new 1 --activations bf16
# A setting that nothing reads is refused, not silently dropped: a method's parameter without the method, a
# scaling parameter without a scaling that reads it (mistral's config has no rope_scaling).
expect_error "perplexity --leaky-k without leaky_rerope" 2 "--leaky-k" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --methods native,rerope --leaky-k 4 --out "$W/x"
expect_error "perplexity --dynamic-factor without dynamic" 2 "--dynamic-factor" -- \
  "$ROTARY" perplexity "$FIX/llama3" --text "$W/text.txt" --lengths 16 --methods native --dynamic-factor 2 --out "$W/x"
echo 1 2 3 > "$W/ids3.txt"
expect_error "generate --factor without a scaling" 2 "--factor = 4" -- \
  "$ROTARY" generate "$FIX/mistral" --prompt-tokens "$W/ids3.txt" --max-new 1 --factor 4
expect_error "generate --original-max with linear" 2 "--original-max = 64" -- \
  "$ROTARY" generate "$FIX/mistral" --prompt-tokens "$W/ids3.txt" --max-new 1 --scaling linear --factor 2 --original-max 64

# Token ids, on the partial-rotation family (no tokenizer in that fixture).
/usr/bin/python3 -c "import random; random.seed(1); print(' '.join(str(random.randrange(64)) for _ in range(200)))" > "$W/ids.txt"
if "$ROTARY" perplexity "$FIX/gpt_neox" --tokens "$W/ids.txt" --train-len 16 --lengths 16,48 --methods "$ALL" \
     --window 8 --out "$W/neox" --no-progress > /dev/null 2> "$W/err4.txt"; then
  pass "perplexity: gpt_neox from token ids"
else
  fail "perplexity gpt_neox exited $?: $(tail -c 500 "$W/err4.txt")"
fi

# Bad settings and inputs: refused, naming the setting; no cell written.
bad() {  # <what grep must find> <flags...>
  local text=$1
  shift
  expect_error "refused: $text" 2 "$text" -- "$ROTARY" perplexity "$FIX/llama3" --out "$W/bad" --no-progress "$@"
}
bad "methods = rerope2 is invalid" --text "$W/text.txt" --methods native,rerope2
bad "--text / --tokens = both" --text "$W/text.txt" --tokens "$W/ids.txt"
bad "--text / --tokens = neither"
bad "lengths = 8 is invalid" --text "$W/text.txt" --lengths 8,16
bad "windows x (longest length + 1)" --text "$W/text.txt" --lengths 4k --windows 1
bad "window = 40 is invalid" --text "$W/text.txt" --methods rerope --window 40 --lengths 32
bad "--logn = sometimes" --text "$W/text.txt" --logn sometimes
printf '1 2 x 4\n' > "$W/bad_ids.txt"
bad "x" --tokens "$W/bad_ids.txt"
expect_error "refused: not a checkpoint" 2 "a readable config.json" -- \
  "$ROTARY" perplexity "$SRC/tests/data/hf_tokenizers/llama3_style" --text "$W/text.txt" --out "$W/bad" 2>/dev/null
[ ! -d "$W/bad/cells" ] && pass "refused runs wrote no cell" || fail "a refused run wrote cells"

# generate on a checkpoint: its tokenizer in and out, the KV-cache decoder, an override.
if "$ROTARY" generate "$FIX/llama3" --prompt "In the beginning" --max-new 8 --kind rerope --window 4 > "$W/gen.txt"; then
  grep -q "^In the beginning" "$W/gen.txt" && pass "generate on a checkpoint" || fail "generate printed $(cat "$W/gen.txt")"
else
  fail "generate exited $?"
fi
# The engine (default) and the nn model (--engine torch) generate the same greedy text; q8 weights and a bf16
# cache run too.
if [ -z "$TORCH" ]; then
  :
elif "$TORCH" generate "$FIX/llama3" --prompt "In the beginning" --max-new 8 --kind rerope --window 4 --engine torch \
     > "$W/gen_torch.txt"; then
  cmp -s "$W/gen.txt" "$W/gen_torch.txt" && pass "generate: engine = torch" \
    || fail "generate: engine printed '$(cat "$W/gen.txt")', torch '$(cat "$W/gen_torch.txt")'"
else
  fail "generate --engine torch exited $?"
fi
"$ROTARY" generate "$FIX/llama3" --prompt "In the beginning" --max-new 4 --weights q8 --kv-dtype f16 > /dev/null 2> "$W/gen_q8.err" \
  && pass "generate --weights q8 --kv-dtype f16" || fail "generate --weights q8 exited $?: $(cat "$W/gen_q8.err")"
"$ROTARY" generate "$FIX/llama3" --prompt "In the beginning" --max-new 4 --kv-dtype q8 --kind rerope --window 3 \
  > /dev/null 2> "$W/gen_kv8.err" \
  && pass "generate --kv-dtype q8 --kind rerope" || fail "generate --kv-dtype q8 exited $?: $(cat "$W/gen_kv8.err")"
"$ROTARY" generate "$FIX/llama3" --prompt "In the beginning" --max-new 4 --activations bf16 > /dev/null 2> "$W/gen_a.err" \
  && pass "generate --activations bf16" || fail "generate --activations bf16 exited $?: $(cat "$W/gen_a.err")"
# Token ids in and out (no tokenizer): the prompt's ids, then --max-new ids in the vocabulary; engine = torch path.
echo "1 5 9 200 7" > "$W/prompt_ids.txt"
if "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/prompt_ids.txt" --max-new 6 --no-stop > "$W/gen_ids.txt" \
   && { [ -z "$TORCH" ] || "$TORCH" generate "$FIX/llama3" --prompt-tokens "$W/prompt_ids.txt" --max-new 6 --no-stop \
        --only-new --engine torch > "$W/gen_ids_torch.txt"; }; then
  read -r -a ids < "$W/gen_ids.txt"
  [ -z "$TORCH" ] || read -r -a new_ids < "$W/gen_ids_torch.txt"
  vocab=$(/usr/bin/python3 -c "import json; print(json.load(open('$FIX/llama3/config.json'))['vocab_size'])")
  in_vocab=1
  for t in "${ids[@]}"; do [ "$t" -ge 0 ] && [ "$t" -lt "$vocab" ] || in_vocab=0; done
  [ "${#ids[@]}" = 11 ] && [ "${ids[*]:0:5}" = "1 5 9 200 7" ] && [ "$in_vocab" = 1 ] \
    && pass "generate --prompt-tokens: the prompt's ids, then 6 ids in the vocabulary" \
    || fail "generate --prompt-tokens printed '$(cat "$W/gen_ids.txt")'"
  if [ -n "$TORCH" ]; then
    [ "${ids[*]:5}" = "${new_ids[*]}" ] && pass "generate --prompt-tokens: engine = torch" \
      || fail "generate --prompt-tokens: engine '${ids[*]:5}', torch '${new_ids[*]}'"
  fi
else
  fail "generate --prompt-tokens exited $?"
fi
echo "1 5 999999" > "$W/bad_ids.txt"
expect_error "generate --prompt-tokens with an id past the vocabulary" 2 "token 3 (line 1) = 999999" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/bad_ids.txt" --max-new 1
expect_error "generate --prompt with --prompt-tokens" 2 "exactly one" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --prompt-tokens "$W/prompt_ids.txt" --max-new 1

# Through a retrieval memory (--memory): with every row retrieved the losses are full attention's (the memory row
# equals native's, ReRoPE's with policy rerope), the window alone differs; generate through the memory prints the
# same greedy text and reads a prompt from a file; what cannot run with a memory is refused by name.
if "$ROTARY" perplexity "$FIX/llama2" --tokens "$W/ids.txt" --train-len 16 --lengths 16,48 --methods native \
     --memory exact --memory-window 4 --top-k 100000 --out "$W/mem" --no-progress > "$W/mem.txt" 2> "$W/mem.err" &&
   "$ROTARY" perplexity "$FIX/llama2" --tokens "$W/ids.txt" --train-len 16 --lengths 48 --methods rerope --window 4 \
     --memory rerope --memory-window 6 --top-k 100000 --out "$W/mem_rerope" --no-progress > /dev/null 2>> "$W/mem.err"; then
  pass "perplexity --memory exact / rerope"
  /usr/bin/python3 - "$W/mem/results.csv" "$W/mem_rerope/results.csv" <<'PY' && pass "memory with every row = full attention; the window alone differs" || fail "memory losses: $(cat "$W/mem/results.csv")"
import csv, sys
for path, base in ((sys.argv[1], "native"), (sys.argv[2], "rerope_w4")):
    rows = {(r["method"], r["length"]): float(r["full_loss"]) for r in csv.DictReader(open(path))}
    lengths = {length for _, length in rows}
    assert len(rows) == 3 * len(lengths), rows
    for length in lengths:
        full = rows[(base, length)]
        memory = [v for (m, l), v in rows.items() if l == length and "+memory_" in m]
        window = [v for (m, l), v in rows.items() if l == length and "+window_" in m]
        assert len(memory) == 1 and len(window) == 1, rows
        assert abs(memory[0] - full) < 1e-5 * abs(full), (path, length, memory, full)
        assert abs(window[0] - full) > 1e-3, (path, length, window, full)
PY
  grep -q "native + memory (exact, W 4, top-100000)" "$W/mem.txt" && pass "memory rows labelled" || fail "labels: $(cat "$W/mem.txt")"
else
  fail "perplexity --memory exited $?: $(tail -c 500 "$W/mem.err")"
fi
head -c 400 "$SRC/README.md" > "$W/prompt.txt"
"$ROTARY" generate "$FIX/llama3" --prompt-file "$W/prompt.txt" --max-new 8 --only-new > "$W/gen_plain.txt" 2> /dev/null
if "$ROTARY" generate "$FIX/llama3" --prompt-file "$W/prompt.txt" --max-new 8 --only-new --memory exact \
     --memory-window 16 --top-k 100000 > "$W/gen_mem.txt" 2> "$W/gen_mem.err"; then
  cmp -s "$W/gen_plain.txt" "$W/gen_mem.txt" && pass "generate --memory (every row) = generate" \
    || fail "generate --memory printed '$(cat "$W/gen_mem.txt")', without '$(cat "$W/gen_plain.txt")'"
  grep -q "tokens in each layer's memory" "$W/gen_mem.err" && pass "generate --memory reports the memory" \
    || fail "no memory summary: $(cat "$W/gen_mem.err")"
else
  fail "generate --memory exited $?: $(cat "$W/gen_mem.err")"
fi
# The page search, certified, retrieves the scan's rows (the same text), and so does FAISS's flat index; its HNSW
# graph and IVF lists run and report their work (approximate: their text is not compared). The query-routed graph
# scans a memory below its min_graph_rows (4096) exactly: here, the scan's text. (--page-size only for the page
# searches: the others refuse it.)
for search in kdtree pages faiss-flat faiss-hnsw faiss-ivf graph; do
  pages=(); [[ $search == pages || $search == kdtree ]] && pages=(--page-size 4)
  "$ROTARY" generate "$FIX/llama3" --prompt-file "$W/prompt.txt" --max-new 8 --only-new --memory exact \
    --memory-window 16 --top-k 3 --search $search "${pages[@]}" > "$W/gen_$search.txt" 2> "$W/gen_$search.err" \
    || fail "generate --search $search exited $?: $(cat "$W/gen_$search.err")"
done
"$ROTARY" generate "$FIX/llama3" --prompt-file "$W/prompt.txt" --max-new 8 --only-new --memory exact \
  --memory-window 16 --top-k 3 > "$W/gen_scan.txt" 2> /dev/null
cmp -s "$W/gen_scan.txt" "$W/gen_kdtree.txt" && cmp -s "$W/gen_scan.txt" "$W/gen_pages.txt" \
  && pass "generate --search kdtree / pages (certified) = the exact scan" || fail "certified search printed other text"
cmp -s "$W/gen_scan.txt" "$W/gen_faiss-flat.txt" && pass "generate --search faiss-flat = the exact scan" \
  || fail "faiss-flat printed '$(cat "$W/gen_faiss-flat.txt")', the scan '$(cat "$W/gen_scan.txt")'"
cmp -s "$W/gen_scan.txt" "$W/gen_graph.txt" && pass "generate --search graph (below its min rows) = the exact scan" \
  || fail "graph printed '$(cat "$W/gen_graph.txt")', the scan '$(cat "$W/gen_scan.txt")'"
for search in kdtree faiss-flat faiss-ivf graph; do
  grep -q "the search scored" "$W/gen_$search.err" && pass "generate --search $search reports the search's work" \
    || fail "no search work for $search: $(cat "$W/gen_$search.err")"
done
[ "$(wc -w < "$W/gen_faiss-hnsw.txt")" -ge 1 ] && pass "generate --search faiss-hnsw generates" \
  || fail "faiss-hnsw printed nothing: $(cat "$W/gen_faiss-hnsw.err")"
# Through perplexity: with every row wanted, FAISS's flat index and IVF lists (all of them probed at this size)
# give full attention's loss, as does the graph (below its min rows: the scan).
for search in faiss-flat faiss-ivf graph; do
  "$ROTARY" perplexity "$FIX/llama2" --tokens "$W/ids.txt" --train-len 16 --lengths 48 --methods native \
    --memory exact --memory-window 4 --top-k 100000 --search $search --out "$W/mem_$search" --no-progress \
    > /dev/null 2> "$W/mem_$search.err" || fail "perplexity --search $search exited $?: $(tail -c 300 "$W/mem_$search.err")"
  /usr/bin/python3 - "$W/mem_$search/results.csv" "$search" <<'PY' && pass "perplexity --search $search, every row = full attention" || fail "perplexity --search $search losses: $(cat "$W/mem_$search/results.csv")"
import csv, sys
rows = {r["method"]: float(r["full_loss"]) for r in csv.DictReader(open(sys.argv[1]))}
memory = [v for m, v in rows.items() if "+memory_" in m and m.endswith("_" + sys.argv[2])]
assert len(memory) == 1, rows
assert abs(memory[0] - rows["native"]) < 1e-5 * abs(rows["native"]), rows
PY
done
# A prompt read once and saved (--save-context), continued in a later run (--context): the rest of the prompt after
# the saved part prints what the whole prompt prints in one run (the split falls on a whole memory chunk: 48 = 3 x W).
tr ' ' '\n' < "$W/ids.txt" | head -48 | tr '\n' ' ' > "$W/part1.txt"
tr ' ' '\n' < "$W/ids.txt" | sed -n 49,80p | tr '\n' ' ' > "$W/part2.txt"
tr ' ' '\n' < "$W/ids.txt" | head -80 | tr '\n' ' ' > "$W/whole.txt"
MEM=(--memory exact --memory-window 16 --top-k 3 --no-progress)
if "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/whole.txt" --max-new 6 --only-new "${MEM[@]}" > "$W/ctx_whole.txt" &&
   "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/part1.txt" --max-new 0 --save-context "$W/ctx" "${MEM[@]}" \
     > /dev/null &&
   "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/part2.txt" --max-new 6 --only-new --context "$W/ctx" \
     "${MEM[@]}" > "$W/ctx_rest.txt" 2> "$W/ctx.err"; then
  [ -s "$W/ctx_whole.txt" ] && cmp -s "$W/ctx_whole.txt" "$W/ctx_rest.txt" \
    && pass "generate --context continues a --save-context as one run" \
    || fail "after the context '$(cat "$W/ctx_rest.txt")', in one run '$(cat "$W/ctx_whole.txt")'"
  [ -f "$W/ctx/layer0.memory" ] && [ -f "$W/ctx/layer1.window" ] && pass "the context's files" || fail "$(ls "$W/ctx")"
else
  fail "generate --save-context / --context exited $?: $(cat "$W/ctx.err")"
fi
# The query-routed graph (--search graph) saved with the context (layer<i>.search) and read back by the next run
# instead of built again: 4,800 tokens leave more than the graph's 4,096 rows in the memory, so it is built in the
# first run; the continued run prints what one run prints; a damaged search file is refused, naming it.
/usr/bin/python3 -c "import random; random.seed(2); print(' '.join(str(random.randrange(64)) for _ in range(4832)))" \
  > "$W/gids.txt"
tr ' ' '\n' < "$W/gids.txt" | head -4800 | tr '\n' ' ' > "$W/gpart1.txt"
tr ' ' '\n' < "$W/gids.txt" | sed -n 4801,4832p | tr '\n' ' ' > "$W/gpart2.txt"
GMEM=(--memory exact --memory-window 16 --top-k 3 --no-progress --search graph)
if "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/gids.txt" --max-new 6 --only-new "${GMEM[@]}" > "$W/g_whole.txt" &&
   "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/gpart1.txt" --max-new 0 --save-context "$W/gctx" "${GMEM[@]}" \
     > /dev/null &&
   "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/gpart2.txt" --max-new 6 --only-new --context "$W/gctx" \
     "${GMEM[@]}" > "$W/g_rest.txt" 2> "$W/gctx.err"; then
  [ -s "$W/g_whole.txt" ] && cmp -s "$W/g_whole.txt" "$W/g_rest.txt" && [ -s "$W/gctx/layer0.search" ] &&
    [ -s "$W/gctx/layer1.search" ] && pass "generate --search graph: the graph saved with the context, read back" ||
    fail "graph context: '$(cat "$W/g_rest.txt")' against '$(cat "$W/g_whole.txt")'; $(ls "$W/gctx")"
  head -c 1000 "$W/gctx/layer0.search" > "$W/g_cut" && mv "$W/g_cut" "$W/gctx/layer0.search"
  expect_error "generate --context, a damaged search file" 2 "$W/gctx/layer0.search" -- \
    "$ROTARY" generate "$FIX/llama2" --prompt-tokens "$W/gpart2.txt" --max-new 2 --context "$W/gctx" "${GMEM[@]}"
else
  fail "generate --search graph --save-context / --context exited $?: $(cat "$W/gctx.err")"
fi
expect_error "generate --context, other memory settings" 2 "$W/ctx/context.json" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/part2.txt" --context "$W/ctx" --memory exact \
  --memory-window 8 --top-k 3
# Without a memory the context is each layer's KV cache (layer<i>.kv; bitwise continuation: tests/engine/test_saved_context.cpp):
# the second run reads it and generates after the rest of the prompt; another --kv-dtype is refused by the manifest.
if "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/part1.txt" --max-new 0 --save-context "$W/kvctx" \
     --kv-dtype q8 --no-progress > /dev/null 2> "$W/kvctx.err" &&
   "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/part2.txt" --max-new 5 --only-new --context "$W/kvctx" \
     --kv-dtype q8 --no-progress > "$W/kvctx_rest.txt" 2>> "$W/kvctx.err"; then
  [ "$(wc -w < "$W/kvctx_rest.txt")" -eq 5 ] && [ -f "$W/kvctx/layer0.kv" ] && [ -f "$W/kvctx/layer1.kv" ] \
    && pass "generate --save-context / --context without a memory (q8 KV cache)" \
    || fail "kv context: '$(cat "$W/kvctx_rest.txt")', files $(ls "$W/kvctx")"
else
  fail "generate --save-context / --context without a memory exited $?: $(cat "$W/kvctx.err")"
fi
expect_error "generate --context, another --kv-dtype" 2 "$W/kvctx/context.json" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt-tokens "$W/part2.txt" --context "$W/kvctx" --kv-dtype bf16
[ -n "$TORCH" ] && expect_error "generate --save-context on the torch path" 2 "--save-context" -- \
  "$TORCH" generate "$FIX/llama3" --prompt x --save-context "$W/ctx2" --engine torch
expect_error "generate --search hnsw" 2 "--search = hnsw" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory exact --search hnsw
expect_error "generate --search faiss-annoy" 2 "--search = faiss-annoy" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory exact --search faiss-annoy
expect_error "generate --search graph0" 2 "--search = graph0" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory exact --search graph0
expect_error "generate --memory bogus" 2 "--memory = bogus" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory bogus
expect_error "generate --memory --engine torch" 2 "--engine = torch" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory exact --engine torch
expect_error "generate --memory --kv-dtype bf16" 2 "--kv-dtype = bf16" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory exact --kv-dtype bf16
expect_error "generate --memory --kv-dtype q8" 2 "--kv-dtype = q8" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --memory exact --kv-dtype q8
expect_error "generate --kv-dtype q4" 2 "--kv-dtype = q4" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --kv-dtype q4
[ -n "$TORCH" ] && expect_error "generate --engine torch --kv-dtype q8" 2 "--kv-dtype = q8" -- \
  "$TORCH" generate "$FIX/llama3" --prompt x --engine torch --kv-dtype q8
expect_error "generate --prompt and --prompt-file" 2 "--prompt / --prompt-file / --prompt-tokens / --messages = 2" -- \
  "$ROTARY" generate "$FIX/llama3" --prompt x --prompt-file "$W/prompt.txt"
bad "--methods = dynamic" --text "$W/text.txt" --methods native,dynamic --memory exact
bad "--memory-dtype = f64" --text "$W/text.txt" --methods native --memory exact --memory-dtype f64
bad "--engine = torch" --text "$W/text.txt" --methods native --memory exact --engine torch

echo "$fails failed"
[ "$fails" = 0 ]
