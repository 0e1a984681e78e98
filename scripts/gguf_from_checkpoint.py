#!/usr/bin/env python3
"""Writes a GGUF file (llama.cpp's model format) from a Hugging Face model directory of type llama or qwen2, so that
llama.cpp and rotary's engine can be timed and compared on the very same weights (docs/checkpoints.md; the comparison
itself: scripts/llama_cpp_side_by_side.sh). Our own code: the safetensors shards are parsed here with numpy (bf16
kept as its 16-bit patterns, never widened), and llama.cpp's Python package `gguf` (gguf-py, from a llama.cpp
source tree) is imported at run time from the path given with --gguf-py, only to write the file (and to quantize to
q8_0). Nothing of llama.cpp is part of this repository.

What is written: general.architecture `qwen2` or `llama` with the config.json hyperparameters (context, width, MLP
width, layers, heads, kv heads, head dim, rope base, RMSNorm eps; llama: vocab size and rope dimension count),
every tensor under llama.cpp's name (token_embd, blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output /
ffn_norm / ffn_gate / ffn_up / ffn_down, output_norm, output unless the head is tied), matrices in --outtype
(bf16: the stored bf16 bits copied, or f32/f16 rounded to bf16; f32; q8_0: blocks of 32 int8 with an f16 scale,
gguf-py's quantizer), 1-D tensors (norms, biases) always f32. For llama, q_proj and k_proj rows (and biases) are
reordered per head from Hugging Face's rotate-half layout to ggml's interleaved-pair rope (llama.cpp's converter
does the same); qwen2 runs ggml's NEOX rope and is written unchanged. rope_scaling: linear and yarn as
rope.scaling.* keys, llama3 as llama.cpp's rope_freqs tensor (the per-pair frequency divisors, float32); others are
refused.

The tokenizer is the directory's tokenizer.json, copied into GGUF as tokenizer.ggml.model "gpt2" (byte-level BPE:
tokens, token types, merges, BOS/EOS from tokenizer_config.json, tokenizer.ggml.pre from the file's split regex:
llama-bpe for Llama 3's, qwen2 for Qwen2's, gpt-2 for ByteLevel's own), and tokenizer_config.json's chat_template
as tokenizer.chat_template. A directory with no tokenizer (random weights from
scripts/make_random_checkpoint.py) gets one with --add-byte-tokenizer: a byte-level BPE tokenizer.json whose first
256 ids are the 256 bytes (GPT-2's byte-to-character map), then a few merges' results (" t", "he", " the", ...),
then filler tokens "[<id>]" up to vocab_size - 2, and "<|endoftext|>" (EOS, special) as the last id, plus a
tokenizer_config.json (no BOS added). Both runtimes then turn a prompt into the same ids, and a generated filler
token prints as its own id, so generated texts can be compared directly.

    /usr/bin/python3 scripts/gguf_from_checkpoint.py /tmp/q05 --gguf-py /tmp/llamacpp/src/gguf-py \
        --add-byte-tokenizer --outtype bf16 --out /tmp/q05/model-bf16.gguf
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

BYTE_LEVEL_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("Ġ", "a"), ("o", "n"),
                     ("r", "e"), ("Ġ", "s"), ("a", "t"), ("e", "n"), ("o", "r")]
EOS_TEXT = "<|endoftext|>"
# The split regexes of the pre-tokenizers llama.cpp names (tokenizer.ggml.pre), as the models' tokenizer.json has them.
PRE_TOKENIZER_REGEX = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def pre_tokenizer_name(pre):
    """tokenizer.ggml.pre for a tokenizer.json pre_tokenizer: the name of its split regex, or gpt-2 for ByteLevel's."""
    steps = pre.get("pretokenizers", [pre]) if pre else []
    for step in steps:
        regex = (step.get("pattern") or {}).get("Regex") if step.get("type") == "Split" else None
        if regex is not None:
            for name, known in PRE_TOKENIZER_REGEX.items():
                if regex == known:
                    return name
            sys.exit(f"tokenizer.json: split regex {regex!r} is not one of llama.cpp's named pre-tokenizers here "
                     f"({', '.join(PRE_TOKENIZER_REGEX)}, gpt-2)")
    return "gpt-2"


def llama3_rope_factors(cfg, head_dim):
    """llama.cpp's rope_freqs for rope_type llama3: each pair's frequency divisor (float32)."""
    rs = cfg["rope_scaling"]
    base = float(cfg.get("rope_theta", 10000.0))
    factor, low, high = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * base ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def bytes_to_unicode():
    """GPT-2's map from each byte to a printable character (the symbols byte-level BPE works on)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_byte_tokenizer(model_dir, vocab_size):
    """tokenizer.json + tokenizer_config.json in Hugging Face's format (see the module docstring)."""
    symbols = bytes_to_unicode()
    tokens = [symbols[b] for b in range(256)]
    tokens += [a + b for a, b in BYTE_LEVEL_MERGES]
    if vocab_size < len(tokens) + 1:
        sys.exit(f"vocab_size {vocab_size} is too small for a byte tokenizer ({len(tokens) + 1} tokens at least)")
    tokens += [f"[{i}]" for i in range(len(tokens), vocab_size - 1)]
    tokens.append(EOS_TEXT)
    assert len(set(tokens)) == len(tokens) == vocab_size
    eos = vocab_size - 1
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": eos, "content": EOS_TEXT, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [f"{a} {b}" for a, b in BYTE_LEVEL_MERGES]},
    }
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": None, "eos_token": EOS_TEXT,
              "model_max_length": 1 << 20, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(model_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    print(f"wrote {model_dir}/tokenizer.json ({vocab_size} tokens, {len(BYTE_LEVEL_MERGES)} merges, EOS {eos}) "
          f"and tokenizer_config.json")


def read_tokenizer(model_dir, vocab_size):
    """(tokens, token types, merges, bos id, eos id, add_bos) of a byte-level BPE tokenizer.json, padded to
    vocab_size with unused "[PAD<id>]" tokens as llama.cpp's converter does."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        sys.exit(f"tokenizer.json: model type {model.get('type')!r}; only byte-level BPE is written to GGUF")
    pre = json.dumps(tok.get("pre_tokenizer"))
    if "ByteLevel" not in pre:
        sys.exit("tokenizer.json: no ByteLevel pre-tokenizer; only byte-level BPE is written to GGUF")
    id_to_tok = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        id_to_tok[i] = a["content"]
    n = max(vocab_size, max(id_to_tok) + 1)
    tokens, types = [], []
    for i in range(n):
        if i not in id_to_tok:
            tokens.append(f"[PAD{i}]")
            types.append(5)  # UNUSED
        elif i in added:
            tokens.append(id_to_tok[i])
            types.append(3 if added[i].get("special") else 4)  # CONTROL / USER_DEFINED
        else:
            tokens.append(id_to_tok[i])
            types.append(1)  # NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg = {}
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)

    def token_id(key):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is None:
            return None
        return tokens.index(v)

    add_bos = cfg.get("add_bos_token")
    if add_bos is None:  # a TemplateProcessing post-processor that puts a special token first (Llama 3)
        single = (tok.get("post_processor") or {}).get("single") or []
        add_bos = bool(single) and "SpecialToken" in single[0]
    return (tokens, types, merges, token_id("bos_token"), token_id("eos_token"), bool(add_bos),
            pre_tokenizer_name(tok.get("pre_tokenizer")), cfg.get("chat_template"))


class Safetensors:
    """The tensors of a model directory's safetensors files (one file, or shards with an index), memory-mapped."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.where = {}
        for name in files:
            path = os.path.join(model_dir, name)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode="r")
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                self.where[key] = (data, 8 + n + begin, 8 + n + end, info["dtype"], tuple(info["shape"]))

    def names(self):
        return list(self.where)

    def dtype(self, name):
        return self.where[name][3]

    def shape(self, name):
        return self.where[name][4]

    def raw(self, name):
        """The stored values: bf16 as uint16 bit patterns, f16 / f32 as themselves."""
        data, begin, end, dtype, shape = self.where[name]
        np_dtype = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}.get(dtype)
        if np_dtype is None:
            sys.exit(f"{name}: dtype {dtype} not supported (BF16, F16, F32)")
        return data[begin:end].view(np_dtype).reshape(shape)


def to_f32(x):
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def to_bf16_bits(x):
    """bf16 bit patterns (uint16): stored bf16 as it is, anything else rounded to nearest even."""
    if x.dtype == np.uint16:
        return x
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((n.astype(np.uint64) + 0x7FFF + ((n >> 16) & 1)) >> 16).astype(np.uint16)


def unpermute_rope_rows(w, n_head):
    """Hugging Face llama q/k rows (per head: all first halves, then all second halves, for rotate-half) to ggml's
    order (per head: the pairs (i, i + d/2) adjacent), as llama.cpp's converter does."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_plan(cfg, st):
    """(gguf name, hf name, permute heads or None) of every tensor, in llama.cpp's order."""
    arch = cfg["model_type"]
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    plan = [("token_embd.weight", "model.embed_tokens.weight", None)]
    have = set(st.names())
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        plan.append((b + "attn_norm.weight", p + "input_layernorm.weight", None))
        for proj, ggml, heads in (("q_proj", "attn_q", n_head), ("k_proj", "attn_k", n_kv), ("v_proj", "attn_v", None)):
            perm = heads if arch == "llama" and heads is not None else None
            plan.append((f"{b}{ggml}.weight", f"{p}self_attn.{proj}.weight", perm))
            if f"{p}self_attn.{proj}.bias" in have:
                plan.append((f"{b}{ggml}.bias", f"{p}self_attn.{proj}.bias", perm))
        plan.append((b + "attn_output.weight", p + "self_attn.o_proj.weight", None))
        if p + "self_attn.o_proj.bias" in have:
            plan.append((b + "attn_output.bias", p + "self_attn.o_proj.bias", None))
        plan.append((b + "ffn_norm.weight", p + "post_attention_layernorm.weight", None))
        for proj, ggml in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
            plan.append((f"{b}{ggml}.weight", f"{p}mlp.{proj}.weight", None))
            if f"{p}mlp.{proj}.bias" in have:
                plan.append((f"{b}{ggml}.bias", f"{p}mlp.{proj}.bias", None))
    plan.append(("output_norm.weight", "model.norm.weight", None))
    if not cfg.get("tie_word_embeddings", False):
        plan.append(("output.weight", "lm_head.weight", None))
    used = {hf for _, hf, _ in plan}
    missing = sorted(used - have)
    unused = sorted(n for n in have - used if not n.endswith("rotary_emb.inv_freq"))
    if missing:
        sys.exit(f"tensors missing from the checkpoint: {missing[:5]}")
    if unused:
        sys.exit(f"tensors this converter does not place (another architecture?): {unused[:5]}")
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--out", required=True, help="the .gguf file to write")
    ap.add_argument("--outtype", choices=["bf16", "f32", "q8_0"], default="bf16")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory (imported from there)")
    ap.add_argument("--add-byte-tokenizer", action="store_true",
                    help="write a byte-level tokenizer.json into model_dir first if it has no tokenizer")
    args = ap.parse_args()

    sys.path.insert(0, os.path.abspath(args.gguf_py))
    import gguf  # noqa: E402  (llama.cpp's package, from the path the user gave)
    from gguf.quants import quantize, quant_shape_to_byte_shape  # noqa: E402

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg.get("model_type")
    if arch not in ("llama", "qwen2"):
        sys.exit(f"config.json: model_type {arch!r}; only llama and qwen2 are converted")
    scaling = cfg.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if scaling and rope_type not in ("linear", "yarn", "llama3"):
        sys.exit(f"config.json: rope_scaling {scaling} is not converted (none, linear, yarn, llama3)")
    if cfg.get("hidden_act", "silu") != "silu":
        sys.exit(f"config.json: hidden_act {cfg['hidden_act']!r}; llama/qwen2 use silu")
    if arch == "qwen2" and cfg.get("use_sliding_window"):
        sys.exit("config.json: use_sliding_window is true; not converted")
    vocab_size = cfg["vocab_size"]
    has_tokenizer = any(os.path.exists(os.path.join(args.model_dir, n)) for n in ("tokenizer.json", "tokenizer.model"))
    if not has_tokenizer:
        if not args.add_byte_tokenizer:
            sys.exit(f"{args.model_dir} has no tokenizer.json; --add-byte-tokenizer writes a byte-level one")
        write_byte_tokenizer(args.model_dir, vocab_size)
    elif not os.path.exists(os.path.join(args.model_dir, "tokenizer.json")):
        sys.exit("only tokenizer.json (byte-level BPE) is written to GGUF; this directory has tokenizer.model only")
    tokens, types, merges, bos, eos, add_bos, pre, chat_template = read_tokenizer(args.model_dir, vocab_size)

    st = Safetensors(args.model_dir)
    plan = tensor_plan(cfg, st)
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head

    qtype = {"bf16": gguf.GGMLQuantizationType.BF16, "f32": gguf.GGMLQuantizationType.F32,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[args.outtype]
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f32": gguf.LlamaFileType.ALL_F32,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[args.outtype]

    w = gguf.GGUFWriter(args.out, arch)
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    if head_dim != cfg["hidden_size"] // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    if arch == "llama":
        w.add_vocab_size(vocab_size)
        w.add_rope_dimension_count(head_dim)
    if rope_type in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if rope_type == "linear" else gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(scaling["factor"]))
        if rope_type == "yarn":
            w.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    w.add_file_type(ftype)
    if args.outtype == "q8_0":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    if isinstance(chat_template, str):
        w.add_chat_template(chat_template)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if not merges:  # llama.cpp requires the key and gguf-py writes no empty array
        sys.exit("tokenizer.json has no merges; llama.cpp needs at least one")
    w.add_token_merges(merges)
    if eos is not None:
        w.add_eos_token_id(eos)
    if bos is not None:
        w.add_bos_token_id(bos)
    elif eos is not None:
        w.add_bos_token_id(eos)  # llama.cpp would otherwise default to id 11; never added (add_bos false)
    w.add_add_bos_token(add_bos)

    # Pass 1: every tensor's type and size (the data is then written one tensor at a time, so that only one
    # converted tensor is in memory at once).
    def out_type(hf):
        return qtype if len(st.shape(hf)) == 2 else gguf.GGMLQuantizationType.F32

    rope_freqs = llama3_rope_factors(cfg, head_dim) if rope_type == "llama3" else None
    if rope_freqs is not None:
        w.add_tensor_info("rope_freqs.weight", rope_freqs.shape, np.dtype(np.float32), rope_freqs.nbytes)
    for name, hf, _ in plan:
        shape = st.shape(hf)
        t = out_type(hf)
        if t == gguf.GGMLQuantizationType.Q8_0:
            byte_shape = quant_shape_to_byte_shape(shape, t)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=t)
        elif t == gguf.GGMLQuantizationType.BF16:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), int(np.prod(shape)) * 2, raw_dtype=t)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if rope_freqs is not None:
        w.write_tensor_data(rope_freqs)
    for k, (name, hf, heads) in enumerate(plan):
        x = st.raw(hf)
        if heads is not None:
            x = unpermute_rope_rows(x, heads)
        t = out_type(hf)
        if t == gguf.GGMLQuantizationType.Q8_0:
            data = quantize(to_f32(x), t)
        elif t == gguf.GGMLQuantizationType.BF16:
            data = np.ascontiguousarray(to_bf16_bits(x))
        else:
            data = np.ascontiguousarray(to_f32(x))
        w.write_tensor_data(data)
        if sys.stdout.isatty():
            print(f"\r[{k + 1}/{len(plan)}] {name} {t.name} {list(st.shape(hf))}" + " " * 10, end="", flush=True)
    if sys.stdout.isatty():
        print()
    w.close()
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e9:.3f} GB, {args.outtype}, arch {arch}, "
          f"{len(tokens)} tokens, {len(merges)} merges)")


if __name__ == "__main__":
    main()
