#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs every test (C++ core, nn, training, lab,
# CLI, install + find_package consumer), installs the Python package into a fresh venv and runs the Python tests
# there, builds and tests the configuration without libtorch, reruns the suites that run SIMD kernels with Highway capped at
# the lower targets a smaller CPU would use (ROTARY_SIMD_TARGET, see core/src/simd_targets.h), then rebuilds the
# core with ASan+UBSan and runs the core tests again, then fuzzes every reader of untrusted input (scripts/fuzz.sh).
# Prints each phase's time and one closing line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${ROTARY_JOBS:-$(nproc)}"
logs="$root/build/test-logs"
start=$SECONDS
phase_start=$SECONDS
phases=()
phase_done() { phases+=("$(printf '%-34s %4d s' "$1" $((SECONDS - phase_start)))"); phase_start=$SECONDS; }

bash "$root/scripts/setup.sh"
phase_done "setup (Debian, npm packages)"

echo "== build (Release)"
bash "$root/scripts/build.sh"
phase_done "build (Release)"
mkdir -p "$logs"
rm -f "$logs"/*.log
status=0
echo "== tests (Release, best SIMD target)"
# (the torch-free suites and command-line scripts run once, in the build without libtorch below: the same sources;
# the Python tests once, in the venv of the next phase)
ctest --test-dir "$root/build" -j "$jobs" -LE '^(engine|tokenizers|chat|server|torch_free|python)$' \
  --output-on-failure --timeout 900 2>&1 | tee "$logs/release.log" || status=1
phase_done "tests (Release)"

# The Python package as a user installs it: `pip install .` (no index, no download) into a fresh venv over Debian's
# python3, its files checked, and every tests/python file run there from outside the repository
# (docs/python-package.md).
echo "== python package (pip install . into a fresh venv, tests/python there)"
bash "$root/scripts/python_package.sh" 2>&1 | tee "$logs/python-package.log" || status=1
phase_done "python package (venv + tests)"

# The same verdict on a CPU with another instruction set: the kernels' own suites (the core label: the op-case harness
# and every core test) with dispatch capped at each lower target this CPU has (the portable scalar code always).
# The model, Python and CLI suites call the same kernels through the same dispatch and stay on the best target, for
# time (the nn suite took ~80 s a target on 2 cores).
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
targets=()
if grep -qw avx512f <<<"$flags" && grep -qw avx2 <<<"$flags"; then targets+=(avx2); fi  # else AVX2 is the best
if grep -qw sse4_2 <<<"$flags"; then targets+=(sse4); fi
targets+=(scalar)
# The op-case harness's tests (op_compare.*, op_nonfinite.*, op_gradient.*, op_cases) are left out here: each of them
# already ran every case at every target this CPU has, from the best one down, in the Release phase (the harness
# loops over the targets itself, tests/core/op_harness.h), so a lower cap would only repeat targets they covered.
for t in "${targets[@]}"; do
  echo "== tests with ROTARY_SIMD_TARGET=$t (core)"
  ROTARY_SIMD_TARGET=$t ctest --test-dir "$root/build" -j "$jobs" -L '^core$' -E '^op_' --output-on-failure \
    --timeout 900 2>&1 | tee "$logs/simd-$t.log" || status=1
  phase_done "tests (core) at $t"
done

# The build without libtorch (ROTARY_WITH_TORCH=OFF): core, the engine, the tokenizers, chat templates and a rotary
# with every checkpoint command; its engine suite and the CLI scripts that run without torch, its tokens against the
# full build's (tests/cli/test_torch_free.sh). ccache serves the objects it shares with the full build.
echo "== build without libtorch"
cmake -S "$root" -B "$root/build-notorch" -G Ninja -DCMAKE_BUILD_TYPE=Release -DROTARY_WITH_TORCH=OFF >/dev/null
cmake --build "$root/build-notorch" -j "$jobs"
phase_done "build (without libtorch)"
echo "== tests without libtorch (engine, tokenizers, chat, CLI)"
ROTARY_TORCH_BUILD="$root/build/lab/rotary" ctest --test-dir "$root/build-notorch" -j "$jobs" \
  -L "^(engine|tokenizers|chat|server|cli)$" --output-on-failure --timeout 900 2>&1 | tee "$logs/notorch.log" || status=1
phase_done "tests (without libtorch)"

# -O1 -g1 (line tables): the sanitizers' usual level, and half the compile time of -O2 -g (the Highway kernels,
# compiled once per target, are most of this build: 104 s -> 50 s for attention_forward_hwy.cpp alone).
echo "== build (core, ASan+UBSan)"
cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DROTARY_SANITIZE=ON -DROTARY_BUILD_LAB=OFF >/dev/null
cmake --build "$root/build-asan" -j "$jobs"
phase_done "build (core, ASan+UBSan)"
# Every core test but two, which ran in the Release phase: op_nonfinite.* (the same kernels and the same memory
# accesses as op_compare.*, with one input poisoned: nothing new for the sanitizers, and ~10x their Release time
# under them) and ggml_quants_oracle (Python driving a dump program: the quantizers' memory use is test_ggml_quants').
echo "== core tests (ASan+UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$root/build-asan" -j "$jobs" -L core -E '^(op_nonfinite\.|ggml_quants_oracle$)' --output-on-failure \
  --timeout 1800 2>&1 | tee "$logs/asan.log" || status=1
phase_done "core tests (ASan+UBSan)"

# Every reader of untrusted bytes (config.json, run configs, tokenizers, cache files) under libFuzzer with
# ASan+UBSan, 20 s per target (scripts/fuzz.sh, docs/fuzzing.md); longer: ROTARY_FUZZ_SECONDS=600.
echo "== fuzz (libFuzzer, ASan+UBSan)"
bash "$root/scripts/fuzz.sh" "${ROTARY_FUZZ_SECONDS:-20}" 2>&1 | tee "$logs/fuzz.log" || status=1
phase_done "fuzz (build + run)"

echo "== phases"
printf '%s\n' "${phases[@]}"
printf '%-34s %4d s\n' "total" $((SECONDS - start))
if command -v ccache >/dev/null; then ccache --show-stats 2>/dev/null | grep -iE '^ *(hits|misses|cacheable)' || true; fi
# One closing line over every run.
sum() { grep -hoE '[0-9]+ tests failed out of [0-9]+' "$@" | awk '{f+=$1; t+=$6} END {printf "%d passed, %d failed\n", t-f, f}'; }
echo "ctest: $(sum "$logs"/*.log)"
exit $status
