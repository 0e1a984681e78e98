#!/usr/bin/env python3
"""Writes the byte-level BPE fixtures of tests/lab/test_tokenizers.cpp into tests/data/hf_tokenizers/ (standard
library only; rerun after changing it: python3 tests/hf/make_tokenizer_fixtures.py).

Both fixtures have the 256 GPT-2 byte characters as tokens 0..255 (token b is byte b, so the ids of unmerged text
are its UTF-8 bytes and the expected ids in the test can be worked out by hand), a handful of merges, one vocabulary
entry no merge reaches ("Ġhello", for ignore_merges), unreachable fillers <unused0>..<unused31> at 268..299 and
special tokens at 300 and 301.
  llama3_style: Split with Llama 3's regex + ByteLevel(use_regex false), ignore_merges, merges as pairs,
                TemplateProcessing with <|begin_of_text|>, as Meta-Llama-3's tokenizer.json.
  gpt2_style:   ByteLevel(use_regex true), merges as "a b" strings, <|endoftext|>, as GPT-2's.
"""
import json
import os

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_chars():
    """GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest for U+0100 onwards."""
    printable = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = 0
    table = {}
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# rank order; ids 256.. in the same order. "t h" comes last so that "h e" wins in "the".
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("in", "g"), ("Ġ", "Ġ"), ("1", "2"), ("12", "3"),
          ("'", "s"), ("Ċ", "Ċ"), ("t", "h")]


def vocab():
    v = {c: b for b, c in byte_chars().items()}
    merged = [a + b for a, b in MERGES]
    for i, token in enumerate(merged[:10]):
        v[token] = 256 + i
    v["Ġhello"] = 266  # reachable only whole (ignore_merges)
    v[merged[10]] = 267
    # Fillers up to the special tokens at 300: Hugging Face's tokenizers numbers added tokens from the vocabulary's
    # size on whatever ids the file gives them, so a gap would give them other ids there (tokenizer_json.cpp
    # refuses such a file). No merge makes these, and no pre-token is one.
    for i in range(268, 300):
        v[f"<unused{i - 268}>"] = i
    return v


def special(id_, content, normalized):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": True}


def llama3_style():
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(300, "<|begin_of_text|>", False), special(301, "<|end_of_text|>", False)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [300],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab(), "merges": [list(m) for m in MERGES]},
    }


def gpt2_style():
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(300, "<|endoftext|>", True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "vocab": vocab(),
                  "merges": [a + " " + b for a, b in MERGES]},
    }


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf_tokenizers")
    for name, content, config in [
            ("llama3_style", llama3_style(), {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
            ("gpt2_style", gpt2_style(), {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                          "add_bos_token": False})]:
        os.makedirs(os.path.join(root, name), exist_ok=True)
        with open(os.path.join(root, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(content, f, ensure_ascii=False, indent=1)
            f.write("\n")
        with open(os.path.join(root, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
