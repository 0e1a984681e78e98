#!/usr/bin/env python3
"""Forward + backward of rotary.apply_rotary_emb against transformers' rotate_half formula in plain PyTorch
(q * cos + rotate_half(q) * sin), the same input, the same threads, alternated rounds; prints the CPU's flags
beside the table. Issue 47's goal: >= 3x at [1, 4096, 32, 128] float32. Also prints the largest allocation the in-place
form makes (torch.profiler's memory view): the row indices, nothing the size of x.

  python3 scripts/bench_apply_rotary.py [--shape 1,4096,32,128] [--rounds 3] [--iters 10]
Run with the package importable (pip install ., or PYTHONPATH=python ROTARY_TORCH_LIB=build/torch/librotary_torch.so).
"""
import argparse
import os
import sys
import time

import torch

import rotary

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import cpu_description  # noqa: E402  (one description of the CPU for every speed table)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,4096,32,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    B, S, H, D = (int(v) for v in a.shape.split(","))
    torch.manual_seed(0)
    x = torch.randn(B, S, H, D)
    grad = torch.randn_like(x)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cos, sin = freqs.cos().float(), freqs.sin().float()
    cos_hf = torch.cat([cos, cos], -1)[None, :, None, :]
    sin_hf = torch.cat([sin, sin], -1)[None, :, None, :]

    def plain():
        t = x.detach().requires_grad_()
        (t * cos_hf + rotate_half(t) * sin_hf).backward(grad)
        return t.grad

    def fused():
        t = x.detach().requires_grad_()
        rotary.apply_rotary_emb(t, cos, sin).backward(grad)
        return t.grad

    err = (plain() - fused()).abs().max().item()

    def seconds(fn):
        fn()
        start = time.perf_counter()
        for _ in range(a.iters):
            fn()
        return (time.perf_counter() - start) / a.iters

    print(f"CPU: {cpu_description()}; torch {torch.__version__}, {torch.get_num_threads()} threads; shape {a.shape} float32")
    print(f"max |fused - plain| of dx: {err:.3g}")
    print("| round | plain PyTorch fwd+bwd (ms) | rotary fwd+bwd (ms) | speedup |")
    print("|---:|---:|---:|---:|")
    ratios = []
    for r in range(a.rounds):
        p, f = seconds(plain), seconds(fused)
        ratios.append(p / f)
        print(f"| {r + 1} | {p * 1e3:.1f} | {f * 1e3:.1f} | {p / f:.2f}x |")
    print(f"median speedup {sorted(ratios)[len(ratios) // 2]:.2f}x (goal >= 3x)")

    y = x.clone()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        rotary.apply_rotary_emb(y, cos, sin, inplace=True)
    largest = max(e.cpu_memory_usage for e in prof.key_averages())
    print(f"in place: the largest allocation of any op is {largest} bytes (x is {x.numel() * 4} bytes)")

if __name__ == "__main__":
    main()
