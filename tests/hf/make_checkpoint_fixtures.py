#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints and their logits, for tests/nn/test_hf_checkpoint.cpp.

Each fixture is a model directory as Hugging Face writes one - config.json, safetensors weights (one file, or
shards with model.safetensors.index.json) - plus expected.safetensors: the token ids ("tokens", F32 [S]) and the
logits of the checkpoint on them ("logits", F32 [S, V]; "logits_rerope_w8" where a ReRoPE override is checked).

The logits come from a plain-torch transcription of transformers' modeling code (LlamaForCausalLM, which Mistral
and Qwen2 follow; GPTNeoXForCausalLM), written apart from rotary's C++ and run in float64 on the stored (rounded)
weights. The rotary frequencies are those of hf_rope_reference.py (transformers' rope functions, transcribed).
transformers itself is not on the CI machines; docs/checkpoints.md says which families have also been checked
against it.

Usage:
  /usr/bin/python3 tests/hf/make_checkpoint_fixtures.py OUT_DIR      # writes OUT_DIR/<family>/...
  /usr/bin/python3 tests/hf/make_checkpoint_fixtures.py --check DIR  # recomputes DIR's logits from its own files
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_rope_reference as hf_rope  # noqa: E402

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


# ---- safetensors, written and read as the format says ------------------------------------------------------------

def tensor_bytes(t, dtype):
    t = t.to(DTYPES[dtype]).contiguous()
    if SIZES[dtype] == 2:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, dtype, metadata=None):
    """tensors: {name: tensor}; every one stored as `dtype`; header padded with spaces to 8 bytes as HF does."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = tensor_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = DTYPES[info["dtype"]]
        if SIZES[info["dtype"]] == 2:
            t = torch.frombuffer(bytearray(data[b:e]), dtype=torch.int16).view(dt)
        else:
            t = torch.frombuffer(bytearray(data[b:e]), dtype=dt)
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    return out


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(read_safetensors(os.path.join(model_dir, name)))
    return weights


# ---- the models, transcribed from transformers (float64) ---------------------------------------------------------

def rope_tables(config_dict, positions):
    """cos, sin [S, rotary_dim] as HF's RotaryEmbedding: emb = cat(freqs, freqs), times attention_scaling."""
    config = hf_rope.build_config(dict(config_dict))
    rope_type = config.rope_parameters["rope_type"]
    inv_freq, attention_factor = hf_rope.ROPE_INIT_FUNCTIONS[rope_type](config, None)
    freqs = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x [S, H, D]: the first rotary_dim features turned (half-split pairs), the rest passed through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    rot = rot * cos[:, None, :] + rotate_half(rot) * sin[:, None, :]
    return torch.cat([rot, rest], dim=-1)


def attention(q, k, v, cfg, rerope_window=0):
    """q [S, Hq, D], k, v [S, Hkv, D] un-rotated; causal softmax attention with the checkpoint's rope.

    rerope_window > 0: ReRoPE (seed 004) - distances >= w score as if the key sat w positions back.
    """
    S, Hq, D = q.shape
    group = Hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    pos = torch.arange(S)
    cos, sin = rope_tables(cfg, pos)
    qr, kr = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = torch.einsum("ihd,jhd->hij", qr, kr) / math.sqrt(D)
    if rerope_window > 0:
        w = rerope_window
        cw, sw = rope_tables(cfg, torch.full((S,), w))
        q_far = apply_rope(q, cw, sw)  # R(w) q against un-rotated keys: every far key at distance w
        far = torch.einsum("ihd,jhd->hij", q_far, k) / math.sqrt(D)
        dist = pos[:, None] - pos[None, :]
        scores = torch.where((dist < w)[None], scores, far)
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask[None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("hij,jhd->ihd", p, v).reshape(S, Hq * D)


def linear(x, w, b=None):
    y = x @ w.T
    return y + b if b is not None else y


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def llama_logits(cfg, W, tokens, rerope_window=0):
    """LlamaForCausalLM (Mistral and Qwen2 are the same model with other biases and defaults)."""
    H, Hkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    get = W.get
    h = W["model.embed_tokens.weight"][tokens]
    S = h.shape[0]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, W[p + "input_layernorm.weight"], eps)
        q = linear(x, W[p + "self_attn.q_proj.weight"], get(p + "self_attn.q_proj.bias")).view(S, H, D)
        k = linear(x, W[p + "self_attn.k_proj.weight"], get(p + "self_attn.k_proj.bias")).view(S, Hkv, D)
        v = linear(x, W[p + "self_attn.v_proj.weight"], get(p + "self_attn.v_proj.bias")).view(S, Hkv, D)
        h = h + linear(attention(q, k, v, cfg, rerope_window), W[p + "self_attn.o_proj.weight"],
                       get(p + "self_attn.o_proj.bias"))
        x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        gate = linear(x, W[p + "mlp.gate_proj.weight"])
        up = linear(x, W[p + "mlp.up_proj.weight"])
        h = h + linear(torch.nn.functional.silu(gate) * up, W[p + "mlp.down_proj.weight"])
    h = rms_norm(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return h @ head.T


def neox_logits(cfg, W, tokens, rerope_window=0):
    """GPTNeoXForCausalLM with use_parallel_residual: h + attn(ln1(h)) + mlp(ln2(h))."""
    H = cfg["num_attention_heads"]
    D = cfg["hidden_size"] // H
    eps = cfg["layer_norm_eps"]
    h = W["gpt_neox.embed_in.weight"][tokens]
    S = h.shape[0]
    for i in range(cfg["num_hidden_layers"]):
        p = f"gpt_neox.layers.{i}."
        x = layer_norm(h, W[p + "input_layernorm.weight"], W[p + "input_layernorm.bias"], eps)
        qkv = linear(x, W[p + "attention.query_key_value.weight"], W[p + "attention.query_key_value.bias"])
        qkv = qkv.view(S, H, 3 * D)
        q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
        a = linear(attention(q, k, v, cfg, rerope_window), W[p + "attention.dense.weight"],
                   W[p + "attention.dense.bias"])
        x2 = layer_norm(h, W[p + "post_attention_layernorm.weight"], W[p + "post_attention_layernorm.bias"], eps)
        m = linear(x2, W[p + "mlp.dense_h_to_4h.weight"], W[p + "mlp.dense_h_to_4h.bias"])
        m = linear(torch.nn.functional.gelu(m), W[p + "mlp.dense_4h_to_h.weight"], W[p + "mlp.dense_4h_to_h.bias"])
        h = h + a + m
    h = layer_norm(h, W["gpt_neox.final_layer_norm.weight"], W["gpt_neox.final_layer_norm.bias"], eps)
    return h @ W["embed_out.weight"].T


def logits_of(cfg, W, tokens, rerope_window=0):
    fn = neox_logits if cfg["model_type"] == "gpt_neox" else llama_logits
    return fn(cfg, W, tokens, rerope_window)


# ---- the fixtures ---------------------------------------------------------------------------------------------------

def llama_weights(cfg, gen):
    """Random weights large enough that attention is sharp and positions change the logits."""
    d, ff, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, Hkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or d // H
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)

    def rnd(*shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    W = {"model.embed_tokens.weight": rnd(V, d, std=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = 1 + rnd(d, std=0.1)
        for name, out in (("q", H * D), ("k", Hkv * D), ("v", Hkv * D)):
            W[p + f"self_attn.{name}_proj.weight"] = rnd(out, d, std=0.5 / math.sqrt(d) * 3)
            if qkv_bias:
                W[p + f"self_attn.{name}_proj.bias"] = rnd(out, std=0.1)
        W[p + "self_attn.o_proj.weight"] = rnd(d, H * D, std=1 / math.sqrt(H * D))
        W[p + "post_attention_layernorm.weight"] = 1 + rnd(d, std=0.1)
        W[p + "mlp.gate_proj.weight"] = rnd(ff, d, std=1 / math.sqrt(d))
        W[p + "mlp.up_proj.weight"] = rnd(ff, d, std=1 / math.sqrt(d))
        W[p + "mlp.down_proj.weight"] = rnd(d, ff, std=1 / math.sqrt(ff))
    W["model.norm.weight"] = 1 + rnd(d, std=0.1)
    if not cfg.get("tie_word_embeddings"):
        W["lm_head.weight"] = rnd(V, d, std=1 / math.sqrt(d))
    return W


def neox_weights(cfg, gen):
    d, ff, V, H = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_attention_heads"]

    def rnd(*shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    W = {"gpt_neox.embed_in.weight": rnd(V, d, std=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"gpt_neox.layers.{i}."
        for ln in ("input_layernorm", "post_attention_layernorm"):
            W[p + ln + ".weight"] = 1 + rnd(d, std=0.1)
            W[p + ln + ".bias"] = rnd(d, std=0.1)
        W[p + "attention.query_key_value.weight"] = rnd(3 * d, d, std=1.5 / math.sqrt(d))
        W[p + "attention.query_key_value.bias"] = rnd(3 * d, std=0.1)
        W[p + "attention.dense.weight"] = rnd(d, d, std=1 / math.sqrt(d))
        W[p + "attention.dense.bias"] = rnd(d, std=0.1)
        W[p + "mlp.dense_h_to_4h.weight"] = rnd(ff, d, std=1 / math.sqrt(d))
        W[p + "mlp.dense_h_to_4h.bias"] = rnd(ff, std=0.1)
        W[p + "mlp.dense_4h_to_h.weight"] = rnd(d, ff, std=1 / math.sqrt(ff))
        W[p + "mlp.dense_4h_to_h.bias"] = rnd(d, std=0.1)
    W["gpt_neox.final_layer_norm.weight"] = 1 + rnd(d, std=0.1)
    W["gpt_neox.final_layer_norm.bias"] = rnd(d, std=0.1)
    W["embed_out.weight"] = rnd(V, d, std=1 / math.sqrt(d))
    return W


BASE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "vocab_size": 64, "hidden_act": "silu"}

FIXTURES = {
    # Llama 2 shape: MHA, untied head, default rope; F32 in two shards with an index; a ReRoPE override checked.
    "llama2": dict(config=dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5,
                               max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=False),
                   dtype="F32", shards=2, seq=24, rerope=8),
    # Llama 3.2 shape: GQA, tied head, llama3 rope scaling (original context 16, run at 40); BF16. With the
    # Llama-3-style byte-level BPE tokenizer of tests/data/hf_tokenizers (ids < 302), so `rotary perplexity
    # --text` runs end to end on it.
    "llama3": dict(config=dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5,
                               vocab_size=302, bos_token_id=300, eos_token_id=301,
                               num_key_value_heads=1, max_position_embeddings=128, rope_theta=500000.0,
                               tie_word_embeddings=True,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
                   dtype="BF16", shards=1, seq=40, tokenizer="llama3_style"),
    # Mistral shape: GQA 2:1, an explicit head_dim (32, not hidden / heads = 16), no sliding window; F16.
    "mistral": dict(config=dict(BASE, model_type="mistral", architectures=["MistralForCausalLM"], rms_norm_eps=1e-6,
                                num_key_value_heads=1, head_dim=32, max_position_embeddings=64,
                                rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False),
                    dtype="F16", shards=1, seq=24),
    # Qwen2.5 shape: q, k, v biases, tied head, yarn scaling (original context 16, run at 40); BF16.
    "qwen2": dict(config=dict(BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"], rms_norm_eps=1e-6,
                              num_key_value_heads=1, max_position_embeddings=64, rope_theta=1000000.0,
                              tie_word_embeddings=True, use_sliding_window=False, sliding_window=32,
                              rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
                  dtype="BF16", shards=1, seq=40),
    # Pythia shape: partial rotation (rotary_pct 0.25 of head_dim 16 = 4 features), parallel residual, LayerNorm,
    # GELU, fused query_key_value, untied embed_out, the old causal-mask buffers stored beside the weights; F16.
    "gpt_neox": dict(config=dict(BASE, model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], hidden_act="gelu",
                                 intermediate_size=96, layer_norm_eps=1e-5, rotary_pct=0.25, rotary_emb_base=10000,
                                 max_position_embeddings=32, use_parallel_residual=True, tie_word_embeddings=False),
                     dtype="F16", shards=1, seq=24, rerope=8),
}


def write_fixture(out_dir, name, spec, seed):
    cfg = spec["config"]
    gen = torch.Generator().manual_seed(seed)
    W = (neox_weights if cfg["model_type"] == "gpt_neox" else llama_weights)(cfg, gen)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    stored = dict(W)
    if cfg["model_type"] == "gpt_neox":  # buffers old GPT-NeoX checkpoints carry; the loader skips them
        S_max = cfg["max_position_embeddings"]
        stored["gpt_neox.layers.0.attention.bias"] = torch.ones(1, 1, S_max, S_max).tril()
        stored["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e4)
    if spec.get("tokenizer"):
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf_tokenizers", spec["tokenizer"])
        for f in sorted(os.listdir(src)):
            shutil.copyfile(os.path.join(src, f), os.path.join(d, f))
    names = list(stored)
    if spec["shards"] == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), stored, spec["dtype"], {"format": "pt"})
    else:
        n = spec["shards"]
        weight_map = {}
        for s in range(n):
            part = names[s * len(names) // n:(s + 1) * len(names) // n]
            file = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
            write_safetensors(os.path.join(d, file), {k: stored[k] for k in part}, spec["dtype"], {"format": "pt"})
            weight_map.update({k: file for k in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")
    tokens = torch.randint(0, cfg["vocab_size"], (spec["seq"],), generator=gen)
    expected = {"tokens": tokens.to(torch.float64)}  # small ids: exact in float32
    expected.update(expected_logits(d, cfg, spec, tokens))
    write_safetensors(os.path.join(d, "expected.safetensors"), expected, "F32",
                      {"made_by": "tests/hf/make_checkpoint_fixtures.py"})


def expected_logits(model_dir, cfg, spec, tokens):
    W = read_checkpoint(model_dir)  # the weights as stored (rounded to the fixture's dtype)
    out = {"logits": logits_of(cfg, W, tokens)}
    if spec.get("rerope"):
        out[f"logits_rerope_w{spec['rerope']}"] = logits_of(cfg, W, tokens, spec["rerope"])
    return out


def check(fixture_dir):
    worst = 0.0
    for name, spec in FIXTURES.items():
        d = os.path.join(fixture_dir, name)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        tokens = read_safetensors(os.path.join(d, "expected.safetensors"))["tokens"].to(torch.int64)
        stored = read_safetensors(os.path.join(d, "expected.safetensors"))
        for key, value in expected_logits(d, cfg, spec, tokens).items():
            err = (value - stored[key]).abs().max().item() / value.abs().max().item()
            print(f"{name} {key}: max |diff| / max |logit| = {err:.2e}")
            worst = max(worst, err)
    # The stored logits are the float64 values rounded to float32: 2^-24 relative, so 1e-6 of the largest.
    if worst > 1e-6:
        sys.exit(f"make_checkpoint_fixtures --check: stored logits differ from the reference by {worst:.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="where the fixtures are (or go)")
    parser.add_argument("--check", action="store_true", help="recompute the stored logits and compare")
    args = parser.parse_args()
    if args.check:
        check(args.dir)
        return
    for seed, (name, spec) in enumerate(FIXTURES.items()):
        write_fixture(args.dir, name, spec, 1000 + seed)
        print(f"wrote {os.path.join(args.dir, name)}")


if __name__ == "__main__":
    main()
