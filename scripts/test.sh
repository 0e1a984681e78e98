#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs every test (C++ core, CLI, install +
# find_package consumer), then rebuilds the core with ASan+UBSan and runs the core tests again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${ROTARY_JOBS:-$(nproc)}"
bash "$root/scripts/setup.sh"
logs="$root/build/test-logs"

echo "== build (Release)"
bash "$root/scripts/build.sh"
mkdir -p "$logs"
echo "== tests (Release)"
status=0
ctest --test-dir "$root/build" -j "$jobs" --output-on-failure --timeout 900 2>&1 | tee "$logs/release.log" || status=1

echo "== build (core, ASan+UBSan)"
cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DROTARY_SANITIZE=ON \
      -DROTARY_BUILD_LAB=OFF >/dev/null
cmake --build "$root/build-asan" -j "$jobs"
echo "== core tests (ASan+UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$root/build-asan" -j "$jobs" -L core --output-on-failure --timeout 1800 2>&1 | tee "$logs/asan.log" || status=1

# One closing line over both runs.
sum() { grep -hoE '[0-9]+ tests failed out of [0-9]+' "$@" | awk '{f+=$1; t+=$6} END {printf "%d passed, %d failed\n", t-f, f}'; }
echo "ctest: $(sum "$logs/release.log" "$logs/asan.log")"
exit $status
