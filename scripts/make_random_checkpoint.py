#!/usr/bin/env python3
"""Writes a Hugging Face model directory with random weights in the shape of a real checkpoint, for the engine's
benchmarks at real size (docs/engine.md): config.json and model-0000i-of-0000n.safetensors shards (at most
--shard-gb each) with model.safetensors.index.json, every tensor N(0, 0.02) (norm weights 1) stored as bf16 (or
--dtype f16 / f32). Nothing is downloaded; the shapes are the published configs' numbers.

    /usr/bin/python3 scripts/make_random_checkpoint.py --shape llama3-8b --out /tmp/llama3-8b-random
"""
import argparse
import json
import os
import struct

import numpy as np

# The published config.json numbers of each shape (llama: RMSNorm, SwiGLU; qwen2 adds q/k/v biases).
SHAPES = {
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, rope_theta=1000000.0,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "llama2-13b": dict(model_type="llama", hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000, rope_theta=10000.0,
                       max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False),
}


def tensors(c):
    """(name, shape) of every tensor, in the order transformers saves them."""
    d, ff, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    hq, hkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (V, d))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)),
                (p + "self_attn.q_proj.weight", (hq, d)), (p + "self_attn.k_proj.weight", (hkv, d)),
                (p + "self_attn.v_proj.weight", (hkv, d))]
        if c["model_type"] == "qwen2":
            out += [(p + "self_attn.q_proj.bias", (hq,)), (p + "self_attn.k_proj.bias", (hkv,)),
                    (p + "self_attn.v_proj.bias", (hkv,))]
        out += [(p + "self_attn.o_proj.weight", (d, hq)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (ff, d)), (p + "mlp.up_proj.weight", (ff, d)),
                (p + "mlp.down_proj.weight", (d, ff))]
    out.append(("model.norm.weight", (d,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, d)))
    return out


def values(name, shape, rng, dtype):
    n = int(np.prod(shape))
    if name.endswith("norm.weight"):
        x = np.ones(n, np.float32)
    else:
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
    if dtype == "f32":
        return x.tobytes()
    if dtype == "f16":
        return x.astype(np.float16).tobytes()
    u = x.view(np.uint32)  # bf16: round to nearest even on the upper 16 bits
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def write_shard(path, entries, dtype_name):
    header, offset = {}, 0
    for name, shape, data in entries:
        header[name] = {"dtype": dtype_name, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in entries:
            f.write(data)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c = dict(SHAPES[a.shape])
    c["architectures"] = ["Qwen2ForCausalLM" if c["model_type"] == "qwen2" else "LlamaForCausalLM"]
    c["hidden_act"] = "silu"
    os.makedirs(a.out, exist_ok=True)
    st_dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[a.dtype]
    rng = np.random.default_rng(a.seed)
    # Shards planned from the shapes first (the names carry their count), then filled one at a time, so memory
    # holds one shard's bytes at most.
    elem = {"bf16": 2, "f16": 2, "f32": 4}[a.dtype]
    plan, current, size, limit = [], [], 0, int(a.shard_gb * 2**30)
    for name, shape in tensors(c):
        nbytes = int(np.prod(shape)) * elem
        if current and size + nbytes > limit:
            plan.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    plan.append(current)
    n = len(plan)
    weight_map, total = {}, 0
    for i, names in enumerate(plan):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        entries = [(name, shape, values(name, shape, rng, a.dtype)) for name, shape in names]
        write_shard(os.path.join(a.out, fname), entries, st_dtype)
        for name, _, data in entries:
            weight_map[name] = fname
            total += len(data)
        print(f"wrote {fname} ({sum(len(d) for _, _, d in entries) / 1e9:.2f} GB)", flush=True)
        del entries
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    print(f"{a.out}: {a.shape}, {total / 1e9:.2f} GB of {a.dtype} weights in {n} shard(s)")


if __name__ == "__main__":
    main()
