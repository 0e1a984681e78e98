#!/usr/bin/env python3
"""A/B of two or more builds of the core library under `rotary bench linear`, on one noisy machine: the kernel
numbers in docs/gguf.md and in core/src's comments ("A/B, ... rounds") are taken this way.

One `rotary` binary runs against each build's `librotary.so.0` in turn (LD_LIBRARY_PATH), so the only difference
between the runs is the kernels; the order of the libraries alternates from round to round (a machine that slows
down over a run slows both), and per (format, shape, tokens, library) it prints the fastest and the median
microseconds per call of the prefill rows (`rotary bench linear`'s decode row is the 1-token call: ask for
--tokens 1 to see it as a prefill row). A single run on a shared host moves by up to 2x; the fastest of several
rounds moves far less, and the two libraries' fastest runs are what a change is judged by.

    cp build-notorch/core/librotary.so.0 /tmp/libA/          # before the change
    ... rebuild ...
    cp build-notorch/core/librotary.so.0 /tmp/libB/          # after
    python3 scripts/ab_linear.py --libs /tmp/libA /tmp/libB --formats q4_0:q8,q4_k:q8 --shapes 4864x1024 \\
        --tokens 1,4,8,512 --rounds 3

--simd-target passes ROTARY_SIMD_TARGET (e.g. avx2: the AVX2 kernels on an AVX-512 CPU). The CPU line of the
first run (model and flags) is printed first, to stand beside the table. Stdlib only.
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys


def run_once(rotary, lib, args, tokens):
    env = dict(os.environ, LD_LIBRARY_PATH=lib)
    if args.simd_target:
        env["ROTARY_SIMD_TARGET"] = args.simd_target
    cmd = [rotary, "bench", "linear", "--formats", args.formats, "--shapes", args.shapes, "--tokens", str(tokens),
           "--trials", str(args.trials), "--threads", str(args.threads), "--weight-mib", str(args.weight_mib)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"ab_linear: {' '.join(cmd)} with LD_LIBRARY_PATH={lib} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libs", nargs="+", required=True, help="folders, each holding one build's librotary.so.0")
    ap.add_argument("--formats", required=True, help="rotary bench linear --formats, e.g. q4_0:q8,bf16")
    ap.add_argument("--shapes", required=True, help="rotary bench linear --shapes, e.g. 4864x1024,1024x4864")
    ap.add_argument("--tokens", default="1,4,8", help="token counts, comma-separated (default 1,4,8)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs every library once per token count")
    ap.add_argument("--trials", type=int, default=5, help="rotary bench linear --trials (it keeps the fastest)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weight-mib", type=int, default=32)
    ap.add_argument("--simd-target", default="", help="ROTARY_SIMD_TARGET for every run (default: the CPU's best)")
    ap.add_argument("--rotary", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                      "build-notorch", "lab", "rotary"))
    args = ap.parse_args()
    for lib in args.libs:
        if not os.path.isfile(os.path.join(lib, "librotary.so.0")):
            sys.exit(f"ab_linear: --libs {lib}: no librotary.so.0 there")
    if args.rounds < 1:
        sys.exit(f"ab_linear: --rounds {args.rounds}: at least 1")
    try:
        token_counts = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        sys.exit(f"ab_linear: --tokens {args.tokens}: comma-separated positive integers")
    if not token_counts or min(token_counts) < 1:
        sys.exit(f"ab_linear: --tokens {args.tokens}: comma-separated positive integers")

    times = collections.defaultdict(list)  # (weights, shape, tokens, lib) -> us per call, one per round
    cpu_line = None
    for r in range(args.rounds):
        for tokens in token_counts:
            for lib in (args.libs if r % 2 == 0 else args.libs[::-1]):
                for line in run_once(args.rotary, lib, args, tokens).splitlines():
                    f = line.split()
                    if line.startswith("cpu:") and cpu_line is None:
                        cpu_line = line
                    if len(f) > 4 and f[0] == "prefill" and f[1] != "sgemm_f32":
                        times[(f[1], f[2], tokens, lib)].append(float(f[4]))
    print(cpu_line or "cpu: (rotary bench linear printed no cpu line)")
    print(f"rounds {args.rounds}, us per call, fastest / median; libraries in the order given")
    names = [os.path.basename(os.path.normpath(lib)) or lib for lib in args.libs]
    print(f"{'weights':<12}{'shape':<14}{'tokens':>7}  " + "  ".join(f"{n:>22}" for n in names))
    for key in sorted({k[:3] for k in times}, key=lambda k: (k[0], k[1], k[2])):
        cells = []
        for lib in args.libs:
            t = times.get(key + (lib,), [])
            cells.append(f"{min(t):>10.1f} / {statistics.median(t):>9.1f}" if t else f"{'-':>22}")
        print(f"{key[0]:<12}{key[1]:<14}{key[2]:>7}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
