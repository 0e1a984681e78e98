#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, and runs it.
# Until the lab's `rotary compare` exists, the main job is the rotation benchmark (`rotary bench rope`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" --target rotary
exec "$root/build/lab/rotary" bench rope "$@"
