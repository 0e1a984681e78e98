#!/usr/bin/env bash
# Fuzzes every reader of untrusted bytes (fuzz/, docs/fuzzing.md): builds the libFuzzer targets with clang-14 under
# ASan + UBSan into build-fuzz/, runs each one for the given seconds (default 20) from its seeds, prints the
# executions per target, and fails if any target found something (a crash, a leak, undefined behaviour, an
# exception other than rotary::Error, an input slower than 10 s, more than 2 GB of memory). Its input is then in
# build-fuzz/artifacts/; rerun it with `build-fuzz/fuzz/fuzz_<target> <file>`.
#
#   bash scripts/fuzz.sh                 # 20 s per target (the CI phase of scripts/test.sh)
#   bash scripts/fuzz.sh 600             # longer, on demand
#   bash scripts/fuzz.sh 60 hf_config    # some targets only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-20}"
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: seconds-per-target = '$seconds' is invalid; allowed: an integer >= 1" >&2; exit 2; }
shift $(($# > 0 ? 1 : 0))
all=(hf_config hf_model train_config_toml train_config_json checkpoint task_vocab text_cache safetensors gguf
     gguf_model tokenizer_json spm_model kv_memory memory_pages memory_graph kv_cache context_manifest chat_template server_request)
targets=("${@:-${all[@]}}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: target = '$t' is invalid; allowed: ${all[*]}" >&2; exit 2; }
done
jobs="${ROTARY_JOBS:-$(nproc)}"
build="$root/build-fuzz"

# clang 14 with its libFuzzer runtime, and its OpenMP (the top-level configure requires OpenMP for any compiler).
packages="clang-14 libclang-rt-14-dev libomp-14-dev"
command -v clang++-14 >/dev/null && [[ -f "$(clang++-14 -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]] ||
  { echo "fuzz.sh: clang++-14 with libFuzzer is missing; needed: the Debian packages $packages" >&2; exit 2; }

# -O1 -g without NDEBUG: nlohmann's and the library's assertions stay on, and stacks stay readable.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DROTARY_SANITIZE=ON -DROTARY_FUZZ=ON -DROTARY_WITH_TORCH=OFF \
      -DROTARY_BUILD_TESTS=OFF -DROTARY_BUILD_LAB=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]/#/fuzz_}"

# Seeds: the checked-in corpus of each target, plus the real files of that kind in the repository.
seeds() {
  [[ "$1" == gguf_model ]] || echo "$root/fuzz/corpus/$1"  # gguf_model reads the gguf target's corpus (below)
  case "$1" in
    hf_config) echo "$root/tests/data/hf_configs" ;;
    train_config_toml) echo "$root/examples/runs" ;;
    gguf_model) echo "$root/fuzz/corpus/gguf" ;;  # GGUF files with llama metadata and a tokenizer
    tokenizer_json) echo "$root/tests/data/hf_tokenizers/llama3_style $root/tests/data/hf_tokenizers/gpt2_style" ;;
  esac
}
# Longest input tried: a little over the largest real file of the kind (Phi-3's config.json is 3 KB).
max_len() {
  case "$1" in
    hf_config | train_config_toml | train_config_json | checkpoint | tokenizer_json | spm_model) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p "$build/artifacts" "$build/logs"
# One target's run: its log in logs/<t>.log, its summary line in logs/<t>.verdict, exit status its verdict.
fuzz_one() {
  local t="$1" work="$build/corpus/$1" log="$build/logs/$1.log" rc=0 execs verdict
  mkdir -p "$work"  # what the fuzzer adds to the corpus; the checked-in seeds stay as they are
  local dict=()
  [[ -f "$root/fuzz/dict/$t.dict" ]] && dict=(-dict="$root/fuzz/dict/$t.dict")
  [[ "$t" == gguf_model ]] && dict=(-dict="$root/fuzz/dict/gguf.dict")  # the same format's tokens
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len="$(max_len "$t")" -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "${dict[@]}" "$work" $(seeds "$t") \
    >"$log" 2>&1 || rc=$?
  execs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$" || echo "?")
  if ((rc != 0)); then
    verdict="FOUND SOMETHING (exit $rc; full log: $log)"
  else
    verdict="clean"
  fi
  printf '%-20s %12s executions in %4d s  %s\n' "$t" "$execs" "$seconds" "$verdict" >"$build/logs/$t.verdict"
  return $rc
}

rm -f "$build/logs/"*.verdict
# The targets run `jobs` at a time (each one process, one core): the same seconds per target in 1/jobs of the time.
status=0
running=0
for t in "${targets[@]}"; do
  echo "== fuzz $t (${seconds} s)"
  fuzz_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || status=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || status=1
  running=$((running - 1))
done
echo "== fuzz summary"
for t in "${targets[@]}"; do
  cat "$build/logs/$t.verdict"
  if ! grep -q ' clean$' "$build/logs/$t.verdict"; then
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|artifact_prefix|Test unit written)|uncaught exception' \
      "$build/logs/$t.log" | head -20 || true
  fi
done
exit $status
