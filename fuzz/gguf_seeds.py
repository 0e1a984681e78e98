#!/usr/bin/env python3
"""Writes the GGUF fuzz target's seeds (fuzz/corpus/gguf/): small files in the format, spelled out here with struct
(no gguf-py, no numpy), so that the fuzzer starts from inputs that reach every part of the reader - every metadata
value type, a nested array, the tokenizer's arrays, tensors of plain and block-quantized types, a non-default
alignment. tests/core/test_gguf.cpp (FuzzSeedsStillRead) checks that rotary still reads them.

    python3 fuzz/gguf_seeds.py fuzz/corpus/gguf
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
       I64: "<q", F64: "<d"}
# ggml type: (id, block size, bytes per block)
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
         "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def body(t, v):
    """A value of type t without its type tag."""
    if t == STRING:
        return gstr(v)
    if t == ARRAY:
        elem, items = v
        return struct.pack("<IQ", elem, len(items)) + b"".join(body(elem, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors, version=3, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gstr(key) + struct.pack("<I", t) + body(t, v)
    data, offsets = b"", []
    for name, dims, type_name in tensors:
        tid, block, size = TYPES[type_name]
        data += b"\0" * (-len(data) % alignment)
        n = 1
        for d in dims:
            n *= d
        offsets.append(len(data))
        data += bytes((i * 37 + len(name)) & 0xFF for i in range(n // block * size))
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", tid, offsets[-1])
    out += b"\0" * (-len(out) % alignment)
    return out + data


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tokens = ["<unk>", "<s>", "</s>", "\u0120t", "he", "\u0120the"]
    llama = gguf(
        [("general.architecture", STRING, "llama"), ("general.name", STRING, "seed"),
         ("llama.context_length", U32, 2048), ("llama.embedding_length", U32, 64), ("llama.block_count", U32, 1),
         ("llama.attention.head_count", U32, 4), ("llama.attention.head_count_kv", U32, 2),
         ("llama.rope.freq_base", F32, 10000.0), ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
         ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "llama-bpe"),
         ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
         ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, -1.0, -2.0, -3.0, -4.0, -5.0])),
         ("tokenizer.ggml.token_type", ARRAY, (I32, [2, 3, 3, 1, 1, 1])),
         ("tokenizer.ggml.merges", ARRAY, (STRING, ["\u0120 t", "h e"])),
         ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.add_bos_token", BOOL, 1)],
        [("token_embd.weight", [64, 6], "Q8_0"), ("blk.0.attn_norm.weight", [64], "F32"),
         ("blk.0.attn_q.weight", [64, 8], "Q4_0"), ("blk.0.ffn_up.weight", [256, 2], "Q4_K"),
         ("blk.0.ffn_down.weight", [256, 1], "Q6_K"), ("output_norm.weight", [64], "F16")])
    every = gguf(
        [("u8", U8, 255), ("i8", I8, -128), ("u16", U16, 65535), ("i16", I16, -32768), ("u32", U32, 2**32 - 1),
         ("i32", I32, -2**31), ("u64", U64, 2**64 - 1), ("i64", I64, -2**63), ("f32", F32, 0.5), ("f64", F64, 0.1),
         ("bool", BOOL, 1), ("str", STRING, "text"), ("general.alignment", U32, 64),
         ("nested", ARRAY, (ARRAY, [(I32, [1, 2]), (STRING, ["x"]), (ARRAY, [(U8, [7])])])),
         ("bools", ARRAY, (BOOL, [0, 1])), ("f64s", ARRAY, (F64, [1.0, -2.0]))],
        [("a", [4, 2, 1, 3], "F32"), ("b", [3], "BF16")], version=2, alignment=64)
    for name, data in (("llama_q8_0_q4_0_q4_k.gguf", llama), ("every_value_type_v2_align64.gguf", every)):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "gguf"))
