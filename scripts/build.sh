#!/usr/bin/env bash
# Configures and builds rotary into build/ (Release, Ninja). Extra arguments go to `cmake --build`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${ROTARY_JOBS:-$(nproc)}"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j "$jobs" "$@"
