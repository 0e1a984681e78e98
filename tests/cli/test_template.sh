#!/bin/bash
# runs without libtorch
# rotary template: a conversation rendered with a model directory's chat template, printed exactly; and its refusals
# (exit status 2 with a message naming the field or the template construct and line).
# usage: bash test_template.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_template.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_template.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$SRC/tests/cli/cli_helpers.sh"

mkdir -p "$W/model"
cat > "$W/model/tokenizer_config.json" <<'JSON'
{"bos_token": {"content": "<s>"}, "eos_token": "</s>",
 "chat_template": "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content | trim }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}{% if tools %}{{ tools | tojson }}{% endif %}"}
JSON
echo '[{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Grüße ✓"}]' > "$W/messages.json"
printf '<s><|system|>\nBe brief.</s>\n<|user|>\nGrüße ✓</s>\n<|assistant|>\n' > "$W/want.txt"
"$ROTARY" template "$W/model" --messages "$W/messages.json" --add-generation-prompt > "$W/got.txt" 2> "$W/err.txt"
if cmp -s "$W/got.txt" "$W/want.txt"; then pass "renders exactly (no newline added)"; else
  fail "render: $(od -c "$W/got.txt" | head -5) $(cat "$W/err.txt")"; fi
echo '[{"type": "function", "function": {"name": "f"}}]' > "$W/tools.json"
"$ROTARY" template "$W/model" --messages "$W/messages.json" --tools "$W/tools.json" > "$W/got.txt" 2> "$W/err.txt"
if grep -qF '[{"type": "function", "function": {"name": "f"}}]' "$W/got.txt"; then pass "tools"; else
  fail "tools: $(cat "$W/got.txt" "$W/err.txt")"; fi
printf '{{ messages | length }}:{{ bos_token }}' > "$W/t.jinja"
out=$("$ROTARY" template "$W/model" --messages "$W/messages.json" --template "$W/t.jinja")
[ "$out" = "2:<s>" ] && pass "--template overrides" || fail "--template: $out"

mkdir -p "$W/empty"
expect_error "no template" 2 "--template FILE" -- "$ROTARY" template "$W/empty" --messages "$W/messages.json"
echo '[{"role": "user", "content": "a"}, {"content": "b"}]' > "$W/bad.json"
expect_error "message without role" 2 "messages[1].role" -- "$ROTARY" template "$W/model" --messages "$W/bad.json"
echo '{"role": "user"}' > "$W/bad.json"
expect_error "messages not a list" 2 "messages" -- "$ROTARY" template "$W/model" --messages "$W/bad.json"
printf 'x\n{{ m | wordwrap }}' > "$W/t.jinja"
expect_error "unknown filter" 2 'line 2 = filter "wordwrap"' -- \
  "$ROTARY" template "$W/model" --messages "$W/messages.json" --template "$W/t.jinja"
printf '{%% include "x" %%}' > "$W/t.jinja"
expect_error "unknown statement" 2 'statement "include"' -- \
  "$ROTARY" template "$W/model" --messages "$W/messages.json" --template "$W/t.jinja"
printf '{{ raise_exception("roles must alternate") }}' > "$W/t.jinja"
expect_error "raise_exception" 2 "roles must alternate" -- \
  "$ROTARY" template "$W/model" --messages "$W/messages.json" --template "$W/t.jinja"
expect_error "template name with a single template" 2 "--template-name" -- \
  "$ROTARY" template "$W/model" --messages "$W/messages.json" --template-name tool_use

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
