#!/usr/bin/env python3
"""Oracle for `rotary freqs`: Hugging Face transformers' RoPE parameter functions, transcribed.

The functions below are a transcription of transformers 5's src/transformers/modeling_rope_utils.py
(_compute_linear_scaling_rope_parameters, _compute_dynamic_ntk_parameters, _compute_yarn_parameters,
_compute_longrope_parameters, _compute_llama3_parameters; the default one now lives in each model's
RotaryEmbedding.compute_default_rope_parameters, same formula) and of what the config classes do before
they run: RotaryEmbeddingConfigMixin.convert_rope_params_to_dict / standardize_rope_params, GPTNeoXConfig
(rotary_pct, rotary_emb_base), Phi3Config (old "su" / "yarn" names for longrope), DeepseekV3Config
(head_dim = qk_rope_head_dim) and the configs that turn a null head_dim into hidden_size // heads.
It is written apart from the C++ code and shares nothing with it.

HF's float32 arithmetic is kept where HF uses it (torch tensors in float32: the exponent arange/dim, base**e,
the yarn ramp, llama3's wavelengths); scalars (bases, factors, attention factors) are Python floats (float64),
as in HF. Our C++ computes everything in float64, so inv_freq agrees to float32 rounding: a few ulp of float32
on base**e with e <= 1, i.e. <= ~1e-6 relative (ln(base) * 2^-24 for the rounded exponent plus the pow's own
rounding); the attention factor is computed in float64 by both and agrees to ~1e-15.

Usage: /usr/bin/python3 hf_rope_reference.py CONFIG.json [--seq-len N ...]
Prints one JSON object per line and seq_len:
  {"seq_len": N, "rope_type": "...", "rotary_dim": r, "inv_freq": [...], "attention_factor": x}
seq_len 0 means "not given" (transformers' seq_len=None: initialisation, short factors for longrope).
"""
import argparse
import json
import math
import sys

import torch


class Config:
    """What a transformers config object holds after __init__: every key of config.json as an attribute."""

    default_theta = 10_000.0

    def __init__(self, d):
        for k, v in d.items():
            setattr(self, k, v)


def build_config(raw):
    # Multimodal configs: the language model's own config (get_text_config).
    flat = any(k in raw for k in ("num_attention_heads", "head_dim", "hidden_size", "rope_scaling", "rope_theta"))
    if not flat and isinstance(raw.get("text_config"), dict):
        raw = raw["text_config"]
    config = Config(raw)
    model_type = raw.get("model_type")
    # GPTNeoXConfig: rotary_pct -> partial_rotary_factor, rotary_emb_base -> rope_theta.
    if "rotary_pct" in raw and raw["rotary_pct"] is not None:
        config.partial_rotary_factor = raw["rotary_pct"]
    if "rotary_emb_base" in raw and raw["rotary_emb_base"] is not None:
        config.rope_theta = raw["rotary_emb_base"]
    # DeepseekV2/V3Config: the rotary embedding covers qk_rope_head_dim features.
    if raw.get("qk_rope_head_dim") is not None:
        config.head_dim = raw["qk_rope_head_dim"]
    # Llama/Mistral/... configs: head_dim = head_dim if head_dim is not None else hidden_size // heads.
    if getattr(config, "head_dim", None) is None:
        config.head_dim = config.hidden_size // config.num_attention_heads
    if getattr(config, "rope_scaling", None) is not None:
        config.rope_scaling = dict(config.rope_scaling)
        rs_type = config.rope_scaling.get("type")
        # Phi3Config._rope_scaling_adjustment: "su" and "yarn" were the old names of longrope.
        if rs_type == "su" or (model_type == "phi3" and rs_type == "yarn"):
            config.rope_scaling["type"] = "longrope"
    convert_rope_params_to_dict(config)
    return config


def convert_rope_params_to_dict(self):
    """RotaryEmbeddingConfigMixin.convert_rope_params_to_dict + standardize_rope_params (one global dict)."""
    rope_scaling = getattr(self, "rope_scaling", None)
    rope_parameters = getattr(self, "rope_parameters", None)
    self.rope_parameters = dict(rope_scaling or rope_parameters or {})
    self.rope_parameters.setdefault("rope_theta", getattr(self, "rope_theta", self.default_theta))
    partial_rotary_factor = getattr(self, "partial_rotary_factor", None)
    if partial_rotary_factor is not None:
        self.rope_parameters.setdefault("partial_rotary_factor", partial_rotary_factor)
    # standardize_rope_params
    rp = self.rope_parameters
    rp.setdefault("rope_type", rp.get("type", "default"))
    if partial_rotary_factor is not None:
        rp["partial_rotary_factor"] = partial_rotary_factor
    if rp["rope_type"] in ["llama3", "yarn", "longrope"]:
        if hasattr(self, "original_max_position_embeddings"):
            rp["original_max_position_embeddings"] = self.original_max_position_embeddings
        else:
            rp.setdefault("original_max_position_embeddings", self.max_position_embeddings)


def _dim(config, rp):
    partial_rotary_factor = rp.get("partial_rotary_factor", 1.0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * partial_rotary_factor)


def compute_default(config, seq_len=None):
    rp = config.rope_parameters
    base = rp["rope_theta"]
    dim = _dim(config, rp)
    attention_factor = 1.0
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    return inv_freq, attention_factor


def compute_linear(config, seq_len=None):
    rp = config.rope_parameters
    factor = rp["factor"]
    inv_freq, attention_factor = compute_default(config, seq_len)
    inv_freq /= factor
    return inv_freq, attention_factor


def compute_dynamic(config, seq_len=None):
    rp = config.rope_parameters
    base = rp["rope_theta"]
    dim = _dim(config, rp)
    factor = rp["factor"]
    attention_factor = 1.0
    if seq_len is None:
        seq_len = config.max_position_embeddings
    else:
        seq_len = max(seq_len, config.max_position_embeddings)
    base = base * ((factor * seq_len / config.max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    return inv_freq, attention_factor


def compute_yarn(config, seq_len=None):
    rp = config.rope_parameters
    base = rp["rope_theta"]
    dim = _dim(config, rp)
    factor = rp["factor"]
    attention_factor = rp.get("attention_factor")
    mscale = rp.get("mscale")
    mscale_all_dim = rp.get("mscale_all_dim")
    original_max_position_embeddings = rp["original_max_position_embeddings"]
    if factor is None:
        factor = config.max_position_embeddings / original_max_position_embeddings

    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rp.get("beta_fast") or 32
    beta_slow = rp.get("beta_slow") or 1

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate):
        low = find_correction_dim(low_rot, dim, base, max_position_embeddings)
        high = find_correction_dim(high_rot, dim, base, max_position_embeddings)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        return torch.clamp(linear_func, 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    truncate = rp.get("truncate", True)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2).to(dtype=torch.float)
    inv_freq = (
        inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
        + inv_freq_extrapolation * inv_freq_extrapolation_factor
    )
    return inv_freq, attention_factor


def compute_longrope(config, seq_len=None):
    rp = config.rope_parameters
    base = rp["rope_theta"]
    dim = _dim(config, rp)
    long_factor = rp["long_factor"]
    short_factor = rp["short_factor"]
    factor = rp.get("factor")
    attention_factor = rp.get("attention_factor")
    original_max_position_embeddings = rp["original_max_position_embeddings"]
    if factor is None:
        factor = config.max_position_embeddings / original_max_position_embeddings
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))
    if seq_len and seq_len > original_max_position_embeddings:
        ext_factors = torch.tensor(long_factor, dtype=torch.float32)
    else:
        ext_factors = torch.tensor(short_factor, dtype=torch.float32)
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (ext_factors * base**inv_freq_shape)
    return inv_freq, attention_factor


def compute_llama3(config, seq_len=None):
    rp = config.rope_parameters
    inv_freq, attention_factor = compute_default(config, seq_len)
    factor = rp["factor"]
    low_freq_factor = rp["low_freq_factor"]
    high_freq_factor = rp["high_freq_factor"]
    old_context_len = rp["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    return inv_freq_llama, attention_factor


ROPE_INIT_FUNCTIONS = {
    "default": compute_default,
    "linear": compute_linear,
    "dynamic": compute_dynamic,
    "yarn": compute_yarn,
    "longrope": compute_longrope,
    "llama3": compute_llama3,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a Hugging Face config.json")
    parser.add_argument("--seq-len", type=int, nargs="*", default=[0], help="sequence lengths (0: not given)")
    args = parser.parse_args()
    with open(args.config) as f:
        config = build_config(json.load(f))
    rope_type = config.rope_parameters["rope_type"]
    if rope_type not in ROPE_INIT_FUNCTIONS:
        sys.exit(f"hf_rope_reference: unknown rope_type {rope_type!r}")
    for seq_len in args.seq_len or [0]:
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, seq_len if seq_len > 0 else None)
        print(json.dumps({
            "seq_len": seq_len,
            "rope_type": rope_type,
            "rotary_dim": 2 * int(inv_freq.numel()),
            "inv_freq": [float(v) for v in inv_freq.tolist()],
            "attention_factor": float(attention_factor),
        }))


if __name__ == "__main__":
    main()
