"""rotary.RotaryEmbedding against float64 rewrites of transformers' rope initialisation functions (default, linear,
dynamic, llama3, yarn), its tables against the formulas, the two table forms against each other and against
rotary.rope, and bad arguments named."""
import json
import math
import os
import tempfile
import unittest

import torch

import rotary
from refusals import assert_each_refused


def default_inv_freq(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def llama3_inv_freq(dim, base, factor, low, high, old_context):
    inv = default_inv_freq(dim, base)
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_inv_freq(dim, base, factor, original_max, beta_fast=32.0, beta_slow=1.0):
    def correction_dim(rotations):
        return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(base))
    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv = (1.0 / (factor * pos)) * (1 - extrapolation) + (1.0 / pos) * extrapolation
    return inv, 0.1 * math.log(factor) + 1.0


class RotaryEmbeddingTest(unittest.TestCase):
    def assert_close(self, a, b, rtol=1e-12):
        self.assertTrue(torch.allclose(a, b, rtol=rtol, atol=0), f"{a} vs {b}")

    def test_frequencies_match_transformers_formulas(self):
        d, base = 64, 500000.0
        self.assert_close(rotary.RotaryEmbedding(d, base).inv_freq, default_inv_freq(d, base))
        lin = rotary.RotaryEmbedding(d, base, {"rope_type": "linear", "factor": 4.0})
        self.assert_close(lin.inv_freq, default_inv_freq(d, base) / 4)
        l3 = rotary.RotaryEmbedding(d, base, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                    max_position_embeddings=131072)
        self.assert_close(l3.inv_freq, llama3_inv_freq(d, base, 8.0, 1.0, 4.0, 8192))
        yarn = rotary.RotaryEmbedding(d, 10000.0, {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 4096},
                                      max_position_embeddings=16384)
        inv, attention_factor = yarn_inv_freq(d, 10000.0, 4.0, 4096)
        self.assert_close(yarn.inv_freq, inv)
        self.assertAlmostEqual(yarn.attention_factor, attention_factor, places=12)
        # dynamic: the base grows with the length past max_position_embeddings, and not before
        dyn = rotary.RotaryEmbedding(d, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=100)
        self.assert_close(dyn.freqs(100)[0], default_inv_freq(d, 10000.0))
        grown = 10000.0 * ((2.0 * 300 / 100) - 1) ** (d / (d - 2))
        self.assert_close(dyn.freqs(300)[0], default_inv_freq(d, grown), rtol=1e-10)

    def test_tables_match_the_formulas_and_feed_both_apply_functions(self):
        emb = rotary.RotaryEmbedding(16, 10000.0, {"rope_type": "yarn", "factor": 2.0,
                                                   "original_max_position_embeddings": 64},
                                     max_position_embeddings=128)
        pos = torch.tensor([0, 5, 127])
        cos, sin = emb.cos_sin(pos, dtype=torch.float64)
        angles = pos.double().unsqueeze(-1) * emb.inv_freq
        self.assert_close(cos, angles.cos() * emb.attention_factor)
        self.assert_close(sin, angles.sin() * emb.attention_factor)
        # transformers' form: [batch, seqlen, rotary_dim], each pair's value on both halves
        x = torch.randn(1, 3, 2, 16, dtype=torch.float64)
        c_hf, s_hf = emb(x, pos.unsqueeze(0))
        self.assertEqual(c_hf.shape, (1, 3, 16))
        self.assert_close(c_hf[0], torch.cat([cos, cos], -1))
        # the same rotation three ways: flash-attn's tables, transformers' tables, rotary.rope with the frequencies
        c_all, s_all = emb.cos_sin(128, dtype=torch.float64)
        by_rows = rotary.apply_rotary_emb(x, c_all[pos], s_all[pos])
        by_hf, _ = rotary.apply_rotary_pos_emb(x, x, c_hf, s_hf, unsqueeze_dim=2)
        by_freqs = rotary.rope(x, pos.unsqueeze(0), emb.inv_freq, emb.attention_factor)
        self.assert_close(by_rows, by_hf, rtol=1e-14)
        self.assertLess((by_rows - by_freqs).abs().max().item(), 1e-12)
        inter = rotary.RotaryEmbedding(16, interleaved=True)
        c_i, _ = inter(x, pos.unsqueeze(0))
        self.assert_close(c_i[0, :, :2], inter.cos_sin(pos, dtype=torch.float64)[0][:, :1].expand(3, 2))

    def test_from_config_reads_a_whole_config_file(self):
        config = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6, "partial_rotary_factor": 0.5,
                  "max_position_embeddings": 2048, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(config, f)
            emb = rotary.RotaryEmbedding.from_config(d)
        self.assertEqual(emb.rotary_dim, 32)  # head_dim 64, half of it rotated
        self.assert_close(emb.inv_freq, default_inv_freq(32, 1e6) / 2)

    def test_bad_arguments_are_named(self):
        cases = [
            (ValueError, "dim", lambda: rotary.RotaryEmbedding(7)),
            (TypeError, "dim", lambda: rotary.RotaryEmbedding(8.0)),
            (TypeError, "rope_scaling", lambda: rotary.RotaryEmbedding(8, rope_scaling="yarn")),
            (ValueError, "rope_scaling.rope_type", lambda: rotary.RotaryEmbedding(8, rope_scaling={"rope_type": "x"})),
            (ValueError, "rope_scaling.factor",
             lambda: rotary.RotaryEmbedding(8, rope_scaling={"rope_type": "linear", "factor": -1.0})),
            (ValueError, "positions", lambda: rotary.RotaryEmbedding(8).cos_sin(torch.tensor([-1]))),
            (ValueError, "positions.dtype", lambda: rotary.RotaryEmbedding(8).cos_sin(torch.tensor([1.0]))),
            (TypeError, "interleaved", lambda: rotary.RotaryEmbedding(8, interleaved="yes")),
        ]
        assert_each_refused(self, cases)


if __name__ == "__main__":
    unittest.main()
