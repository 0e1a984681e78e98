#!/usr/bin/env python3
"""Aggregate decode speed and time to first token of an OpenAI-compatible server at several concurrencies -
`rotary serve` or llama.cpp's `llama-server` alike (docs/server.md). Each stream is a streamed /v1/completions of a
prompt of token ids (the same ids to both servers: no tokenizer differences) with a fixed number of new tokens
(ignore_eos / min_tokens ask llama-server not to stop early; rotary's greedy answers of random weights do not stop).

    python3 scripts/bench_serve.py --url http://127.0.0.1:8080 --prompt-tokens 512 --new 64 --streams 1,2,4,8

Per concurrency C: C streams at once, each a different prompt (ids shifted per stream, so no prefix is shared);
prints C, aggregate decode tokens/s while every stream decodes (the tokens all streams receive between the last
stream's first token - every prompt read - and the first stream's last token, over that time), median time to first
token, p50/p99 inter-token gaps over the whole run (prompt reads of the later streams included). Stdlib only.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def stream_once(url, ids, new, api_key, out):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": ids, "max_tokens": new, "temperature": 0, "stream": True, "ignore_eos": True,
                       "min_tokens": new})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    times = []
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("choices") and j["choices"][0].get("text"):
                times.append(time.perf_counter())
    out.append((start, times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn below this")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    print(f"| server | streams | aggregate decode tok/s | median TTFT s | p50 gap ms | p99 gap ms |")
    print(f"|---|---:|---:|---:|---:|---:|")
    for c in [int(x) for x in a.streams.split(",")]:
        results, threads = [], []
        for s in range(c):
            ids = [(1000 + 7919 * (i + 131 * s)) % a.vocab for i in range(a.prompt_tokens)]
            threads.append(threading.Thread(target=stream_once, args=(a.url, ids, a.new, a.api_key, results)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(results) != c:
            sys.exit(f"{c - len(results)} of {c} streams failed")
        firsts = [times[0] for _, times in results if times]
        ends = [times[-1] for _, times in results if times]
        lo, hi = max(firsts), min(ends)
        tokens = sum(1 for _, times in results for t in times if lo < t <= hi)
        agg = tokens / (hi - lo) if hi > lo else float("nan")
        ttft = statistics.median(times[0] - start for start, times in results if times)
        gaps = sorted(b - a_ for _, times in results for a_, b in zip(times, times[1:]))
        p = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3 if gaps else float("nan")
        print(f"| {a.label} | {c} | {agg:.1f} | {ttft:.3f} | {p(0.5):.1f} | {p(0.99):.1f} |", flush=True)


if __name__ == "__main__":
    main()
