"""torch.classes.rotary.KvCache: a decode step equals the last row of the attention op over the same tokens, and
rows of the wrong width, or a head dim that does not fit the core's int, are refused naming the field (the core's
views carry no row width, so the binding is where a wider row must be caught)."""
import unittest

import torch

import rotary  # noqa: F401  (loads the ops)


def inv_freq_default(rotary_dim, base=10000.0):
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def make_cache(head_dim=16, kv_heads=2, capacity=32, mode="rope", rotary_dim=None):
    inv = inv_freq_default(rotary_dim or head_dim)
    return torch.classes.rotary.KvCache(capacity, kv_heads, head_dim, "float64", mode, inv, 1.0, "half_split",
                                        False, 4, 1.0, 0)


# torch 1.13 surfaces a rotary::Error (std::invalid_argument) as ValueError from ops and constructors, but as
# RuntimeError from the methods of a TorchScript class; the message is the same.
CORE_ERROR = (ValueError, RuntimeError)


class KvCacheOpTest(unittest.TestCase):
    def test_decode_equals_last_row_of_attention(self):
        S, Hq, Hkv, D = 9, 4, 2, 16
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(S, h, D, generator=g, dtype=torch.float64) for h in (Hq, Hkv, Hkv))
        pos = torch.arange(S, dtype=torch.long) * 2 + 1
        for mode in ("rope", "rerope"):
            cache = make_cache(D, Hkv, mode=mode)
            cache.append(k, v, pos)
            got = cache.decode(q[-1], None, 0.0)
            want, _ = torch.ops.rotary.attention(q, k, v, pos, None, True, 0.0, mode, inv_freq_default(D), 1.0,
                                                 "half_split", False, 4, 1.0, 0)
            self.assertLess((got - want[-1]).abs().max().item(), 1e-12, mode)

    def test_rows_of_another_width_are_refused(self):
        cache = make_cache(head_dim=16)
        wide = torch.randn(3, 2, 24, dtype=torch.float64)
        with self.assertRaises(CORE_ERROR) as cm:
            cache.append(wide, wide, torch.arange(3))
        self.assertIn("k.shape[2] = 24", str(cm.exception))
        self.assertIn("head_dim = 16", str(cm.exception))
        self.assertEqual(cache.size(), 0)
        ok = torch.randn(3, 2, 16, dtype=torch.float64)
        cache.append(ok, ok, torch.arange(3))
        with self.assertRaises(CORE_ERROR) as cm:
            cache.decode(torch.randn(4, 8, dtype=torch.float64), None, 0.0)
        self.assertIn("q.shape[1] = 8", str(cm.exception))

    def test_head_dim_beyond_int_is_refused_not_truncated(self):
        with self.assertRaises(CORE_ERROR) as cm:
            make_cache(head_dim=2**32 + 16, rotary_dim=16)
        self.assertIn("head_dim = 4294967312", str(cm.exception))

    def test_head_major_keys_are_taken(self):
        # [1, H, n, D] transposed to [n, H, D] (Hugging Face at batch 1): same result as the contiguous rows.
        n, H, D = 6, 2, 16
        k = torch.randn(1, H, n, D, dtype=torch.float64).transpose(1, 2)[0]
        v = torch.randn(1, H, n, D, dtype=torch.float64).transpose(1, 2)[0]
        q = torch.randn(4, D, dtype=torch.float64)
        a, b = make_cache(D, H), make_cache(D, H)
        a.append(k, v, torch.arange(n))
        b.append(k.contiguous(), v.contiguous(), torch.arange(n))
        self.assertEqual((a.decode(q, None, 0.0) - b.decode(q, None, 0.0)).abs().max().item(), 0.0)


if __name__ == "__main__":
    unittest.main()
