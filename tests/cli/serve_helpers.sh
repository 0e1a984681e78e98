# tests/cli/serve_helpers.sh: what the `rotary serve` client tests share (test_serve_openai.sh,
# test_serve_balanced.sh; sourced after cli_helpers.sh, not a test). Expects $W (a scratch directory), $ROTARY and
# $SRC. Defines: serve_model_fixture, start_server, stop_servers, kill_server, sdk (the OpenAI Node SDK client,
# tests/server_clients/openai_client.mjs), vm_rss_kb, pycheck.
SERVE_PIDS=()
CLIENT="$SRC/tests/server_clients/openai_client.mjs"

# serve_model_fixture DIR: the llama3 fixture with the llama3_style tokenizer and a tiny chat template (as
# test_chat.sh).
serve_model_fixture() {
  local m=$1
  mkdir -p "$m"
  cp "$SRC/tests/data/hf_checkpoints/llama3/config.json" "$SRC/tests/data/hf_checkpoints/llama3/model.safetensors" \
     "$SRC/tests/data/hf_tokenizers/llama3_style/tokenizer.json" "$m/"
  cat > "$m/tokenizer_config.json" <<'JSON'
{"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
 "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}<|end_of_text|>{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}
JSON
}

# start_server NAME MODEL [serve flags...]: `rotary serve MODEL --port 0 flags` in the background, its stderr in
# $W/NAME.err; once it printed "rotary serve: ... on http://127.0.0.1:PORT (...)", sets NAME_PID and NAME_PORT.
# Returns 1 (after a FAIL line) when it exits or prints no port within 20 s.
start_server() {
  local name=$1
  shift
  "$ROTARY" serve "$@" --port 0 > "$W/$name.out" 2> "$W/$name.err" &
  local pid=$! port="" i
  SERVE_PIDS+=("$pid")
  for i in $(seq 1 200); do
    port=$(sed -n 's|^rotary serve: .* on http://127\.0\.0\.1:\([0-9][0-9]*\) (.*|\1|p' "$W/$name.err" | head -1)
    [ -n "$port" ] && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    fail "rotary serve $* did not start listening: $(tail -c 600 "$W/$name.err")"
    return 1
  fi
  printf -v "${name}_PID" %s "$pid"
  printf -v "${name}_PORT" %s "$port"
}

# stop_servers: SIGKILL to every server this script started that still runs (they are ours, by id).
stop_servers() {
  local p
  for p in "${SERVE_PIDS[@]}"; do
    kill -0 "$p" 2> /dev/null && kill_server "$p"
  done
  return 0
}

# kill_server PID: SIGKILL to one of them, reaped quietly.
kill_server() {
  kill -9 "$1" 2> /dev/null
  wait "$1" 2> /dev/null
  return 0
}

# sdk PORT KEY CASE_JSON...: the SDK client against http://127.0.0.1:PORT, one JSON line per case on stdout.
sdk() {
  local port=$1 key=$2
  shift 2
  timeout 120 node "$CLIENT" "http://127.0.0.1:$port" "$key" "$@"
}

# vm_rss_kb PID: the process's resident memory in kB (/proc/PID/status VmRSS).
vm_rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# pycheck ARGS... <<'PY' ... PY: runs the Python on stdin with ARGS as sys.argv[1:] after a prelude defining
# ok(condition, what, detail) (prints "ok: what" or "FAIL: what: detail"), load(path) (a file of JSON lines) and
# generated(path) (`rotary generate`'s stdout less its one closing newline); adds its FAIL lines to $fails.
PYCHECK_PRELUDE='
import json, sys
def ok(condition, what, detail=""):
    print(("ok: " + what) if condition else ("FAIL: " + what + ((": " + str(detail)[:1500]) if detail != "" else "")))
    return condition
def load(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
def generated(path):
    text = open(path, "rb").read().decode("utf-8")
    return text[:-1] if text.endswith("\n") else text
'
pycheck() {
  local out
  out=$(python3 -c "$PYCHECK_PRELUDE$(cat)" "$@" 2>&1) || out+=$'\n'"FAIL: a Python check raised (above)"
  echo "$out"
  fails=$((fails + $(grep -c '^FAIL' <<< "$out")))
}
