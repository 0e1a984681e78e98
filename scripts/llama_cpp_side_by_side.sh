#!/usr/bin/env bash
# llama.cpp and rotary's engine side by side on IDENTICAL weights (a llama or qwen2 Hugging Face model directory and
# the GGUF files scripts/gguf_from_checkpoint.py writes from it), for the comparison table in docs/checkpoints.md.
#
#   scripts/llama_cpp_side_by_side.sh LLAMA_BUILD_DIR GGUF_PY_DIR MODEL_DIR [options]
#
#   LLAMA_BUILD_DIR  a llama.cpp CMake build directory with bin/llama-bench and bin/llama-simple (built by you;
#                    nothing of llama.cpp is in this repository)
#   GGUF_PY_DIR      llama.cpp's gguf-py directory (imported by gguf_from_checkpoint.py at run time)
#   MODEL_DIR        the Hugging Face model directory (random weights: scripts/make_random_checkpoint.py; a
#                    byte-level tokenizer is added to it when it has none)
#   --work DIR       where the GGUF files, logs and raw results go (default /tmp/rotary-vs-llamacpp)
#   --rounds N       rounds of the 512-token prefill / 128-token decode measurement (default 3)
#   --reps N         timed repetitions per run, both runtimes (default 2; each run adds one untimed warm-up:
#                    llama-bench's own, and rotary's first trial, which is dropped)
#   --no-4096        skip the 4096-token prefill (about 20 s a repetition per runtime and format on 2 cores)
#   --threads N      threads for both (default 2)
#   --rotary PATH    rotary binary (default build/lab/rotary of this repository)
#   --summary-only   run nothing: print the table and the greedy check again from WORK's results
#
# What is timed, per runtime and weight format (bf16 as stored; q8: llama.cpp's Q8_0 GGUF from gguf-py's
# quantizer, rotary `--weights q8` converted at load; both int8 blocks of 32 with one scale):
#   prefill 512 tok/s   llama-bench -p 512 -n 0        | rotary bench checkpoint --prompt 512 (its prefill)
#   decode tok/s        llama-bench -p 0 -n 128 -d 512 | rotary bench checkpoint --prompt 512 --decode 128
#                       (128 tokens generated after a 512-token context, in both)
#   prefill 4096 tok/s  llama-bench -p 4096 -n 0       | rotary bench checkpoint --prompt 4096 --decode 1
#   peak RSS            /usr/bin/time -v "Maximum resident set size" of the 512/128 runs (llama.cpp: the larger of
#                       its two invocations); rotary's own peak_rss_bytes (the same getrusage number, read before
#                       its bandwidth probe allocates a buffer - the time -v value, which includes that buffer, is
#                       kept in the raw results too)
# Runs alternate between the runtimes (the first runtime changes every round), so that machine noise hits both;
# each cell is the median over all timed repetitions of all rounds (a second table gives each cell's min - max:
# a busy machine shows as a wide range). llama.cpp runs with its defaults otherwise
# (KV cache f16, flash attention auto); rotary with its defaults (KV cache f32), and for bf16 also with
# `--activations bf16` (the row "bf16, activations bf16": llama.cpp's bf16 arithmetic, activations rounded to bf16
# for the CPU's bf16 dot products), and for q8 also with `--activations q8` (the row "q8, activations q8":
# llama.cpp's Q8_0 arithmetic, activations quantized to int8 blocks of 32 for the CPU's int8 dot products).
#
# Then a greedy check: the same text prompt through `rotary generate --temperature 0 --max-new 32` and through
# llama-simple (greedy sampler, -n 32), both from the bf16 weights; the generated texts are cut into tokens (a
# filler token of the byte tokenizer prints as "[id]", anything else as single characters) and the script prints
# how many of the first 32 agree and the first index where they differ.
#
# Prints: a markdown table (runtime+weights | prefill 512 tok/s | prefill 4096 tok/s | decode tok/s | peak RSS),
# the greedy agreement, and where the raw results are (WORK/results.jsonl, WORK/logs/).
set -euo pipefail

usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 3 ]] || usage
LLAMA_BUILD=$(realpath "$1"); GGUF_PY=$(realpath "$2"); MODEL=$(realpath "$3"); shift 3
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=/tmp/rotary-vs-llamacpp; ROUNDS=3; REPS=2; DO4096=1; THREADS=2; ROTARY="$REPO/build/lab/rotary"; SUMMARY_ONLY=0
PROMPT_TEXT="The capital of France is Paris, and the river that runs through it is the"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --work) WORK=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --no-4096) DO4096=0; shift ;;
    --threads) THREADS=$2; shift 2 ;;
    --rotary) ROTARY=$2; shift 2 ;;
    --summary-only) SUMMARY_ONLY=1; shift ;;
    *) echo "unknown option $1" >&2; usage ;;
  esac
done
PY=${PYTHON:-/usr/bin/python3}
BENCH="$LLAMA_BUILD/bin/llama-bench"; SIMPLE="$LLAMA_BUILD/bin/llama-simple"
for f in "$BENCH" "$SIMPLE" "$ROTARY" /usr/bin/time; do
  [[ -x "$f" ]] || { echo "missing executable: $f" >&2; exit 2; }
done
mkdir -p "$WORK/logs"
RESULTS="$WORK/results.jsonl"
if (( ! SUMMARY_ONLY )); then
: > "$RESULTS"

# GGUF files of the model directory (written once; delete them to rewrite).
for w in bf16 q8_0; do
  if [[ ! -s "$WORK/model-$w.gguf" ]]; then
    echo "writing $WORK/model-$w.gguf" >&2
    "$PY" "$REPO/scripts/gguf_from_checkpoint.py" "$MODEL" --gguf-py "$GGUF_PY" --add-byte-tokenizer \
      --outtype "$w" --out "$WORK/model-$w.gguf" >&2
  fi
done

# max RSS in kB from a /usr/bin/time -v log
rss_kb() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }

# llama_run TAG WEIGHTS ARGS...: one llama-bench invocation, its samples and RSS appended to results.jsonl
llama_run() {
  local tag=$1 w=$2; shift 2
  local log="$WORK/logs/llama-$tag-$w-$(date +%s%N)"
  /usr/bin/time -v -o "$log.time" "$BENCH" -m "$WORK/model-$w.gguf" -t "$THREADS" -r "$REPS" -o json "$@" \
    > "$log.json" 2> "$log.err"
  "$PY" - "$log.json" "$(rss_kb "$log.time")" "$tag" "$w" >> "$RESULTS" <<'EOF'
import json, sys
runs = json.load(open(sys.argv[1]))
for r in runs:
    metric = "decode" if r["n_gen"] > 0 else f"prefill{r['n_prompt']}"
    print(json.dumps({"runtime": "llama.cpp", "weights": sys.argv[4], "metric": metric, "samples": r["samples_ts"],
                      "rss_kb": int(sys.argv[2]), "tag": sys.argv[3], "flash_attn": r.get("flash_attn"),
                      "type_k": r.get("type_k"), "build": r.get("build_commit")}))
EOF
}

# rotary_run TAG WEIGHTS PROMPT DECODE: one rotary bench checkpoint invocation (REPS + 1 trials, the first dropped)
rotary_run() {
  local tag=$1 w=$2 prompt=$3 decode=$4
  local log="$WORK/logs/rotary-$tag-$w-$(date +%s%N)"
  local extra=()
  [[ $w == q8_0 ]] && extra=(--weights q8)
  [[ $w == bf16a ]] && extra=(--activations bf16)  # bf16 activations: llama.cpp's bf16 arithmetic
  [[ $w == q8a ]] && extra=(--weights q8 --activations q8)  # q8 activations: llama.cpp's Q8_0 arithmetic
  /usr/bin/time -v -o "$log.time" "$ROTARY" bench checkpoint --model "$MODEL" --prompt "$prompt" \
    --decode "$decode" --trials $((REPS + 1)) --threads "$THREADS" --json "${extra[@]}" > "$log.json" 2> "$log.err"
  "$PY" - "$log.json" "$(rss_kb "$log.time")" "$tag" "$w" "$prompt" "$decode" >> "$RESULTS" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])
time_rss = int(sys.argv[2])
base = {"runtime": "rotary", "weights": sys.argv[4], "tag": sys.argv[3], "rss_kb": j["peak_rss_bytes"] // 1024,
        "time_v_rss_kb": time_rss}
print(json.dumps(dict(base, metric=f"prefill{sys.argv[5]}", samples=j["prefill_trials"][1:])))
if int(sys.argv[6]) > 1:
    print(json.dumps(dict(base, metric="decode", samples=j["decode_trials"][1:])))
EOF
}

echo "== $ROUNDS rounds of prefill 512 / decode 128 (reps $REPS, threads $THREADS)" >&2
for ((r = 1; r <= ROUNDS; r++)); do
  for w in bf16 q8_0; do
    if (( r % 2 == 1 )); then
      llama_run r$r "$w" -p 512 -n 0; llama_run r$r "$w" -p 0 -n 128 -d 512; rotary_run r$r "$w" 512 128
      [[ $w == bf16 ]] && rotary_run r$r bf16a 512 128
      [[ $w == q8_0 ]] && rotary_run r$r q8a 512 128
    else
      [[ $w == bf16 ]] && rotary_run r$r bf16a 512 128
      [[ $w == q8_0 ]] && rotary_run r$r q8a 512 128
      rotary_run r$r "$w" 512 128; llama_run r$r "$w" -p 512 -n 0; llama_run r$r "$w" -p 0 -n 128 -d 512
    fi
    echo "   round $r $w done" >&2
  done
done
if (( DO4096 )); then
  echo "== prefill 4096 (reps $REPS)" >&2
  for w in bf16 q8_0; do
    llama_run p4096 "$w" -p 4096 -n 0; rotary_run p4096 "$w" 4096 1
    [[ $w == bf16 ]] && rotary_run p4096 bf16a 4096 1
    [[ $w == q8_0 ]] && rotary_run p4096 q8a 4096 1
    echo "   4096 $w done" >&2
  done
fi

# Greedy check (bf16 weights): generated texts of both runtimes, cut into tokens.
echo "== greedy check" >&2
"$ROTARY" generate "$MODEL" --prompt "$PROMPT_TEXT" --max-new 32 --temperature 0 --only-new \
  --threads "$THREADS" > "$WORK/greedy-rotary.txt" 2> "$WORK/logs/greedy-rotary.err"
"$ROTARY" generate "$MODEL" --prompt "$PROMPT_TEXT" --max-new 32 --temperature 0 --only-new \
  --threads "$THREADS" --kv-dtype f16 > "$WORK/greedy-rotary-kvf16.txt" 2> "$WORK/logs/greedy-rotary-kvf16.err"
"$ROTARY" generate "$MODEL" --prompt "$PROMPT_TEXT" --max-new 32 --temperature 0 --only-new \
  --threads "$THREADS" --activations bf16 > "$WORK/greedy-rotary-actbf16.txt" 2> "$WORK/logs/greedy-rotary-actbf16.err"
"$SIMPLE" -m "$WORK/model-bf16.gguf" -n 32 "$PROMPT_TEXT" > "$WORK/greedy-llama.txt" 2> "$WORK/logs/greedy-llama.err"
fi  # SUMMARY_ONLY

"$PY" - "$RESULTS" "$WORK" "$PROMPT_TEXT" <<'EOF'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
work, prompt = sys.argv[2], sys.argv[3]
def samples(rt, w, metric):
    return [x for r in rows if r["runtime"] == rt and r["weights"] == w and r["metric"] == metric for x in r["samples"]]
def cell(rt, w, metric):
    s = samples(rt, w, metric)
    return f"{statistics.median(s):.1f}" if s else "-"
def spread(rt, w, metric):
    s = samples(rt, w, metric)
    return f"{min(s):.1f} - {max(s):.1f} (n={len(s)})" if s else "-"
def rss(rt, w):
    v = [r["rss_kb"] for r in rows if r["runtime"] == rt and r["weights"] == w and r["tag"].startswith("r")]
    return f"{max(v) / 1024 / 1024:.2f} GB" if v else "-"
def cpu_description():  # the model name and the SIMD flags the kernels dispatch on: a speed means little without
    model, flags = "unknown", []
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and model == "unknown":
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            flags = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16") if f in have]
            break
    return f"{model} [{' '.join(flags)}]"
print(f"cpu: {cpu_description()}")
print("| runtime, weights | prefill 512 tok/s | prefill 4096 tok/s | decode tok/s (128 after 512) | peak RSS (512/128) |")
print("| --- | ---: | ---: | ---: | ---: |")
names = {"bf16": "bf16", "q8_0": "q8", "bf16a": "bf16, activations bf16", "q8a": "q8, activations q8"}
pairs = [("llama.cpp", "bf16"), ("rotary", "bf16"), ("rotary", "bf16a"), ("llama.cpp", "q8_0"), ("rotary", "q8_0"),
         ("rotary", "q8a")]
for rt, w in pairs:
    print(f"| {rt}, {names[w]} | {cell(rt, w, 'prefill512')} | {cell(rt, w, 'prefill4096')} | "
          f"{cell(rt, w, 'decode')} | {rss(rt, w)} |")
print("\nmin - max of the timed repetitions behind each median (n = repetitions):\n")
print("| runtime, weights | prefill 512 | prefill 4096 | decode |")
print("| --- | ---: | ---: | ---: |")
for rt, w in pairs:
    print(f"| {rt}, {w} | {spread(rt, w, 'prefill512')} | {spread(rt, w, 'prefill4096')} | "
          f"{spread(rt, w, 'decode')} |")
fa = {r.get("flash_attn") for r in rows if r["runtime"] == "llama.cpp"}
tk = {r.get("type_k") for r in rows if r["runtime"] == "llama.cpp"}
bld = {r.get("build") for r in rows if r["runtime"] == "llama.cpp"}
print(f"\nllama.cpp build {sorted(map(str, bld))}, flash_attn {sorted(map(str, fa))}, KV type {sorted(map(str, tk))}; "
      "medians over all timed repetitions (n) of all rounds.")

def units(s):  # a filler token "[id]", the EOS text, or one character
    return re.findall(r"\[\d+\]|<\|endoftext\|>|.", s, re.S)
llama_out = open(f"{work}/greedy-llama.txt", encoding="latin-1").read().removesuffix("\n")
if llama_out.startswith(prompt):
    llama_out = llama_out[len(prompt):]
for name in ("greedy-rotary.txt", "greedy-rotary-kvf16.txt", "greedy-rotary-actbf16.txt"):
    rot = open(f"{work}/{name}", encoding="latin-1").read().removesuffix("\n")
    a, b = units(rot)[:32], units(llama_out)[:32]
    agree = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    print(f"\ngreedy ({name.replace('greedy-', '').replace('.txt', '')} vs llama.cpp, bf16, prompt {prompt!r}): "
          f"{agree}/{max(len(a), len(b))} tokens agree position by position; first difference at index "
          f"{'none' if first is None else first}")
    print(f"  rotary:    {''.join(a)}")
    print(f"  llama.cpp: {''.join(b)}")
print(f"\nraw results: {sys.argv[1]}, logs: {work}/logs/")
EOF
