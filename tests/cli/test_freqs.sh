#!/bin/bash
# runs without libtorch
# `rotary freqs` against Hugging Face: for every config in tests/data/hf_configs and several sequence lengths,
# `rotary freqs --hf-config` must agree with tests/hf/hf_rope_reference.py (a transcription of transformers'
# RoPE functions, run with /usr/bin/python3 + torch) to 1e-5 relative on inv_freq and attention_factor
# (HF computes inv_freq in float32, we in float64: the expected gap is ~1e-6, see the oracle's docstring).
# Then the spec flags must give the same frequencies as the configs they spell out, and bad flags / bad files
# must exit 2 with a message naming the field.
#
# usage: bash test_freqs.sh <rotary binary> <source dir> [--table]   (--table: print the markdown table of
# docs/rope-scaling.md). Exits non-zero on any failure, including a missing or silent oracle.
set -u
ROTARY=${1:?usage: test_freqs.sh <rotary binary> <source dir> [--table]}
SRC=${2:?usage: test_freqs.sh <rotary binary> <source dir> [--table]}
TABLE=${3:-}
PY=/usr/bin/python3
ORACLE="$SRC/tests/hf/hf_rope_reference.py"
fails=0

[ -x "$ROTARY" ] || { echo "FAIL: no rotary binary at $ROTARY"; exit 1; }
[ -f "$ORACLE" ] || { echo "FAIL: the oracle $ORACLE is missing"; exit 1; }
"$PY" -c "import torch" || { echo "FAIL: $PY cannot import torch (the oracle needs it)"; exit 1; }

# --- 1. agreement with the oracle, and flags == config --------------------------------------------------------
"$PY" - "$ROTARY" "$SRC" "$ORACLE" "$TABLE" <<'PYEOF' || fails=$((fails + 1))
import glob, json, os, subprocess, sys

rotary, src, oracle, table = sys.argv[1:5]
TOL = 1e-5
failures = []
rows = []

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)

_cache = {}
def ours(args):
    key = tuple(args)
    if key not in _cache:
        _cache[key] = _run_ours(args)
    return _cache[key]

def _run_ours(args):
    p = subprocess.run([rotary, "freqs", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"rotary freqs {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)

configs = sorted(glob.glob(os.path.join(src, "tests/data/hf_configs/*.json")))
if len(configs) < 13:
    failures.append(f"expected >= 13 configs in tests/data/hf_configs, found {len(configs)}")
for path in configs:
    name = os.path.basename(path)
    cfg = json.load(open(path))
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    m = cfg.get("max_position_embeddings") or 4096
    o = cfg.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings") or m
    # Around both context lengths (dynamic switches at max_position_embeddings, longrope at the original one).
    seq_lens = sorted({0, 1, o - 1, o, o + 1, m, m + 1, 3 * m + 7, 1_000_003})
    p = subprocess.run([sys.executable, oracle, path, "--seq-len", *map(str, seq_lens)],
                       capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    if p.returncode != 0 or len(lines) != len(seq_lens):
        failures.append(f"{name}: oracle exited {p.returncode} with {len(lines)} lines "
                        f"(want {len(seq_lens)}): {p.stderr.strip()[-300:]}")
        continue
    first = {}
    ref_type = json.loads(lines[0])["rope_type"]
    for seq_len, line in zip(seq_lens, lines):
        ref = json.loads(line)
        # Only dynamic and longrope depend on the length; for the others two lengths suffice (each call of the
        # binary loads libtorch, ~0.5 s) and the unit tests check they ignore it.
        if ref_type not in ("dynamic", "longrope") and seq_len not in (0, 1_000_003):
            continue
        try:
            got = ours(["--hf-config", path, "--seq-len", str(seq_len)])
        except RuntimeError as e:
            failures.append(f"{name}: {e}")
            continue
        inv, ref_inv = got["inv_freq"], ref["inv_freq"]
        if not ref_inv or len(inv) != len(ref_inv) or got["rotary_dim"] != ref["rotary_dim"]:
            failures.append(f"{name} seq_len {seq_len}: rotary_dim {got['rotary_dim']} / {len(inv)} pairs, "
                            f"oracle {ref['rotary_dim']} / {len(ref_inv)} pairs")
            continue
        d_inv = max(rel(a, b) for a, b in zip(inv, ref_inv))
        d_att = rel(got["attention_factor"], ref["attention_factor"])
        rows.append((name, seq_len, ref["rope_type"], len(inv), d_inv, d_att))
        if not (d_inv <= TOL and d_att <= TOL):
            failures.append(f"{name} seq_len {seq_len}: max rel diff inv_freq {d_inv:.3g}, "
                            f"attention_factor {d_att:.3g} (tolerance {TOL})")
        first.setdefault("ref", ref_inv)
        if ref_inv != first["ref"]:
            first["changed"] = True
    # The probes must matter where the type depends on the length (else a seq_len ignored would pass).
    if ref_type in ("dynamic", "longrope") and not first.get("changed"):
        failures.append(f"{name}: {ref_type} frequencies do not change over seq_len {seq_lens}")

# The spec flags spell out the same rotations as the configs.
def flags_match(config, flags, seq_len):
    a = ours(["--hf-config", os.path.join(src, "tests/data/hf_configs", config), "--seq-len", str(seq_len)])
    b = ours(flags + ["--seq-len", str(seq_len)])
    if a["inv_freq"] != b["inv_freq"] or a["attention_factor"] != b["attention_factor"]:
        failures.append(f"flags {' '.join(flags[:8])} ... differ from {config} at seq_len {seq_len}")
phi = json.load(open(os.path.join(src, "tests/data/hf_configs/phi-3-mini-128k-instruct.json")))["rope_scaling"]
cases = [
    ("llama-3.1-8b.json", "--head-dim 128 --base 500000 --scaling llama3 --factor 8 --low-freq-factor 1 "
     "--high-freq-factor 4 --original-max-position-embeddings 8192 --max-position-embeddings 131072", [0]),
    ("qwen2.5-7b-instruct-yarn.json", "--head-dim 128 --base 1000000 --scaling yarn --factor 4 "
     "--original-max-position-embeddings 32768 --max-position-embeddings 32768", [0]),
    ("deepseek-v2-lite.json", "--head-dim 64 --scaling yarn --factor 40 --mscale 0.707 --mscale-all-dim 0.707 "
     "--beta-fast 32 --beta-slow 1 --original-max-position-embeddings 4096 --max-position-embeddings 163840", [0]),
    ("gpt-oss-20b.json", "--head-dim 64 --base 150000 --scaling yarn --factor 32 --no-truncate "
     "--original-max-position-embeddings 4096 --max-position-embeddings 131072", [0]),
    ("vicuna-7b-v1.5-16k.json", "--head-dim 128 --scaling linear --factor 4", [0]),
    ("internlm2_5-7b-chat-dynamic.json", "--head-dim 128 --base 1000000 --scaling dynamic --factor 2 "
     "--max-position-embeddings 32768", [0, 40000]),
    ("pythia-70m.json", "--head-dim 64 --partial-rotary-factor 0.25", [0]),
    ("gpt-neox-20b.json", "--head-dim 96 --rotary-dim 24", [0]),
    ("phi-3-mini-128k-instruct.json", "--head-dim 96 --scaling longrope --max-position-embeddings 131072 "
     "--original-max-position-embeddings 4096 --short-factor " + ",".join(map(repr, phi["short_factor"])) +
     " --long-factor " + ",".join(map(repr, phi["long_factor"])), [0, 4097]),
]
for config, flags, lens in cases:
    for n in lens:
        try:
            flags_match(config, flags.split(), n)
        except RuntimeError as e:
            failures.append(str(e))

if table == "--table":
    print("| config | seq_len | rope_type | pairs | max rel diff inv_freq | rel diff attention_factor |")
    print("|---|---:|---|---:|---:|---:|")
    for name, seq_len, t, pairs, d_inv, d_att in rows:
        print(f"| {name} | {seq_len} | {t} | {pairs} | {d_inv:.2e} | {d_att:.2e} |")
worst = max((r[4] for r in rows), default=float("nan"))
print(f"oracle agreement: {len(rows)} cases over {len(configs)} configs, worst inv_freq rel diff {worst:.3g}")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures or not rows else 0)
PYEOF

# --- 2. bad flags and bad files: exit 2, the message names the field -------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '{"head_dim": 64,' > "$tmp/malformed.json"
printf '{"hidden_size": 4096, "num_attention_heads": 33}' > "$tmp/heads.json"
printf '{"head_dim": 64, "rope_theta": 10000, "rotary_emb_base": 20000}' > "$tmp/contradictory.json"
printf '{"head_dim": 8, "max_position_embeddings": 8192, "rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1], "long_factor": [2, 2, 2, 2]}}' > "$tmp/lists.json"
printf '{"head_dim": 64, "rope_scaling": {"rope_type": "ntk-by-parts"}}' > "$tmp/type.json"

expect_error() {  # expect_error <field> <args...>: exit status 2 and "error: ... <field> ..." on stderr
  local field=$1; shift
  local err rc
  err=$("$ROTARY" freqs "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 2 ] || ! grep -q "^error: " <<<"$err" || ! grep -qF -- "$field" <<<"$err"; then
    echo "FAIL: rotary freqs $* -> exit $rc, stderr: $err (want exit 2 naming '$field')"
    fails=$((fails + 1))
  fi
}
expect_error head_dim --head-dim 7
expect_error head_dim --head-dim 1
expect_error --head-dim --scaling linear --factor 4
expect_error rotary_dim --head-dim 64 --rotary-dim 7
expect_error partial-rotary-factor --head-dim 64 --partial-rotary-factor 0.3
expect_error partial-rotary-factor --head-dim 64 --rotary-dim 16 --partial-rotary-factor 0.25
expect_error base --head-dim 64 --base -1
expect_error scaling --head-dim 64 --scaling warp
expect_error layout --head-dim 64 --layout diagonal
expect_error factor --head-dim 64 --scaling linear --factor 0
expect_error max_position_embeddings --head-dim 64 --scaling dynamic --factor 2
expect_error original_max_position_embeddings --head-dim 64 --scaling yarn --factor 4
expect_error beta_fast --head-dim 64 --scaling yarn --factor 4 --original-max-position-embeddings 4096 --beta-fast 0.5
expect_error high_freq_factor --head-dim 64 --scaling llama3 --factor 8 --original-max-position-embeddings 8192 --low-freq-factor 4 --high-freq-factor 2
expect_error short_factor --head-dim 8 --scaling longrope --original-max-position-embeddings 4096 --short-factor 1,1 --long-factor 1,1,1,1
expect_error freq_factors --head-dim 8 --scaling explicit --freq-factors 1,2,3
expect_error "--seq-len: value -1" --head-dim 64 --seq-len -1
expect_error hf_config --hf-config "$tmp/does-not-exist.json"
expect_error config.json --hf-config "$tmp/malformed.json"
expect_error hidden_size --hf-config "$tmp/heads.json"
expect_error rotary_emb_base --hf-config "$tmp/contradictory.json"
expect_error rope_scaling.short_factor --hf-config "$tmp/lists.json"
expect_error rope_scaling.rope_type --hf-config "$tmp/type.json"
expect_error --head-dim --hf-config "$SRC/tests/data/hf_configs/llama-2-7b-hf.json" --head-dim 64

# CLI11 refuses unknown flags (its own exit status, not 0).
err=$("$ROTARY" freqs --head-dim 64 --frobnicate 2>&1 >/dev/null); rc=$?
if [ "$rc" -eq 0 ] || ! grep -q -- "--frobnicate" <<<"$err"; then
  echo "FAIL: an unknown flag was accepted (exit $rc): $err"; fails=$((fails + 1))
fi

# A good call prints the spec and what it yields.
out=$("$ROTARY" freqs --head-dim 64 --scaling linear --factor 4 --layout interleaved) || { echo "FAIL: good call failed"; fails=$((fails + 1)); }
"$PY" - "$out" <<'PYEOF' || { echo "FAIL: good call printed the wrong JSON"; fails=$((fails + 1)); }
import json, sys
d = json.loads(sys.argv[1])
assert d["spec"]["scaling"] == "linear" and d["spec"]["layout"] == "interleaved", d["spec"]
assert d["spec"]["describe"].startswith("rope(d=64, r=64, base=10000, interleaved, linear(factor=4)"), d["spec"]
assert d["rotary_dim"] == 64 and len(d["inv_freq"]) == 32 and d["inv_freq"][0] == 0.25, d
assert d["attention_factor"] == 1.0 and d["seq_len"] == 0
PYEOF

if [ "$fails" -ne 0 ]; then echo "test_freqs: $fails failure(s)"; exit 1; fi
echo "test_freqs: all passed"
