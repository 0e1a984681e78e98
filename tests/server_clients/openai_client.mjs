// The official OpenAI Node SDK (npm `openai`, pinned in package.json) as a real client of `rotary serve`
// (docs/server.md), for tests/cli/test_serve_openai.sh and tests/cli/test_serve_balanced.sh.
//
// usage: node openai_client.mjs BASE_URL API_KEY CASE_JSON [CASE_JSON ...]
//   BASE_URL: the server's root (http://127.0.0.1:PORT); the SDK gets BASE_URL/v1.
//   Each CASE_JSON is one case (an object with "op"; a case starting with @ names a file holding it). The cases run
//   one after the other; each prints one line of JSON, {"name", "op", ...what it saw}. A request the server refuses
//   is a result ({"ok": false, "error": {...}}), not a failure of this script: the caller's checks judge. Exit 1 only
//   for a case this script cannot read.
//
// ops:
//   chat / completion  {params, options?}: client.chat.completions.create / client.completions.create (params as the
//                      SDK takes them, stream or not; options: the SDK's request options, e.g. {"maxRetries": 0}) ->
//                      {ok, text, finish_reason, usage, chunks, role, usage_chunk_choices, objects} or {ok: false,
//                      error: {class, status, code, param, type, message}}. A stream's text is its deltas
//                      concatenated.
//   models             client.models.list() -> {ok, ids}
//   all                {cases: [...]}: the cases at once (Promise.all) -> {results: [...], wall_ms}
//   abort              {endpoint: "chat" | "completion", params, watch?}: a stream aborted (AbortController) after its
//                      first chunk with text -> {chunks_before_abort, text_before_abort, error}; with watch, then
//                      /metrics and /health polled: {cancelled (the count), cancelled_ms, slots_busy, idle_ms}
//   raw                {method, path, body?, api_key?}: fetch without the SDK -> {status, retry_after, body}
//   overload           {path, body}: a long stream started; once its first text arrived, two more of the same at once
//                      (raw fetch) -> {statuses: [first, second, third], retry_after: [...], codes: [...]}; all aborted
//   sigterm            {pid, path, streams: [body, body], after: body, drain_wait_ms?}: the streams started (raw
//                      fetch, SSE read by hand so that an error event and [DONE] are both seen); once each has text,
//                      SIGTERM to pid; then a request `after` -> {streams: [{text, finish_reason, error, done, ended,
//                      ms_after_term}], after: {status | connection_error}}
//   soak               {requests: [{endpoint, params}], concurrency, kill?: {pid, after, stream_on?, min_chunks?,
//                      wait_ms?}, timeout_ms?}: the requests through the SDK with its default retries (maxRetries 2),
//                      `concurrency` at a time; with kill, SIGKILL to pid once `after` requests have ended (with
//                      stream_on: and a stream that backend serves has min_chunks chunks (default 2), waiting up to
//                      wait_ms for one) ->
//                      {results: [{i, ok, text, finish_reason, attempts, served_by, in_flight_at_kill, error}],
//                      killed_after, in_flight_at_kill, killed_stream, wall_ms}
import OpenAI from "openai";
import fs from "node:fs";

const [baseUrl, apiKey, ...caseArgs] = process.argv.slice(2);
if (!baseUrl || caseArgs.length === 0) {
  console.error("usage: node openai_client.mjs BASE_URL API_KEY CASE_JSON [CASE_JSON ...]");
  process.exit(1);
}

// Attempts per request (the SDK's retries included), and the backend that answered (HAProxy's X-Served-By), keyed
// by an X-Case-Id header each soak request carries.
const attempts = new Map(), servedBy = new Map();
async function countingFetch(url, init) {
  const id = new Headers(init?.headers).get("x-case-id");
  if (id !== null) attempts.set(id, (attempts.get(id) ?? 0) + 1);
  const response = await fetch(url, init);
  if (id !== null && response.headers.get("x-served-by")) servedBy.set(id, response.headers.get("x-served-by"));
  return response;
}

function client(key = apiKey, extra = {}) {
  return new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: key || "none", fetch: countingFetch, timeout: 60000, ...extra });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function describeError(e) {
  return {
    class: e?.constructor?.name ?? typeof e,
    status: e?.status ?? null,
    code: e?.code ?? null,
    param: e?.param ?? null,
    type: e?.type ?? null,
    retry_after: e?.headers?.get?.("retry-after") ?? null,
    message: String(e?.message ?? e).slice(0, 400),
    cause: e?.cause ? String(e.cause?.message ?? e.cause).slice(0, 200) : null,
  };
}

// One completion through the SDK, whole or streamed.
async function complete(endpoint, params, options = {}, c = client(), onChunk = () => {}) {
  const api = endpoint === "chat" ? c.chat.completions : c.completions;
  const result = { ok: true, text: "", finish_reason: null, usage: null, chunks: 0, role: null, objects: [] };
  let stage = "request";
  try {
    const reply = await api.create(params, options);
    if (!params.stream) {
      const choice = reply.choices[0];
      result.text = endpoint === "chat" ? choice.message.content ?? "" : choice.text;
      result.role = endpoint === "chat" ? choice.message.role : null;
      result.finish_reason = choice.finish_reason;
      result.usage = reply.usage ?? null;
      result.objects = [reply.object];
      result.id = reply.id;
      return result;
    }
    stage = "stream";
    const ids = new Set(), objects = new Set();
    for await (const chunk of reply) {
      ++result.chunks;
      onChunk(result.chunks);
      ids.add(chunk.id), objects.add(chunk.object);
      if (chunk.usage) {
        result.usage = chunk.usage;
        result.usage_chunk_choices = chunk.choices.length;
      }
      for (const choice of chunk.choices) {
        if (endpoint === "chat") {
          if (choice.delta?.role && result.role === null) result.role = choice.delta.role;
          if (choice.delta?.content) result.text += choice.delta.content;
        } else if (choice.text) {
          result.text += choice.text;
        }
        if (choice.finish_reason) result.finish_reason = choice.finish_reason;
      }
    }
    result.ids = ids.size, result.objects = [...objects];
    return result;
  } catch (e) {
    return { ...result, ok: false, stage, error: describeError(e) };
  }
}

// Server-sent events by hand: every data line, in order, as it arrives.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) if (line.startsWith("data: ")) onEvent(line.slice(6));
    }
  }
  return buffer;
}

function rawFetch(path, body, { method = "POST", key = apiKey, signal } = {}) {
  const headers = { "Content-Type": "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  return fetch(`${baseUrl}${path}`, {
    method, headers, signal, body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
}

function eventText(data) {
  const choice = data.choices?.[0];
  return choice ? choice.delta?.content ?? choice.text ?? "" : "";
}

// A raw stream read until it ends; `firstText` resolves at its first chunk with text.
function rawStream(path, body, signal) {
  let firstText;
  const gotText = new Promise((r) => (firstText = r));
  const s = { status: null, retry_after: null, code: null, text: "", finish_reason: null, error: null, done: false,
              after_done: 0, ended: null, end_ms: null };
  const finished = (async () => {
    try {
      const response = await rawFetch(path, body, { signal });
      s.status = response.status, s.retry_after = response.headers.get("retry-after");
      if (response.status !== 200) {
        const text = await response.text();
        try { s.code = JSON.parse(text).error?.code ?? null; } catch { s.code = text.slice(0, 100); }
        s.ended = "refused";
        firstText();
        return s;
      }
      await readEvents(response, (data) => {
        if (s.done) return void ++s.after_done;
        if (data === "[DONE]") return void (s.done = true);
        const event = JSON.parse(data);
        if (event.error) s.error = event.error;
        const text = eventText(event);
        if (text) {
          s.text += text;
          firstText();
        }
        const reason = event.choices?.[0]?.finish_reason;
        if (reason) s.finish_reason = reason;
      });
      s.ended = "closed";
    } catch (e) {
      s.ended = signal?.aborted ? "aborted" : "network_error";
      s.error = s.error ?? describeError(e);
    }
    s.end_ms = Date.now();
    firstText();
    return s;
  })();
  return { s, gotText, finished };
}

const ops = {
  chat: (c) => complete("chat", c.params, c.options),
  completion: (c) => complete("completion", c.params, c.options),

  async models() {
    try {
      const page = await client().models.list();
      return { ok: true, ids: page.data.map((m) => m.id) };
    } catch (e) {
      return { ok: false, error: describeError(e) };
    }
  },

  async all(c) {
    const start = Date.now();
    const results = await Promise.all(c.cases.map((sub) => run(sub)));
    return { results, wall_ms: Date.now() - start };
  },

  async abort(c) {
    const controller = new AbortController();
    const api = c.endpoint === "chat" ? client().chat.completions : client().completions;
    const r = { ok: true, chunks_before_abort: 0, text_before_abort: "", error: null };
    try {
      const stream = await api.create({ ...c.params, stream: true }, { signal: controller.signal });
      for await (const chunk of stream) {
        ++r.chunks_before_abort;
        const text = eventText(chunk);
        r.text_before_abort += text;
        if (text) {
          controller.abort();
          break;
        }
      }
    } catch (e) {
      r.error = describeError(e);
    }
    r.aborted = controller.signal.aborted;
    // watch: how soon the server counts the request cancelled (/metrics) and frees its slot (/health).
    if (c.watch) {
      const start = Date.now();
      r.cancelled_ms = null, r.idle_ms = null;
      while (Date.now() - start < (c.watch_ms ?? 3000) && (r.cancelled_ms === null || r.idle_ms === null)) {
        const metrics = await ops.raw({ method: "GET", path: "/metrics" });
        const m = /^rotary_requests_total\{outcome="cancelled"\} (\d+)$/m.exec(String(metrics.body));
        r.cancelled = m ? Number(m[1]) : null;
        if (r.cancelled_ms === null && r.cancelled >= 1) r.cancelled_ms = Date.now() - start;
        const health = await ops.raw({ method: "GET", path: "/health" });
        r.slots_busy = health.body?.slots_busy ?? null;
        if (r.idle_ms === null && r.slots_busy === 0) r.idle_ms = Date.now() - start;
        await sleep(25);
      }
    }
    return r;
  },

  async raw(c) {
    try {
      const response = await rawFetch(c.path, c.body, { method: c.method ?? "POST", key: c.api_key ?? apiKey });
      const text = await response.text();
      let body = text;
      try { body = JSON.parse(text); } catch {}
      return { status: response.status, retry_after: response.headers.get("retry-after"), body };
    } catch (e) {
      return { status: null, error: describeError(e) };
    }
  },

  async overload(c) {
    const controller = new AbortController();
    const first = rawStream(c.path, c.body, controller.signal);
    await first.gotText;
    const others = [rawStream(c.path, c.body, controller.signal), rawStream(c.path, c.body, controller.signal)];
    // Both answered: a refusal at once, a queued one with its 200 and headers.
    const deadline = Date.now() + 10000;
    const answered = (o) => o.s.status === 200 || o.s.ended !== null;  // a refusal once its body is read
    while (!others.every(answered) && Date.now() < deadline) await sleep(20);
    const all = [first, ...others];
    const r = { statuses: all.map((x) => x.s.status), retry_after: all.map((x) => x.s.retry_after),
                codes: all.map((x) => x.s.code), first_text: first.s.text.length > 0 };
    controller.abort();
    await Promise.all(all.map((x) => x.finished));
    return r;
  },

  async sigterm(c) {
    const streams = c.streams.map((body) => rawStream(c.path, body));
    await Promise.all(streams.map((x) => x.gotText));
    const texts_at_term = streams.map((x) => x.s.text.length);
    const term = Date.now();
    process.kill(c.pid, "SIGTERM");
    await sleep(c.after_delay_ms ?? 300);
    const after = await ops.raw({ path: c.path, body: c.after });
    await Promise.all(streams.map((x) => x.finished));
    return {
      texts_at_term, term_epoch_ms: term,
      streams: streams.map((x) => ({ ...x.s, text_length: x.s.text.length, text: undefined,
                                     ms_after_term: x.s.end_ms === null ? null : x.s.end_ms - term })),
      after: { status: after.status, code: after.body?.error?.code ?? null, retry_after: after.retry_after ?? null,
               connection_error: after.error ? after.error.cause ?? after.error.message : null },
    };
  },

  async soak(c) {
    const start = Date.now();
    const c0 = client(apiKey, { timeout: c.timeout_ms ?? 30000 });  // the SDK's default retries: maxRetries 2
    const results = new Array(c.requests.length);
    const running = new Map();  // request -> chunks received so far (streams)
    let next = 0, ended = 0, killedAfter = null, inFlightAtKill = [], killedStream = null, killWait = null;
    const kill = () => {
      killedAfter = ended;
      inFlightAtKill = [...running.keys()];
      process.kill(c.kill.pid, "SIGKILL");
    };
    // kill.stream_on: once `after` requests have ended, wait (up to kill.wait_ms) until a stream served by that
    // backend (X-Served-By) has received text, and kill then: a stream cut in the middle, the case no retry can mend.
    const tryKill = () => {
      if (!c.kill || killedAfter !== null || ended < c.kill.after) return;
      if (c.kill.stream_on) {
        killWait ??= Date.now();
        for (const [i, chunks] of running)
          if (chunks >= (c.kill.min_chunks ?? 2) && servedBy.get(String(i)) === c.kill.stream_on) {
            killedStream = i;
            return kill();
          }
        if (Date.now() - killWait < (c.kill.wait_ms ?? 3000) && next < c.requests.length) return;
      }
      kill();
    };
    const poll = c.kill ? setInterval(tryKill, 2) : null;
    async function worker() {
      while (next < c.requests.length) {
        const i = next++;
        const { endpoint, params } = c.requests[i];
        running.set(i, 0);
        const t0 = Date.now();
        const r = await complete(endpoint, params, { headers: { "X-Case-Id": String(i) } }, c0,
                                 (chunks) => (running.set(i, chunks), tryKill()));
        running.delete(i);
        results[i] = { i, ...r, ms: Date.now() - t0, attempts: attempts.get(String(i)) ?? 0,
                       served_by: servedBy.get(String(i)) ?? null };
        ++ended;
        tryKill();
      }
    }
    await Promise.all(Array.from({ length: c.concurrency ?? 4 }, worker));
    if (poll) clearInterval(poll);
    for (const i of inFlightAtKill) results[i].in_flight_at_kill = true;
    return { results, killed_after: killedAfter, in_flight_at_kill: inFlightAtKill, killed_stream: killedStream,
             wall_ms: Date.now() - start };
  },
};

async function run(c) {
  const op = ops[c.op];
  if (!op) throw new Error(`unknown op "${c.op}"`);
  return { name: c.name ?? c.op, op: c.op, ...(await op(c)) };
}

for (const arg of caseArgs) {
  let c;
  try {
    c = JSON.parse(arg.startsWith("@") ? fs.readFileSync(arg.slice(1), "utf8") : arg);
  } catch (e) {
    console.error(`openai_client.mjs: cannot read the case ${arg.slice(0, 200)}: ${e.message}`);
    process.exit(1);
  }
  console.log(JSON.stringify(await run(c)));
}
