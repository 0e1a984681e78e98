#!/bin/bash
# runs without libtorch
# rotary serve over raw HTTP (curl): the wire format - a whole chat completion equal to `generate --messages`, the
# server-sent events of a stream (role chunk, content chunks, finish chunk, usage chunk, [DONE]), completions from text
# and from token ids; every refusal's status and OpenAI error JSON (malformed JSON with its offset, a wrong type, a
# body past --max-body, an unknown model and path, a missing API key); /health, /v1/models, /metrics; flags refused
# before serving (a port in use, memory past what the machine has); the prefix cache (cached_tokens) and a saved
# context opened for a prompt that starts with it (serve --context); SIGTERM exits 0. The OpenAI SDK's view is
# test_serve_openai.sh.
#
# usage: bash test_serve.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_serve.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_serve.sh <rotary binary> <source dir>}
W=$(mktemp -d)
source "$SRC/tests/cli/cli_helpers.sh"
source "$SRC/tests/cli/serve_helpers.sh"
trap 'stop_servers; rm -rf "$W"' EXIT
M="$W/model"
serve_model_fixture "$M"

# post PATH BODY: the reply body in $W/body, the status in STATUS.
post() {
  STATUS=$(curl -s -o "$W/body" -w '%{http_code}' -H 'Content-Type: application/json' "${CURL_ARGS[@]}" \
    "http://127.0.0.1:$PORT$1" --data-binary "$2")
}
CURL_ARGS=()
# expect_api_error WHAT STATUS CODE PARAM PATH BODY: the status, and the error JSON's code and param.
expect_api_error() {
  local what=$1 status=$2 code=$3 param=$4
  post "$5" "$6"
  if python3 - "$W/body" "$code" "$param" "$STATUS" "$status" <<'PY'
import json, sys
body, code, param, got, want = sys.argv[1:]
e = json.load(open(body))["error"]
assert got == want, f"status {got}, expected {want}: {e}"
assert e["code"] == code, f"code {e['code']}, expected {code}"
assert (e["param"] or "") == param, f"param {e['param']}, expected {param}"
assert e["message"] and e["type"], e
PY
  then pass "$what"; else fail "$what: $(head -c 300 "$W/body")"; fi
}

start_server main "$M" --ctx 128 --parallel 2 --max-body 4096 || exit 1
PORT=$main_PORT PID=$main_PID
HELLO='{"role": "user", "content": "hello"}'
printf '[%s]' "$HELLO" > "$W/msgs.json"
# (generate prints the answer and a newline; the files keep answers that end in newlines whole)
"$ROTARY" generate "$M" --messages "$W/msgs.json" --temperature 0 --max-new 6 --only-new > "$W/want"

# A whole chat completion: generate's answer, finish_reason length, usage.
post /v1/chat/completions "{\"model\": \"model\", \"messages\": [$HELLO], \"temperature\": 0, \"max_tokens\": 6}"
python3 - "$W/body" "$W/want" <<'PY' && pass "a chat completion equals generate --messages" || fail "chat completion: $(cat "$W/body")"
import json, sys
want = open(sys.argv[2], errors="replace").read()[:-1]
r = json.load(open(sys.argv[1]))
assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-"), r
c = r["choices"][0]
assert c["message"]["role"] == "assistant" and c["message"]["content"] == want, (c, want)
assert c["finish_reason"] == "length", c
assert r["usage"]["completion_tokens"] == 6 and r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 6, r
PY

# The same streamed: the events' deltas join to the same text; the role first, the reason last, usage, [DONE].
curl -sN "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' --data-binary \
  "{\"messages\": [$HELLO], \"temperature\": 0, \"max_tokens\": 6, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
  > "$W/stream"
python3 - "$W/stream" "$W/want" <<'PY' && pass "a stream's events carry the same answer" || fail "stream: $(head -c 600 "$W/stream")"
import json, sys
want = open(sys.argv[2], errors="replace").read()[:-1]
raw = open(sys.argv[1]).read()
events = [e for e in raw.split("\n\n") if e.strip()]
assert all(e.startswith("data: ") for e in events), events
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", chunks[0]
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
assert text == want, (text, want)
assert chunks[-2]["choices"][0]["finish_reason"] == "length", chunks[-2]
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6, chunks[-1]
assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
PY

# Text parts are the content joined: the same prompt as the string.
post /v1/chat/completions '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}], "max_tokens": 1}'
parts=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$W/body")
post /v1/chat/completions '{"messages": [{"role": "user", "content": "hel\nlo"}], "max_tokens": 1}'
joined=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$W/body")
[ -n "$parts" ] && [ "$parts" = "$joined" ] && pass "text parts are their texts joined by newlines" ||
  fail "text parts: $parts prompt tokens, the joined string $joined"

# rotary's extension: ReRoPE at window 4 for one request equals generate --kind rerope --window 4.
"$ROTARY" generate "$M" --prompt "a prompt long enough to pass the window" --temperature 0 --max-new 5 --only-new \
  --kind rerope --window 4 > "$W/want_rerope"
post /v1/completions '{"prompt": "a prompt long enough to pass the window", "temperature": 0, "max_tokens": 5, "rotary": {"positions": "rerope", "window": 4}}'
python3 - "$W/body" "$W/want_rerope" <<'PY' && pass "rotary.positions rerope equals generate --kind rerope" || fail "rerope request: $(cat "$W/body")"
import json, sys
want = open(sys.argv[2], errors="replace").read()[:-1]
assert json.load(open(sys.argv[1]))["choices"][0]["text"] == want, want
PY
expect_api_error "ReRoPE without a window" 400 invalid_value "rotary" /v1/completions \
  '{"prompt": "hi", "rotary": {"positions": "rerope"}}'
# ... and a retrieval memory for one request equals generate --memory with the same settings.
"$ROTARY" generate "$M" --prompt "a prompt long enough to pass the window" --temperature 2 --seed 5 --max-new 6 \
  --only-new --memory exact --memory-window 4 --top-k 3 > "$W/want_memory"
post /v1/completions '{"prompt": "a prompt long enough to pass the window", "temperature": 2, "seed": 5, "max_tokens": 6, "rotary": {"memory": "exact", "memory_window": 4, "top_k": 3}}'
python3 - "$W/body" "$W/want_memory" <<'PY' && pass "rotary.memory equals generate --memory" || fail "memory request: $(cat "$W/body")"
import json, sys
want = open(sys.argv[2], errors="replace").read()[:-1]
assert json.load(open(sys.argv[1]))["choices"][0]["text"] == want, want
PY
expect_api_error "a memory setting without a policy" 400 invalid_value "rotary" /v1/completions \
  '{"prompt": "hi", "rotary": {"top_k": 3}}'
expect_api_error "an unknown memory search" 400 invalid_value "rotary" /v1/completions \
  '{"prompt": "hi", "rotary": {"memory": "exact", "search": "bogus"}}'

# Completions: text (encoded as generate --prompt encodes it) and token ids.
"$ROTARY" generate "$M" --prompt "hello there" --temperature 0 --max-new 5 --only-new > "$W/want_text"
post /v1/completions '{"prompt": "hello there", "temperature": 0, "max_tokens": 5}'
python3 - "$W/body" "$W/want_text" <<'PY' && pass "a completion equals generate --prompt" || fail "completion: $(cat "$W/body")"
import json, sys
want = open(sys.argv[2], errors="replace").read()[:-1]
r = json.load(open(sys.argv[1]))
assert r["object"] == "text_completion" and r["choices"][0]["text"] == want, (r, want)
PY
post /v1/completions '{"prompt": [300, 5, 6, 7], "temperature": 0, "max_tokens": 3}'
[ "$STATUS" = 200 ] && grep -q '"completion_tokens":3' "$W/body" && pass "a prompt of token ids" ||
  fail "token ids: $STATUS $(cat "$W/body")"

# The prefix cache: the same completion again goes on from the first one's kept session (every prompt token but the
# last, whose row gives the first answer token, is cached).
post /v1/completions '{"prompt": [300, 5, 6, 7, 8, 9], "temperature": 0, "max_tokens": 2}'
post /v1/completions '{"prompt": [300, 5, 6, 7, 8, 9], "temperature": 0, "max_tokens": 2}'
python3 - "$W/body" <<'PY' && pass "a prompt the prefix cache holds is not read again (cached_tokens)" || fail "prefix cache: $(cat "$W/body")"
import json, sys
u = json.load(open(sys.argv[1]))["usage"]
assert u["prompt_tokens"] == 6 and u["prompt_tokens_details"]["cached_tokens"] == 5, u
PY

# Refusals: status, code and the field named.
expect_api_error "malformed JSON" 400 invalid_json "" /v1/chat/completions '{"messages": [}'
grep -q "offset\|byte" "$W/body" && pass "malformed JSON names the offset" || fail "no offset: $(cat "$W/body")"
expect_api_error "a wrong type" 400 invalid_type "max_tokens" /v1/chat/completions "{\"messages\": [$HELLO], \"max_tokens\": \"9\"}"
expect_api_error "a bad message" 400 invalid_type "messages[1].role" /v1/chat/completions "{\"messages\": [$HELLO, {\"role\": 3}]}"
expect_api_error "an unknown model" 404 model_not_found "model" /v1/chat/completions "{\"model\": \"gpt-4\", \"messages\": [$HELLO]}"
expect_api_error "a prompt past the context" 400 context_length_exceeded "prompt" /v1/completions \
  "{\"prompt\": \"$(printf 'x%.0s' $(seq 300))\"}"
expect_api_error "max_tokens past the context" 400 context_length_exceeded "max_tokens" /v1/completions \
  '{"prompt": "hi", "max_tokens": 500}'
expect_api_error "n > 1" 400 unsupported_field "n" /v1/completions '{"prompt": "hi", "n": 2}'
expect_api_error "a body past --max-body" 413 body_too_large "" /v1/completions \
  "{\"prompt\": \"$(head -c 6000 /dev/zero | tr '\0' a)\"}"
STATUS=$(curl -s -o "$W/body" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/chat")
[ "$STATUS" = 404 ] && grep -q unknown_url "$W/body" && pass "an unknown path is 404 JSON" || fail "unknown path: $STATUS $(cat "$W/body")"

# /health, /v1/models, /metrics.
curl -s "http://127.0.0.1:$PORT/health" | grep -q '"status":"ok"' && pass "/health" || fail "/health"
curl -s "http://127.0.0.1:$PORT/v1/models" | grep -q '"id":"model"' && pass "/v1/models lists the directory's name" ||
  fail "/v1/models: $(curl -s "http://127.0.0.1:$PORT/v1/models")"
curl -s "http://127.0.0.1:$PORT/metrics" > "$W/metrics"
grep -q '^rotary_requests_total{outcome="finished"} 10$' "$W/metrics" && grep -q '^rotary_completion_tokens_total 37$' "$W/metrics" &&
  grep -q '^rotary_prefix_cache_hits_total [1-9]' "$W/metrics" && grep -q '^rotary_prefix_cache_bytes [1-9]' "$W/metrics" &&
  grep -q '^rotary_http_errors_total{status="400"} [1-9]' "$W/metrics" && grep -q '^rotary_slots 2$' "$W/metrics" &&
  pass "/metrics counts requests, tokens and errors" || fail "/metrics: $(grep -v '^#' "$W/metrics")"

# SIGTERM: exit 0, the listener closed.
kill -TERM "$PID"
wait "$PID"
code=$?
[ "$code" = 0 ] && grep -q "stopped" "$W/main.err" && pass "SIGTERM exits 0" || fail "SIGTERM: exit $code: $(cat "$W/main.err")"
curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && fail "the listener is still open after SIGTERM" ||
  pass "the listener is closed after SIGTERM"

# --api-key: every path but /health needs it.
start_server keyed "$M" --ctx 64 --api-key sesame || exit 1
PORT=$keyed_PORT PID=$keyed_PID
expect_api_error "a missing API key" 401 invalid_api_key "" /v1/completions '{"prompt": "hi", "max_tokens": 1}'
CURL_ARGS=(-H "Authorization: Bearer sesame")
post /v1/completions '{"prompt": "hi", "max_tokens": 1}'
[ "$STATUS" = 200 ] && pass "the right API key is served" || fail "with the key: $STATUS $(cat "$W/body")"
CURL_ARGS=()
kill -TERM "$PID"; wait "$PID"

# A saved context (generate --save-context): serve --context DIR opens it for a prompt that starts with all of its
# tokens - the book is not read again, and the answer equals generate --context DIR with the rest of the prompt.
BOOK="Once upon a time there was a small model that read a whole book"
"$ROTARY" generate "$M" --prompt "$BOOK" --max-new 0 --save-context "$W/book" > /dev/null 2>&1
"$ROTARY" generate "$M" --context "$W/book" --prompt " and then it answered" --temperature 2 --seed 3 --max-new 6 \
  --only-new > "$W/want_book" 2> /dev/null
start_server book "$M" --ctx 128 --context "$W/book" --prefix-cache-mib 0 || exit 1
PORT=$book_PORT PID=$book_PID
post /v1/completions "{\"prompt\": \"$BOOK and then it answered\", \"max_tokens\": 6, \"temperature\": 2, \"seed\": 3}"
python3 - "$W/body" "$W/want_book" "$W/book/tokens.ids" <<'PY' && pass "serve --context: a saved book is opened, not read again" || fail "--context: $(cat "$W/body")"
import json, os, sys
r = json.load(open(sys.argv[1]))
want = open(sys.argv[2], errors="replace").read()[:-1]
book_tokens = (os.path.getsize(sys.argv[3]) - 8) // 8
assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == book_tokens > 0, (r["usage"], book_tokens)
assert r["choices"][0]["text"] == want, (r["choices"][0]["text"], want)
PY
kill -TERM "$PID"; wait "$PID"
# The same with a retrieval memory (seed 001's book): the memory is opened, not rebuilt.
MEM=(--memory exact --memory-window 8 --top-k 4)
"$ROTARY" generate "$M" --prompt "$BOOK" --max-new 0 "${MEM[@]}" --save-context "$W/book_memory" > /dev/null 2>&1
"$ROTARY" generate "$M" --context "$W/book_memory" "${MEM[@]}" --prompt " and then it answered" --temperature 2 --seed 3 \
  --max-new 6 --only-new > "$W/want_book" 2> /dev/null
start_server book_memory "$M" --ctx 128 "${MEM[@]}" --context "$W/book_memory" || exit 1
PORT=$book_memory_PORT PID=$book_memory_PID
post /v1/completions "{\"prompt\": \"$BOOK and then it answered\", \"max_tokens\": 6, \"temperature\": 2, \"seed\": 3}"
python3 - "$W/body" "$W/want_book" "$W/book_memory/tokens.ids" <<'PY' && pass "serve --context with --memory: the book's memory is opened" || fail "--context --memory: $(cat "$W/body")"
import json, os, sys
r = json.load(open(sys.argv[1]))
want = open(sys.argv[2], errors="replace").read()[:-1]
assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == (os.path.getsize(sys.argv[3]) - 8) // 8 > 0, r["usage"]
assert r["choices"][0]["text"] == want, (r["choices"][0]["text"], want)
PY
kill -TERM "$PID"; wait "$PID"
# With --memory the prefix cache keeps a finished session whole: a prompt that goes on from all of its tokens
# continues it (cached_tokens), answering as a server without a cache does.
FIRST_IDS="$(seq -s, 10 45)"
SECOND="{\"prompt\": [$FIRST_IDS, 7, 8, 9], \"max_tokens\": 6, \"temperature\": 2, \"seed\": 3}"
start_server memory_cached "$M" --ctx 128 "${MEM[@]}" || exit 1
PORT=$memory_cached_PORT PID=$memory_cached_PID
post /v1/completions "{\"prompt\": [$FIRST_IDS], \"max_tokens\": 1}"
post /v1/completions "$SECOND"
cp "$W/body" "$W/memory_cached"
kill -TERM "$PID"; wait "$PID"
start_server memory_plain "$M" --ctx 128 "${MEM[@]}" --prefix-cache-mib 0 || exit 1
PORT=$memory_plain_PORT PID=$memory_plain_PID
post /v1/completions "$SECOND"
kill -TERM "$PID"; wait "$PID"
python3 - "$W/memory_cached" "$W/body" <<'PY' && pass "--memory with the prefix cache: the next turn continues the kept memory session" || fail "--memory prefix cache: $(cat "$W/memory_cached") / $(cat "$W/body")"
import json, sys
cached, plain = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] == 36, cached["usage"]
assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, plain["usage"]
assert cached["choices"][0]["text"] == plain["choices"][0]["text"], (cached["choices"], plain["choices"])
PY
expect_error "a saved context of other settings" 2 "kv cache f32" -- "$ROTARY" serve "$M" --port 0 --ctx 128 \
  --context "$W/book" --kv-dtype bf16

# Refused before serving: a port in use (naming --port), memory past the machine's (naming --parallel).
start_server first "$M" --ctx 64 --queue 0 || exit 1
PORT=$first_PORT PID=$first_PID
# --queue 0: nothing waits, but a free slot takes a request.
post /v1/completions '{"prompt": "hi", "max_tokens": 2}'
[ "$STATUS" = 200 ] && pass "--queue 0 serves a request a free slot takes" || fail "--queue 0: $STATUS $(cat "$W/body")"
expect_error "a port in use" 2 "--host / --port" -- "$ROTARY" serve "$M" --port "$PORT" --ctx 64
expect_error "a negative prompt share" 2 "--prompt-share" -- "$ROTARY" serve "$M" --port 0 --ctx 64 --prompt-share -0.5
expect_error "a prompt share that is not a number" 2 "--prompt-share" -- "$ROTARY" serve "$M" --port 0 --ctx 64 \
  --prompt-share nan
expect_error "slots past the memory" 2 "--parallel 256" -- "$ROTARY" serve "$M" --port 0 --parallel 256 --ctx 1048576
expect_error "a prefix cache past the memory" 2 "--prefix-cache-mib" -- "$ROTARY" serve "$M" --port 0 --ctx 64 \
  --prefix-cache-mib 1073741824
kill -TERM "$PID"; wait "$PID"
exit $((fails > 0))
