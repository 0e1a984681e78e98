#!/usr/bin/env python3
"""Aggregate decode speed and time to first token of an OpenAI-compatible server at several concurrencies -
`rotary serve` or llama.cpp's `llama-server` alike (docs/server.md). Each stream is a streamed /v1/completions of a
prompt of token ids (the same ids to both servers: no tokenizer differences) with a fixed number of new tokens
(ignore_eos / min_tokens ask llama-server not to stop early; rotary's greedy answers of random weights do not stop).

    python3 scripts/bench_serve.py --url http://127.0.0.1:8080 --prompt-tokens 512 --new 64 --streams 1,2,4,8

Per concurrency C: C streams at once, each a different prompt (no prompt of a run starts like an earlier one, so no
prefix cache helps);
prints C, aggregate decode tokens/s while every stream decodes (the tokens all streams receive between the last
stream's first token - every prompt read - and the first stream's last token, over that time), median time to first
token, p50/p99 inter-token gaps over the whole run (prompt reads of the later streams included). Every stream asks
for the usage (`stream_options.include_usage`); the `tokens` column is `ok` when every stream's usage says exactly
--prompt-tokens prompt tokens and --new completion tokens and a text chunk arrived for each of them, else what
differed (a server that holds back an incomplete UTF-8 character merges tokens into one chunk). Stdlib only.

With --long-prompt-tokens L (the issue's inter-token latency goal): first one stream alone (its median gap is the
one-stream median), then per C: C streams decode, and once all of them have their first token one more request
with a different L-token prompt and one new token starts; the C streams' gaps that overlap the time until that
request's first token - the long prompt being read - give the p50 / p99 / max gap during the read, over the
one-stream median gap, and the long prompt's time to first token. The C streams ask for --long-new tokens and are
closed (cancelled) as soon as the long prompt's first token arrives. With --long-window S only the first S seconds
of the read are measured (for a slow read: the gaps are alike all through it), then the long prompt is cancelled too
and its time to first token shows as "> S". The server needs C + 1 slots, and a context of L + 1 tokens per slot.
"""
import argparse
import http.client
import json
import socket
import statistics
import sys
import threading
import time
import urllib.parse


def stream_once(url, ids, new, api_key, out, first_event=None, stop_event=None, conns=None):
    """One streamed completion; appends (start, token chunk times, usage, closed early) to out. first_event is set at
    the first token; stop_event set by another thread closes the stream at its next chunk; the connection is appended
    to conns (another thread may shut its socket down)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=1200)
    if conns is not None:
        conns.append(conn)
    body = json.dumps({"prompt": ids, "max_tokens": new, "temperature": 0, "stream": True, "ignore_eos": True,
                       "min_tokens": new, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    times, usage, closed = [], None, False
    buf = b""
    while True:
        if stop_event is not None and stop_event.is_set():
            closed = True
            break
        try:
            chunk = resp.read1(65536)
        except (OSError, http.client.HTTPException):  # shut down by another thread
            closed = True
            break
        if not chunk:
            closed = closed or (stop_event is not None and stop_event.is_set())
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            if j.get("choices") and j["choices"][0].get("text"):
                times.append(now)
                if first_event is not None:
                    first_event.set()
    conn.close()
    out.append((start, times, usage, closed))


_prompts_made = [0]


def prompt_ids(n, vocab):
    """A prompt no earlier one of this run starts like (no prefix cache helps): the k-th starts 131 k places later
    in one sequence of ids."""
    k = _prompts_made[0]
    _prompts_made[0] += 1
    return [(1000 + 7919 * (i + 131 * k)) % vocab for i in range(n)]


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def check_tokens(results, prompt_tokens, new):
    """'ok', or what differed from prompt_tokens / new in the streams' usage and chunk counts."""
    bad = []
    for _, times, usage, _ in results:
        if usage is None:
            bad.append("no usage")
            continue
        if usage.get("prompt_tokens") != prompt_tokens:
            bad.append(f"prompt {usage.get('prompt_tokens')}")
        if usage.get("completion_tokens") != new:
            bad.append(f"completion {usage.get('completion_tokens')}")
        if len(times) != usage.get("completion_tokens"):
            bad.append(f"{len(times)} chunks")
    return "ok" if not bad else ",".join(sorted(set(bad)))


def run_streams(a, c):
    results, threads = [], []
    for s in range(c):
        ids = prompt_ids(a.prompt_tokens, a.vocab)
        threads.append(threading.Thread(target=stream_once, args=(a.url, ids, a.new, a.api_key, results)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(results) != c:
        sys.exit(f"{c - len(results)} of {c} streams failed")
    return results


def long_prompt_run(a, c, one_stream_median):
    """C streams decoding, one L-token prompt started once all of them decode; returns the table row's values."""
    results, threads, long_out = [], [], []
    firsts = [threading.Event() for _ in range(c)]
    stop = threading.Event()
    for s in range(c):
        ids = prompt_ids(a.prompt_tokens, a.vocab)
        threads.append(threading.Thread(target=stream_once, args=(a.url, ids, a.long_new, a.api_key, results,
                                                                  firsts[s], stop)))
    for t in threads:
        t.start()
    for e in firsts:
        e.wait()
    time.sleep(a.long_delay)
    long_ids = prompt_ids(a.long_prompt_tokens, a.vocab)
    long_stop, long_conns = threading.Event(), []
    lt = threading.Thread(target=stream_once, args=(a.url, long_ids, 1, a.api_key, long_out, None, long_stop,
                                                    long_conns))
    lt.start()
    lt.join(a.long_window if a.long_window > 0 else None)
    cut = time.perf_counter()
    if lt.is_alive():  # --long-window passed before the long prompt's first token: cancel it
        long_stop.set()
        for conn in long_conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        lt.join()
    stop.set()
    for t in threads:
        t.join()
    if len(results) != c or len(long_out) != 1:
        sys.exit(f"long prompt run at {c} streams failed")
    lo = long_out[0][0]
    read = bool(long_out[0][1])
    hi = long_out[0][1][0] if read else cut
    gaps = [b - a_ for _, times, _, _ in results for a_, b in zip(times, times[1:]) if b > lo and a_ < hi]
    ended = sum(1 for _, _, _, closed in results if not closed)
    return gaps, hi - lo, read, ended


def cpu_description():
    """The CPU's model name and the instruction-set flags the kernels dispatch on (a speed means little without)."""
    model, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")
                             if x in have]
                    break
    except OSError:
        pass
    return f"{model} [{' '.join(flags)}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn below this")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--long-prompt-tokens", type=int, default=0,
                    help="measure the gaps of C decoding streams while one more prompt of this many tokens is read")
    ap.add_argument("--long-new", type=int, default=2000,
                    help="--long-prompt-tokens: the decoding streams' max_tokens (closed when the long prompt is read)")
    ap.add_argument("--long-delay", type=float, default=1.0,
                    help="--long-prompt-tokens: seconds between every stream's first token and the long prompt")
    ap.add_argument("--long-window", type=float, default=0,
                    help="--long-prompt-tokens: measure only the first this many seconds of the read, then cancel "
                         "the long prompt (0: until its first token)")
    a = ap.parse_args()
    print(f"cpu: {cpu_description()}")
    if a.long_prompt_tokens:
        base = run_streams(a, 1)
        one = statistics.median(b - a_ for _, times, _, _ in base for a_, b in zip(times, times[1:]))
        print(f"one stream alone: median gap {one * 1e3:.1f} ms, tokens {check_tokens(base, a.prompt_tokens, a.new)}")
        print("| server | streams | long prompt tokens | gaps during the read | p50 gap ms | p99 gap ms | max gap ms "
              "| p99 / one-stream median | long prompt TTFT s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in [int(x) for x in a.streams.split(",")]:
            gaps, ttft, read, ended = long_prompt_run(a, c, one)
            if ended:
                print(f"warning: {ended} of {c} streams ended before the long prompt was read (raise --long-new)")
            ttft_text = f"{ttft:.2f}" if read else f"> {ttft:.0f} (cancelled)"
            print(f"| {a.label} | {c} | {a.long_prompt_tokens} | {len(gaps)} | {pct(gaps, 0.5) * 1e3:.1f} | "
                  f"{pct(gaps, 0.99) * 1e3:.1f} | {max(gaps) * 1e3 if gaps else float('nan'):.1f} | "
                  f"{pct(gaps, 0.99) / one:.2f} | {ttft_text} |", flush=True)
        return
    print("| server | streams | aggregate decode tok/s | median TTFT s | p50 gap ms | p99 gap ms | tokens |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for c in [int(x) for x in a.streams.split(",")]:
        results = run_streams(a, c)
        firsts = [times[0] for _, times, _, _ in results if times]
        ends = [times[-1] for _, times, _, _ in results if times]
        lo, hi = max(firsts), min(ends)
        tokens = sum(1 for _, times, _, _ in results for t in times if lo < t <= hi)
        agg = tokens / (hi - lo) if hi > lo else float("nan")
        ttft = statistics.median(times[0] - start for start, times, _, _ in results if times)
        gaps = [b - a_ for _, times, _, _ in results for a_, b in zip(times, times[1:])]
        print(f"| {a.label} | {c} | {agg:.1f} | {ttft:.3f} | {pct(gaps, 0.5) * 1e3:.1f} | "
              f"{pct(gaps, 0.99) * 1e3:.1f} | {check_tokens(results, a.prompt_tokens, a.new)} |", flush=True)


if __name__ == "__main__":
    main()
