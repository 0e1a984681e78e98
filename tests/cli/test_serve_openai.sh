#!/bin/bash
# runs without libtorch
# `rotary serve` against a real client: the official OpenAI Node SDK (npm `openai`, pinned in
# tests/server_clients/package.json; tests/server_clients/openai_client.mjs runs the cases) on the llama3 fixture with
# a tiny chat template (docs/server.md). Checked:
#   - a greedy chat completion, whole and streamed (the deltas concatenated), equals `rotary generate --messages
#     --temperature 0 --max-new N --only-new`; finish_reason; usage (prompt_tokens = the conversation's tokens as
#     generate --save-context counts them, completion_tokens = the answer's); /v1/completions equals generate --prompt;
#   - 4 streams at once (--parallel 4, greedy and seeded) each equal the same request run alone;
#   - stream_options.include_usage's final chunk; stop strings; max_tokens -> "length";
#   - the SDK's errors: a wrong key (--api-key) AuthenticationError 401, an unknown model NotFoundError 404,
#     temperature 5 BadRequestError 400 with param "temperature";
#   - --parallel 1 --queue 1 and three long requests: one 503 with Retry-After;
#   - a client gone mid-stream: rotary_requests_total{outcome="cancelled"} 1 and /health's slots_busy back to 0; and
#     one gone before its non-streamed answer (curl --max-time) alike;
#   - SIGTERM during 2 streams: both end cleanly (finished, or an error event then [DONE]), the process exits 0 within
#     --drain, a request after SIGTERM is refused;
#   - answers whose bytes are not UTF-8 (this tiny model's usual output): U+FFFD for each stray byte, whole and
#     streamed, and the server goes on.
# The prompts of the other checks are ones whose answers are UTF-8. Every server runs --threads 1 (2 shared cores).
# Without node or the pinned package this test FAILS (scripts/setup.sh installs them).
#
# usage: bash test_serve_openai.sh <rotary binary> <source dir>
set -u
ROTARY=${1:?usage: test_serve_openai.sh <rotary binary> <source dir>}
SRC=${2:?usage: test_serve_openai.sh <rotary binary> <source dir>}
W=$(mktemp -d)
source "$SRC/tests/cli/cli_helpers.sh"
source "$SRC/tests/cli/serve_helpers.sh"
source "$SRC/tests/npm_oracle_packages.sh"
trap 'stop_servers; rm -rf "$W"' EXIT
require_pinned_npm_packages "$SRC/tests/server_clients" \
  "run: bash $SRC/scripts/setup.sh (installs nodejs, npm and the pinned openai package)"
"$ROTARY" serve --help > /dev/null 2>&1 || { echo "FAIL: $ROTARY has no serve command"; exit 1; }
python3 -c 'import json' || { echo "FAIL: python3 is needed for the checks"; exit 1; }

M="$W/model"
serve_model_fixture "$M"
KEY=sk-rotary-test
ALIAS=tiny-llama3
N=12  # max_tokens of the compared answers
started=$SECONDS

# ---- the references: rotary generate on the same conversation and prompts
printf '[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]' > "$W/one.json"
G=("$ROTARY" generate "$M" --threads 1)
"${G[@]}" --messages "$W/one.json" --temperature 0 --max-new $N --only-new > "$W/ref_chat.txt" &&
  "${G[@]}" --messages "$W/one.json" --max-new 0 --save-context "$W/ctx_chat" > /dev/null &&
  "${G[@]}" --prompt "hello there" --temperature 0 --max-new $N --only-new > "$W/ref_p1.txt" &&
  "${G[@]}" --prompt "hello there" --max-new 0 --save-context "$W/ctx_p1" > /dev/null &&
  "${G[@]}" --prompt "1 2 3 4" --temperature 0 --max-new $N --only-new > "$W/ref_p2.txt" &&
  "${G[@]}" --prompt "1 2 3 4" --temperature 0.8 --seed 0 --max-new 16 --only-new > "$W/ref_seeded.txt" &&
  "${G[@]}" --messages "$W/one.json" --temperature 0 --max-new $((N - 1)) --only-new > "$W/ref_chat_less.txt" ||
  { echo "FAIL: rotary generate (the reference) failed"; exit 1; }
# generate --max-new K for the K the server counts: the same text, and K-1 tokens a shorter one.
python3 - "$W/ref_chat.txt" > "$W/stop.txt" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[:-1]
# A stop string from the middle of the greedy answer: the answer ends before its first occurrence.
for start in range(2, max(3, len(text) - 1)):
    stop = text[start:start + 2]
    if len(stop) == 2 and text.find(stop) > 0:
        print(stop, end="")
        break
PY
STOP=$(cat "$W/stop.txt")
[ -n "$STOP" ] || fail "no stop string could be taken from the greedy answer '$(cat "$W/ref_chat.txt")'"

# ---- server A: 4 slots, an API key, an alias
start_server A "$M" --parallel 4 --api-key "$KEY" --alias "$ALIAS" --ctx 2048 --threads 1 || exit 1
MSG='[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]'
CHAT="{\"model\": \"$ALIAS\", \"messages\": $MSG, \"temperature\": 0, \"max_tokens\": $N"
COMP="{\"model\": \"$ALIAS\", \"temperature\": 0, \"max_tokens\": $N"
STOPS=$(python3 -c 'import json, sys; print(json.dumps([sys.argv[1], "not in the answer"]))' "$STOP")
sdk "$A_PORT" "$KEY" \
  '{"op": "models"}' \
  "{\"op\": \"chat\", \"name\": \"chat_whole\", \"params\": $CHAT}}" \
  "{\"op\": \"chat\", \"name\": \"chat_stream\", \"params\": $CHAT, \"stream\": true}}" \
  "{\"op\": \"chat\", \"name\": \"chat_stream_usage\", \"params\": $CHAT, \"stream\": true, \"stream_options\": {\"include_usage\": true}}}" \
  "{\"op\": \"completion\", \"name\": \"p1_whole\", \"params\": $COMP, \"prompt\": \"hello there\"}}" \
  "{\"op\": \"completion\", \"name\": \"p1_stream\", \"params\": $COMP, \"prompt\": \"hello there\", \"stream\": true, \"stream_options\": {\"include_usage\": true}}}" \
  "{\"op\": \"completion\", \"name\": \"p2_whole\", \"params\": $COMP, \"prompt\": \"1 2 3 4\"}}" \
  "{\"op\": \"completion\", \"name\": \"p2_stream\", \"params\": $COMP, \"prompt\": \"1 2 3 4\", \"stream\": true}}" \
  "{\"op\": \"completion\", \"name\": \"seeded\", \"params\": {\"model\": \"$ALIAS\", \"prompt\": \"1 2 3 4\", \"temperature\": 0.8, \"seed\": 0, \"max_tokens\": 16}}" \
  "{\"op\": \"chat\", \"name\": \"chat_length\", \"params\": {\"model\": \"$ALIAS\", \"messages\": $MSG, \"temperature\": 0, \"max_tokens\": 3}}" \
  "{\"op\": \"chat\", \"name\": \"stop_whole\", \"params\": $CHAT, \"stop\": $STOPS}}" \
  "{\"op\": \"chat\", \"name\": \"stop_stream\", \"params\": $CHAT, \"stop\": $STOPS, \"stream\": true}}" \
  "{\"op\": \"completion\", \"name\": \"stop_one\", \"params\": $COMP, \"prompt\": \"hello there\", \"stop\": \"\\n\"}}" \
  "{\"op\": \"chat\", \"name\": \"unknown_model\", \"params\": {\"model\": \"gpt-4o\", \"messages\": $MSG, \"max_tokens\": 2}}" \
  "{\"op\": \"chat\", \"name\": \"temperature_5\", \"params\": {\"model\": \"$ALIAS\", \"messages\": $MSG, \"temperature\": 5, \"max_tokens\": 2}}" \
  "{\"op\": \"completion\", \"name\": \"max_tokens_0\", \"params\": {\"model\": \"$ALIAS\", \"prompt\": \"hi\", \"max_tokens\": 0}}" \
  > "$W/a.jsonl" 2> "$W/a.err" || fail "the SDK client exited $?: $(tail -c 600 "$W/a.err")"
sdk "$A_PORT" "sk-wrong" "{\"op\": \"chat\", \"name\": \"wrong_key\", \"params\": $CHAT}}" \
  '{"op": "raw", "name": "health_without_key", "method": "GET", "path": "/health", "api_key": ""}' \
  '{"op": "raw", "name": "metrics_wrong_key", "method": "GET", "path": "/metrics"}' \
  >> "$W/a.jsonl" 2>> "$W/a.err" || fail "the SDK client exited $?: $(tail -c 600 "$W/a.err")"

pycheck "$W/a.jsonl" "$W/ref_chat.txt" "$W/ref_p1.txt" "$W/ref_p2.txt" "$W/ctx_chat/context.json" \
        "$W/ctx_p1/context.json" "$N" "$ALIAS" "$STOP" "$W/ref_seeded.txt" "$W/ref_chat_less.txt" <<'PY'
r = {x["name"]: x for x in load(sys.argv[1])}
ref_chat, ref_p1, ref_p2 = generated(sys.argv[2]), generated(sys.argv[3]), generated(sys.argv[4])
chat_tokens = json.load(open(sys.argv[5]))["tokens"]
p1_tokens = json.load(open(sys.argv[6]))["tokens"]
N, alias, stop = int(sys.argv[7]), sys.argv[8], sys.argv[9]
def text_of(name):
    x = r[name]
    return x["text"] if x.get("ok") else "<error %s>" % x.get("error")
ok(r["models"].get("ids") == [alias], "GET /v1/models through the SDK lists the --alias", r["models"])
for name in ("chat_whole", "chat_stream", "chat_stream_usage"):
    ok(text_of(name) == ref_chat, name + ": the greedy answer equals rotary generate --messages --temperature 0",
       "server %r, generate %r" % (text_of(name), ref_chat))
w = r["chat_whole"]
ok(w.get("role") == "assistant" and w.get("objects") == ["chat.completion"], "chat_whole: an assistant message", w)
ok(r["chat_stream"].get("role") == "assistant" and r["chat_stream"].get("objects") == ["chat.completion.chunk"]
   and r["chat_stream"].get("ids") == 1, "chat_stream: chat.completion.chunk chunks of one id, the first with role assistant",
   r["chat_stream"])
u = w.get("usage") or {}
ok(u.get("prompt_tokens") == chat_tokens,
   "usage.prompt_tokens = the conversation's tokens (%d, generate --save-context)" % chat_tokens, u)
k = u.get("completion_tokens", -1)
ok(0 < k <= N and u.get("total_tokens") == chat_tokens + k, "usage.completion_tokens in [1, max_tokens], total the sum", u)
less = generated(sys.argv[11])
ok(k != N or (len(less) < len(ref_chat) and ref_chat.startswith(less)),
   "completion_tokens %d: generate --max-new %d gives a shorter answer (every one of the %d tokens is text)" % (k, N - 1, N),
   "%r" % less)
ok(w.get("finish_reason") == ("length" if k == N else "stop"),
   "finish_reason %r with %d of max_tokens %d tokens" % (w.get("finish_reason"), k, N))
ok(r["chat_stream"].get("finish_reason") == w.get("finish_reason"), "the stream's last chunk has the same finish_reason",
   r["chat_stream"])
ok(r["chat_stream"].get("usage") is None, "a stream without include_usage carries no usage", r["chat_stream"].get("usage"))
def counts(usage):
    return {k: (usage or {}).get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
def cached(usage):
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
s = r["chat_stream_usage"]
ok(counts(s.get("usage")) == counts(u) and s.get("usage_chunk_choices") == 0,
   "stream_options.include_usage: a final chunk with choices [] and the whole answer's usage", s)
# The same conversation asked again (the SDK's requests run one after another here): the prefix cache held all of its
# prompt but the last token.
ok(cached(u) == 0 and cached(s.get("usage")) == chat_tokens - 1,
   "usage.prompt_tokens_details.cached_tokens: 0, then %d for the same conversation again" % (chat_tokens - 1),
   (u, s.get("usage")))
for name, ref in (("p1_whole", ref_p1), ("p1_stream", ref_p1), ("p2_whole", ref_p2), ("p2_stream", ref_p2)):
    ok(text_of(name) == ref, name + ": /v1/completions equals rotary generate --prompt --temperature 0",
       "server %r, generate %r" % (text_of(name), ref))
ok(r["p1_whole"].get("objects") == ["text_completion"] and (r["p1_whole"].get("usage") or {}).get("prompt_tokens") == p1_tokens,
   "/v1/completions: text_completion, prompt_tokens %d as generate --prompt encodes it (BOS included)" % p1_tokens,
   r["p1_whole"])
ok(counts(r["p1_stream"].get("usage")) == counts(r["p1_whole"].get("usage")) and r["p1_stream"].get("usage_chunk_choices") == 0,
   "/v1/completions stream with include_usage: the same usage", r["p1_stream"])
L = r["chat_length"]
ok(L.get("finish_reason") == "length" and (L.get("usage") or {}).get("completion_tokens") == 3,
   "max_tokens 3 -> finish_reason length, completion_tokens 3", L)
want = ref_chat[:ref_chat.find(stop)]
for name in ("stop_whole", "stop_stream"):
    ok(text_of(name) == want and r[name].get("finish_reason") == "stop",
       "%s: stop %r ends the answer before it (%r), finish_reason stop" % (name, stop, want),
       "got %r, %r" % (text_of(name), r[name].get("finish_reason")))
one = r["stop_one"]
ok(one.get("ok") and "\n" not in one["text"] and ref_p1.startswith(one["text"]) and
   (one["finish_reason"] == "stop") == ("\n" in ref_p1),
   "stop as one string (\"\\n\") on /v1/completions", "%r (reference %r)" % (one, ref_p1))
def error_is(name, cls, status, param=None, code=None):
    e = r[name].get("error") or {}
    return ok(not r[name].get("ok") and e.get("class") == cls and e.get("status") == status and
              (param is None or e.get("param") == param) and (code is None or e.get("code") == code),
              "%s: the SDK raises %s %d%s" % (name, cls, status, "" if param is None else " with param %r" % param), e)
seeded = generated(sys.argv[10])
print("  note: temperature 0.8 seed 0 on /v1/completions %s rotary generate --temperature 0.8 --seed 0 (%r, %r)"
      % ("equals" if text_of("seeded") == seeded else "differs from", text_of("seeded"), seeded))
error_is("wrong_key", "AuthenticationError", 401)
error_is("unknown_model", "NotFoundError", 404, code="model_not_found")
error_is("temperature_5", "BadRequestError", 400, param="temperature")
error_is("max_tokens_0", "BadRequestError", 400, param="max_tokens")
ok(r["health_without_key"].get("status") == 200, "/health answers without the key", r["health_without_key"])
ok(r["metrics_wrong_key"].get("status") == 401, "/metrics with a wrong key is 401", r["metrics_wrong_key"])
PY

# ---- 4 streams at once on 4 slots, each as the same request alone (greedy and seeded, chat and completions).
ALONE=()
for i in 0 1 2 3; do
  case $i in
    0) p="{\"model\": \"$ALIAS\", \"messages\": [{\"role\": \"user\", \"content\": \"count to ten\"}], \"temperature\": 0, \"max_tokens\": 24, \"stream\": true}" ;;
    1) p="{\"model\": \"$ALIAS\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}, {\"role\": \"user\", \"content\": \"go on\"}], \"temperature\": 0, \"max_tokens\": 31, \"stream\": true}" ;;
    2) p="{\"model\": \"$ALIAS\", \"prompt\": \"1 2 3 4\", \"temperature\": 0.8, \"seed\": 0, \"max_tokens\": 16, \"stream\": true}" ;;
    3) p="{\"model\": \"$ALIAS\", \"prompt\": \"tell a long story\", \"temperature\": 0.5, \"top_p\": 0.9, \"seed\": 2, \"max_tokens\": 21, \"stream\": true}" ;;
  esac
  [ $i -lt 2 ] && op=chat || op=completion
  ALONE+=("{\"op\": \"$op\", \"name\": \"req$i\", \"params\": $p}")
done
CASES=$(IFS=,; echo "${ALONE[*]}")
sdk "$A_PORT" "$KEY" "${ALONE[@]}" "{\"op\": \"all\", \"name\": \"together\", \"cases\": [$CASES]}" > "$W/par.jsonl" 2> "$W/par.err" ||
  fail "the SDK client exited $?: $(tail -c 600 "$W/par.err")"
pycheck "$W/par.jsonl" <<'PY'
rows = load(sys.argv[1])
alone = {x["name"]: x for x in rows if x["name"].startswith("req")}
together = {x["name"]: x for x in rows if x["name"] == "together"}["together"]
for x in together["results"]:
    a = alone[x["name"]]
    ok(x.get("ok") and a.get("ok") and x["text"] == a["text"] and x["finish_reason"] == a["finish_reason"] and a["text"],
       "%s: streamed beside 3 others (Promise.all, --parallel 4) equals the same request alone" % x["name"],
       "together %r, alone %r" % (x, a))
PY

# ---- a client gone mid-stream: the request is counted cancelled and its slot freed.
sdk "$A_PORT" "$KEY" "{\"op\": \"abort\", \"endpoint\": \"chat\", \"watch\": true, \"params\": {\"model\": \"$ALIAS\", \"messages\": $MSG, \"temperature\": 0, \"max_tokens\": 2000}}" \
  > "$W/abort.jsonl" 2> "$W/abort.err" || fail "the SDK client exited $?: $(tail -c 600 "$W/abort.err")"
pycheck "$W/abort.jsonl" <<'PY'
a = load(sys.argv[1])[0]
print("  abort: %s" % json.dumps({k: a.get(k) for k in ("chunks_before_abort", "cancelled", "cancelled_ms", "slots_busy", "idle_ms")}))
ok(a.get("aborted") and a.get("chunks_before_abort", 0) >= 1 and a.get("error") is None,
   "the SDK's stream aborted after its first text (AbortController; the SDK ends the iteration quietly)", a)
ok(a.get("cancelled") == 1 and a.get("cancelled_ms") is not None and a["cancelled_ms"] <= 2000,
   "/metrics: rotary_requests_total{outcome=\"cancelled\"} 1 soon after (%s ms)" % a.get("cancelled_ms"), a)
ok(a.get("idle_ms") is not None and a["idle_ms"] <= 1000,
   "/health: slots_busy back to 0 within a second (%s ms)" % a.get("idle_ms"), a)
PY
kill_server "$A_PID"

# ---- overload: 1 slot, a queue of 1, three long requests -> one 503 with Retry-After.
start_server O "$M" --parallel 1 --queue 1 --ctx 8192 --threads 1 || exit 1
LONG="{\"prompt\": \"tell a long story\", \"temperature\": 0, \"max_tokens\": 8000, \"stream\": true}"
sdk "$O_PORT" "" "{\"op\": \"overload\", \"path\": \"/v1/completions\", \"body\": $LONG}" > "$W/over.jsonl" 2> "$W/over.err" ||
  fail "the SDK client exited $?: $(tail -c 600 "$W/over.err")"
pycheck "$W/over.jsonl" <<'PY'
o = load(sys.argv[1])[0]
print("  overload: statuses %s, Retry-After %s, codes %s" % (o.get("statuses"), o.get("retry_after"), o.get("codes")))
st = o.get("statuses") or []
refused = [i for i, s in enumerate(st) if s == 503]
ok(st[:1] == [200] and sorted(st) == [200, 200, 503] and len(refused) == 1,
   "--parallel 1 --queue 1: of three long requests one runs, one waits, one is refused with 503", st)
ok(len(refused) == 1 and (o["retry_after"][refused[0]] or "").strip().isdigit() and
   o["codes"][refused[0]] == "queue_full", "the 503 has a Retry-After header (seconds) and code queue_full", o)
PY
# ---- a client gone before its non-streamed answer: counted cancelled, its slot freed (curl gives up after 0.5 s of
# an 8000-token answer, several seconds on this model).
metric() { curl -s "http://127.0.0.1:$O_PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
for _ in $(seq 100); do  # the overload's aborted streams gone first (up to 5 s)
  [ "$(metric rotary_slots_busy)" = 0 ] && [ "$(metric rotary_queue_length)" = 0 ] && break
  sleep 0.05
done
before=$(metric 'rotary_requests_total{outcome="cancelled"}')
curl -s -o /dev/null --max-time 0.5 -H "Content-Type: application/json" \
  -d '{"prompt": "tell a long story", "temperature": 0, "max_tokens": 8000}' "http://127.0.0.1:$O_PORT/v1/completions"
gone_at=$(date +%s%N)
for _ in $(seq 40); do  # up to 2 s
  cancelled=$(metric 'rotary_requests_total{outcome="cancelled"}') busy=$(metric rotary_slots_busy)
  [ "$cancelled" = $((before + 1)) ] && [ "$busy" = 0 ] && break
  sleep 0.05
done
[ "$cancelled" = $((before + 1)) ] && [ "$busy" = 0 ] \
  && pass "a non-streamed request whose client left: counted cancelled, slot freed $(( ($(date +%s%N) - gone_at) / 1000000 )) ms after" \
  || fail "a non-streamed request whose client left: cancelled $cancelled (want $((before + 1))), slots busy $busy after 2 s"
kill_server "$O_PID"

# ---- SIGTERM during 2 running streams.
DRAIN=2
start_server S "$M" --parallel 2 --drain $DRAIN --ctx 8192 --threads 1 || exit 1
S_LONG="{\"prompt\": \"tell a long story\", \"temperature\": 0, \"max_tokens\": 8000, \"stream\": true}"
S_SHORT="{\"prompt\": \"1 2 3 4\", \"temperature\": 0, \"max_tokens\": 600, \"stream\": true}"
sdk "$S_PORT" "" "{\"op\": \"sigterm\", \"pid\": $S_PID, \"path\": \"/v1/completions\", \"streams\": [$S_LONG, $S_SHORT], \"after\": {\"prompt\": \"late\", \"max_tokens\": 2}}" \
  > "$W/term.jsonl" 2> "$W/term.err" || fail "the SDK client exited $?: $(tail -c 600 "$W/term.err")"
# The process's exit: its status and when (from the SIGTERM the client sent).
exited_ms=""
for i in $(seq 1 $(( (DRAIN + 8) * 20 ))); do
  state=$(awk '{print $3}' "/proc/$S_PID/stat" 2> /dev/null)
  if [ -z "$state" ] || [ "$state" = Z ]; then exited_ms=$(date +%s%3N); break; fi
  sleep 0.05
done
if [ -n "$exited_ms" ]; then
  wait "$S_PID"
  S_STATUS=$?
else
  S_STATUS=running
fi
pycheck "$W/term.jsonl" "$S_STATUS" "$exited_ms" "$DRAIN" <<'PY'
t = load(sys.argv[1])[0]
status, exited, drain = sys.argv[2], sys.argv[3], float(sys.argv[4])
for i, s in enumerate(t["streams"]):
    how = ("finished (%s)" % s["finish_reason"]) if s["finish_reason"] and not s["error"] else \
          ("error event %s" % (s["error"].get("code") if isinstance(s["error"], dict) else s["error"]))
    print("  SIGTERM stream %d: %s, [DONE] %s, %d chars (%d at SIGTERM), ended %s ms after SIGTERM" %
          (i, how, s["done"], s["text_length"], t["texts_at_term"][i], s["ms_after_term"]))
    clean = s["ended"] == "closed" and s["done"] and s["after_done"] == 0 and s["status"] == 200 and (
        (s["finish_reason"] is not None and s["error"] is None) or
        (isinstance(s["error"], dict) and s["error"].get("code") == "shutting_down"))
    ok(clean, "SIGTERM: stream %d ends cleanly (%s, then [DONE])" % (i, how), s)
a = t["after"]
print("  request after SIGTERM: %s" % a)
ok(a["status"] == 503 or a["connection_error"] is not None, "a request after SIGTERM is refused (503 or no connection)", a)
ok(status == "0", "the server exits 0 after SIGTERM", status)
if exited:
    ms = int(exited) - t["term_epoch_ms"]
    print("  exited %d ms after SIGTERM (--drain %g)" % (ms, drain))
    ok(ms <= drain * 1000 + 1500, "the server exits within --drain (%d ms, --drain %gs + 1.5 s)" % (ms, drain))
PY

# ---- answers that are not UTF-8: this tiny model's greedy answer to "Once upon a time" is the byte 0xEA again and
# again (a lead byte no continuation follows), sampled ones other lone bytes. JSON holds text: each byte that is no
# part of a character reaches the client as U+FFFD (as a UTF-8 decoder replaces it: Python's errors="replace"),
# whole and streamed alike, and the server goes on serving.
"${G[@]}" --prompt "Once upon a time" --temperature 0 --max-new $N --only-new > "$W/ref_u1.txt"
"${G[@]}" --prompt "abc" --temperature 0.8 --seed 0 --max-new 16 --only-new > "$W/ref_u2.txt"
start_server U "$M" --parallel 2 --ctx 256 --threads 1 || exit 1
U1="{\"prompt\": \"Once upon a time\", \"temperature\": 0, \"max_tokens\": $N"
U2="{\"prompt\": \"abc\", \"temperature\": 0.8, \"seed\": 0, \"max_tokens\": 16"
sdk "$U_PORT" "" \
  "{\"op\": \"completion\", \"name\": \"u1_whole\", \"params\": $U1, \"model\": \"model\"}}" \
  "{\"op\": \"completion\", \"name\": \"u1_stream\", \"params\": $U1, \"model\": \"model\", \"stream\": true}}" \
  "{\"op\": \"completion\", \"name\": \"u2_stream\", \"params\": $U2, \"model\": \"model\", \"stream\": true}}" \
  "{\"op\": \"completion\", \"name\": \"u2_whole\", \"params\": $U2, \"model\": \"model\"}}" \
  '{"op": "raw", "name": "health", "method": "GET", "path": "/health"}' \
  > "$W/utf8.jsonl" 2> "$W/utf8.err" || fail "the SDK client exited $?: $(tail -c 600 "$W/utf8.err")"
kill -0 "$U_PID" 2> /dev/null && pass "answers that are not UTF-8: the server still runs" ||
  fail "answers that are not UTF-8: the server died: $(tail -c 400 "$W/U.err")"
pycheck "$W/utf8.jsonl" "$W/ref_u1.txt" "$W/ref_u2.txt" <<'PY'
r = {x["name"]: x for x in load(sys.argv[1])}
for ref_path, names in ((sys.argv[2], ("u1_whole", "u1_stream")), (sys.argv[3], ("u2_whole", "u2_stream"))):
    raw = open(ref_path, "rb").read()[:-1]
    want = raw.decode("utf-8", errors="replace")
    for name in names:
        x = r.get(name, {})
        ok(x.get("ok") and x.get("text") == want,
           "%s: an answer of bytes %r reaches the SDK as %r" % (name, raw[:12], want[:12]),
           "got %r" % (x.get("text") if x.get("ok") else x.get("error")))
ok(r.get("health", {}).get("status") == 200, "/health after them", r.get("health"))
PY
kill_server "$U_PID"

echo "test_serve_openai: $((SECONDS - started)) s"
echo "$fails failed"
[ "$fails" = 0 ]
