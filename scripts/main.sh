#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, and runs `rotary compare` with no
# settings (RoPE against RoPER on step-by-step addition, 3 seeds each; about five minutes on 2 cores). It prints the
# comparison table and the path of the markdown report with its plots (runs/compare/report.md). Extra arguments go
# to `rotary compare` (e.g. --encodings rope,roper,rerope --seeds 5).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" --target rotary
cd "$root"
exec "$root/build/lab/rotary" compare "$@"
