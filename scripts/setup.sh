#!/usr/bin/env bash
# Installs the Debian packages listed in scripts/debian-packages.txt that are missing, then the pinned npm packages
# of the oracles and of the server's client tests (tests/tokenizer_oracle, tests/template_oracle,
# tests/server_clients, pinned by their package-lock.json) when they are missing or the lock file changed.
# Idempotent: when all are present it changes nothing and needs no network. Run as root (or with sudo available).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mapfile -t wanted < <(grep -v '^\s*#' "$here/debian-packages.txt" | sed 's/\s.*//' | grep -v '^$')
# A package that an installed one provides counts as present (NodeSource's nodejs provides npm and conflicts with
# Debian's).
declare -A provided=()
while read -r p; do
  [ -n "$p" ] && provided["$p"]=1
done < <(dpkg-query -W -f='${db:Status-Abbrev}|${Provides}\n' 2>/dev/null | awk -F'|' '$1 ~ /^ii/ {print $2}' |
         tr ',' '\n' | sed 's/([^)]*)//; s/:any//; s/^ *//; s/ *$//')
missing=()
for p in "${wanted[@]}"; do
  if [ -n "${provided[$p]:-}" ]; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#wanted[@]} Debian packages present"
else
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The pinned npm packages (tests/tokenizer_oracle, tests/template_oracle: the oracles; tests/server_clients: the
# official OpenAI SDK that tests/cli/test_serve_*.sh drive `rotary serve` with): npm ci from each lock file (no install
# scripts), redone only when a pinned package is missing or the lock file differs from the one last installed (its
# hash is kept in node_modules).
for folder in tokenizer_oracle template_oracle server_clients; do
  oracle="$(cd "$here/../tests/$folder" && pwd)"
  stamp="$oracle/node_modules/.rotary-lock-sha256"
  lock_hash="$(sha256sum "$oracle/package-lock.json" | cut -d' ' -f1)"
  installed=1
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_hash" ]; then installed=0; fi
  while read -r name; do
    if [ ! -f "$oracle/node_modules/$name/package.json" ]; then installed=0; fi
  done < <(node -p 'Object.keys(require(process.argv[1]).dependencies).join("\n")' "$oracle/package.json")
  if [ $installed -eq 1 ]; then
    echo "setup: the npm packages of tests/$folder present"
  else
    echo "setup: npm ci in tests/$folder"
    (cd "$oracle" && npm ci --ignore-scripts --no-audit --no-fund --no-progress)
    echo "$lock_hash" > "$stamp"
  fi
done

# llama.cpp's source as npm's node-llama-cpp@3.22.1 ships it (llama/gitRelease.bundle: tag v0.5.0), unpacked into
# tests/gguf_oracle/llama.cpp (ignored by git): its gguf-py is the GGUF oracle (tests/gguf_oracle). Nothing of it is
# built or committed.
llama_src="$here/../tests/gguf_oracle/llama.cpp"
if [ -f "$llama_src/gguf-py/gguf/__init__.py" ]; then
  echo "setup: llama.cpp's gguf-py present"
else
  echo "setup: llama.cpp's source from npm's node-llama-cpp@3.22.1 into tests/gguf_oracle/llama.cpp"
  pack="$(mktemp -d)"
  (cd "$pack" && npm pack node-llama-cpp@3.22.1 --silent --no-audit --no-fund >/dev/null &&
     tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle)
  rm -rf "$llama_src"
  git -c advice.detachedHead=false clone -q "$pack/package/llama/gitRelease.bundle" "$llama_src"
  rm -rf "$pack"
fi
