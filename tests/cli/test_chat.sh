#!/bin/bash
# runs without libtorch
# Talking to a chat model (issue 44): `generate --messages` renders the conversation with the model's own template
# and stops at the template's end of turn (generation_config.json's eos_token_id list); `rotary chat` answers each
# line as generate --messages answers the same conversation - the first turn and a second one fed after the
# session's tokens -, saves its session with /save, stops an answer at Ctrl-C and goes on; a model without a
# template is refused naming --template FILE. On the llama3 fixture with a small template of our own.
#
# usage: bash test_chat.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_chat.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_chat.sh <rotary binary> <source dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/cli/cli_helpers.sh"
M="$W/model"
mkdir -p "$M"
cp "$SRC/tests/data/hf_checkpoints/llama3/config.json" "$SRC/tests/data/hf_checkpoints/llama3/model.safetensors" \
   "$SRC/tests/data/hf_tokenizers/llama3_style/tokenizer.json" "$M/"
cat > "$M/tokenizer_config.json" <<'JSON'
{"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
 "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['content'] == 'boom' %}{{ raise_exception('no boom here') }}{% endif %}{{ m['role'] }}: {{ m['content'] | trim }}<|end_of_text|>{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}
JSON
printf '[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]' > "$W/one.json"
FLAGS=(--max-new 5 --temperature 0.9 --seed 11)

# generate --messages: the rendered prompt, then the answer.
rendered=$("$ROTARY" template "$M" --messages "$W/one.json" --add-generation-prompt)
out=$("$ROTARY" generate "$M" --messages "$W/one.json" "${FLAGS[@]}")
[[ "$out" == "$rendered"* ]] && pass "generate --messages prints the rendered prompt first" ||
  fail "generate --messages: '$out' does not start with the rendering '$rendered'"
answer1=$("$ROTARY" generate "$M" --messages "$W/one.json" "${FLAGS[@]}" --only-new)
# Every id an end of turn: the answer is empty (the list is read, not only the tokenizer's EOS).
python3 -c 'import json; json.dump({"eos_token_id": list(range(302))}, open("'"$M"'/generation_config.json", "w"))'
none=$("$ROTARY" generate "$M" --messages "$W/one.json" "${FLAGS[@]}" --only-new)
[ -z "$none" ] && [ -n "$answer1" ] && pass "generation_config.json's eos_token_id list ends the turn" ||
  fail "with every id an end of turn the answer is '$none' (without: '$answer1')"
echo '{"eos_token_id": "x"}' > "$M/generation_config.json"
expect_error "eos_token_id of another type" 2 "generation_config.json: eos_token_id = \"x\" is invalid" -- \
  "$ROTARY" generate "$M" --messages "$W/one.json"
rm "$M/generation_config.json"

# chat: the same answer for the same conversation, and a second turn fed after the session's tokens answers as
# generate does from the whole conversation (turn n samples with seed + n).
printf 'hello\n' > "$W/in1"
chat1=$("$ROTARY" chat "$M" --system "be brief" --context-tokens 300 "${FLAGS[@]}" < "$W/in1" 2>/dev/null)
[ "$chat1" = "$answer1" ] && pass "chat's first answer equals generate --messages'" ||
  fail "chat answered '$chat1', generate --messages '$answer1'"
python3 - "$W/two.json" "$answer1" <<'PY'
import json, sys
json.dump([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
           {"role": "assistant", "content": sys.argv[2]}, {"role": "user", "content": "and again"}], open(sys.argv[1], "w"))
PY
answer2=$("$ROTARY" generate "$M" --messages "$W/two.json" --max-new 5 --temperature 0.9 --seed 12 --only-new)
printf 'hello\nand again\n/save %s\n' "$W/ctx" > "$W/in2"
chat2=$("$ROTARY" chat "$M" --system "be brief" --context-tokens 300 "${FLAGS[@]}" < "$W/in2" 2> "$W/chat2.err")
[ "$chat2" = "$answer1"$'\n'"$answer2" ] && pass "chat's second turn equals generate --messages on the whole conversation" ||
  fail "chat: '$chat2'; generate: '$answer1' then '$answer2'"
[ -f "$W/ctx/context.json" ] && grep -q "saved" "$W/chat2.err" && pass "/save writes a saved context" ||
  fail "/save: $(cat "$W/chat2.err")"

# A template's refusal ends the turn, not the chat: the next line is answered as if the refused one never came.
printf 'boom\nhello\n' > "$W/in3"
chat3=$("$ROTARY" chat "$M" --system "be brief" --context-tokens 300 "${FLAGS[@]}" < "$W/in3" 2> "$W/chat3.err")
grep -q "no boom here" "$W/chat3.err" && [ "$chat3" = "$answer1" ] &&
  pass "a template's raise_exception is reported and the chat goes on" ||
  fail "raise_exception: stderr '$(cat "$W/chat3.err")', stdout '$chat3'"

# Ctrl-C stops the answer, not the program: the next line is still read.
mkfifo "$W/fifo"
"$ROTARY" chat "$M" --context-tokens 200000 --max-new 150000 < "$W/fifo" > "$W/ctrlc.out" 2> "$W/ctrlc.err" &
pid=$!
exec 3> "$W/fifo"
echo "talk at length" >&3
sleep 2
kill -INT $pid
sleep 1
echo "/quit" >&3
exec 3>&-
wait $pid
status=$?
[ $status -eq 0 ] && grep -q "\[stopped\]" "$W/ctrlc.out" && pass "Ctrl-C stopped the answer, the program went on to /quit" ||
  fail "Ctrl-C: status $status, output tail '$(tail -c 200 "$W/ctrlc.out")', $(cat "$W/ctrlc.err")"

# A model without a template, and a command line's own mistakes.
rm "$M/tokenizer_config.json"
expect_error "no template" 2 "--template FILE" -- "$ROTARY" chat "$M" < /dev/null
expect_error "--template without --messages" 2 "--template" -- \
  "$ROTARY" generate "$M" --prompt hi --template "$W/one.json"

echo "$fails failed"
[ "$fails" = 0 ]
