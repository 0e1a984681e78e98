"""The package's attention and caches as users call them: rotary.attention's modes against the op it wraps and
against a float64 softmax attention written out here, its gradient in float64; rotary.KvCache and
rotary.MemoryKvCache with keyword arguments and default positions, against the attention, saved and opened
(equal to a cache never saved; other settings or another fingerprint refused by name); bad arguments named as a
TypeError or ValueError."""
import os
import tempfile
import unittest

import torch

import rotary
from refusals import assert_each_refused


def rotate(x, pos, inv):  # half-split RoPE of x [..., S, H, D] at positions pos [S], float64
    ang = pos.double()[:, None] * inv
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    half = inv.numel()
    a, b = x[..., :half], x[..., half:2 * half]
    return torch.cat([a * c - b * s, a * s + b * c, x[..., 2 * half:]], dim=-1)


def softmax_attention(q, k, v, pos, inv, mode="rope", window=0):
    """Causal attention of one sequence q [S, H, D]; rerope: the distance clipped at window (seed 004)."""
    S, H, D = q.shape
    k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
    out = torch.empty_like(q)
    for i in range(S):
        for h in range(H):
            scores = []
            for j in range(i + 1):
                d = pos[i] - pos[j]
                if mode == "rerope":
                    d = min(int(d), window)
                qi = rotate(q[i:i + 1, h:h + 1], torch.tensor([d]), inv)[0, 0]
                scores.append(qi @ k[j, h] / D ** 0.5)
            p = torch.softmax(torch.stack(scores), 0)
            out[i, h] = p @ v[:i + 1, h]
    return out


class AttentionTest(unittest.TestCase):
    def test_modes_against_float64_attention_and_the_op(self):
        torch.manual_seed(0)
        S, H, Hkv, D = 7, 4, 2, 16
        q, k, v = (torch.randn(1, S, h, D, dtype=torch.float64) for h in (H, Hkv, Hkv))
        emb = rotary.RotaryEmbedding(D, base=100.0)
        pos = torch.arange(S)
        for mode, window in (("rope", 0), ("rerope", 3)):
            out = rotary.attention(q, k, v, mode, rotary_emb=emb, window=window)
            want = softmax_attention(q[0], k[0], v[0], pos, emb.inv_freq, mode, window)
            self.assertLess((out[0] - want).abs().max().item(), 1e-12, mode)
        out, lse = rotary.attention(q, k, v, "roper", rotary_emb=emb, return_lse=True)
        op_out, op_lse = torch.ops.rotary.attention(q, k, v, None, None, True, 0.0, "rope", emb.inv_freq, 1.0,
                                                    "half_split", True, 0, 1.0, 0)
        self.assertTrue(torch.equal(out, op_out) and torch.equal(lse, op_lse))
        self.assertEqual(lse.shape, (S, H))

    def test_gradient_in_float64(self):
        torch.manual_seed(1)
        q, k, v = (torch.randn(1, 5, 2, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
        emb = rotary.RotaryEmbedding(16, base=100.0)
        self.assertTrue(torch.autograd.gradcheck(
            lambda a, b, c: rotary.attention(a, b, c, "leaky_rerope", rotary_emb=emb, window=2, leaky_k=4.0),
            (q, k, v)))

    def test_bad_arguments_are_named(self):
        q = torch.randn(1, 3, 2, 16)
        inv = rotary.RotaryEmbedding(16).inv_freq
        cases = [
            (ValueError, "mode", lambda: rotary.attention(q, q, q, "alibi", inv_freq=inv)),
            (ValueError, "window", lambda: rotary.attention(q, q, q, "rerope", inv_freq=inv)),
            (ValueError, "inv_freq", lambda: rotary.attention(q, q, q, "rope")),
            (TypeError, "logn", lambda: rotary.attention(q, q, q, inv_freq=inv, logn=2.5)),
            (TypeError, "k", lambda: rotary.attention(q, [1], q, inv_freq=inv)),
            (ValueError, "k.dtype", lambda: rotary.attention(q, q.double(), q, inv_freq=inv)),
            (TypeError, "x", lambda: rotary.rope([1.0], torch.arange(1), inv)),
            (TypeError, "positions", lambda: rotary.rope_inverse(q, [0, 1, 2], inv)),
            (TypeError, "k", lambda: rotary.linear_attention(q, None, q)),
        ]
        assert_each_refused(self, cases)


class KvCacheTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(2)
        self.emb = rotary.RotaryEmbedding(16, base=1000.0)
        S = 12
        self.q, self.k, self.v = (torch.randn(S, h, 16, dtype=torch.float64) for h in (4, 2, 2))

    def make(self, **kw):
        settings = dict(dtype=torch.float64, mode="rerope", rotary_emb=self.emb, window=5)
        settings.update(kw)
        return rotary.KvCache(32, 2, 16, **settings)

    def test_decode_equals_attention_with_default_positions(self):
        cache = self.make()
        cache.append(self.k[:8], self.v[:8])
        cache.append(self.k[8:], self.v[8:])  # positions continue: 8..11
        self.assertEqual(len(cache), 12)
        self.assertEqual(cache.capacity, 32)
        want = rotary.attention(self.q.unsqueeze(0), self.k.unsqueeze(0), self.v.unsqueeze(0), "rerope",
                                rotary_emb=self.emb, window=5)
        self.assertLess((cache.decode(self.q[-1]) - want[0, -1]).abs().max().item(), 1e-12)

    def test_saved_and_opened_cache_goes_on_as_one_never_saved(self):
        whole = self.make()
        whole.append(self.k, self.v)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "prompt.kv")
            part = self.make()
            part.append(self.k[:7], self.v[:7])
            part.save(path, fingerprint=42)
            opened = rotary.KvCache.open(path, 16, 2, 16, fingerprint=42, dtype=torch.float64, mode="rerope",
                                         rotary_emb=self.emb, window=5)
            self.assertEqual(len(opened), 7)
            self.assertEqual(opened.capacity, 7 + 16)
            with self.assertRaises(ValueError) as caught:
                opened.append(self.k[7:], self.v[7:])  # the last position is not known after open
            self.assertIn("positions", str(caught.exception))
            opened.append(self.k[7:], self.v[7:], torch.arange(7, 12))
            self.assertTrue(torch.equal(opened.decode(self.q[-1]), whole.decode(self.q[-1])))
            with self.assertRaises(ValueError) as caught:
                rotary.KvCache.open(path, 16, 2, 16, fingerprint=43, dtype=torch.float64, mode="rerope",
                                    rotary_emb=self.emb, window=5)
            self.assertIn("fingerprint", str(caught.exception))
            with self.assertRaises(ValueError) as caught:
                rotary.KvCache.open(path, 16, 2, 16, fingerprint=42, dtype=torch.float64, mode="rerope",
                                    rotary_emb=self.emb, window=6)
            self.assertIn("window", str(caught.exception))

    def test_bad_arguments_are_named(self):
        cache = self.make()
        cases = [
            (TypeError, "capacity", lambda: rotary.KvCache(3.0, 2, 16, rotary_emb=self.emb)),
            (ValueError, "mode", lambda: rotary.KvCache(3, 2, 16, rotary_emb=self.emb, mode="alibi")),
            (ValueError, "window", lambda: rotary.KvCache(3, 2, 16, rotary_emb=self.emb, mode="rerope")),
            (ValueError, "inv_freq", lambda: rotary.KvCache(3, 2, 16)),
            (ValueError, "k.dtype", lambda: cache.append(self.k.float(), self.v.float())),
            (ValueError, "positions.shape", lambda: cache.append(self.k, self.v, torch.arange(3))),
            (ValueError, "k.shape[2]", lambda: cache.append(self.k[..., :8], self.v[..., :8])),
            (ValueError, "capacity", lambda: cache.append(torch.cat([self.k] * 3), torch.cat([self.v] * 3))),
        ]
        assert_each_refused(self, cases)


class MemoryKvCacheTest(unittest.TestCase):
    def test_saved_and_opened_memory_cache_goes_on_as_one_never_saved(self):
        torch.manual_seed(3)
        emb = rotary.RotaryEmbedding(16, base=100.0)
        n = 40
        k, v = torch.randn(n, 2, 16), torch.randn(n, 2, 16)
        q = 2 * torch.randn(4, 16)
        whole = rotary.MemoryKvCache(6, 2, 16, rotary_emb=emb)
        whole.append(k, v)
        self.assertGreater(whole.memory_size, 20)
        out, mass, rows = whole.decode(q, n - 1, top_k=8, return_retrieval=True)
        self.assertEqual(rows.shape, (4, 8))
        self.assertTrue(bool((mass > 0).all()))
        with tempfile.TemporaryDirectory() as d:
            part = rotary.MemoryKvCache(6, 2, 16, rotary_emb=emb)
            part.append(k[:25], v[:25])
            part.save(os.path.join(d, "memory"), os.path.join(d, "window"), fingerprint=7)
            opened = rotary.MemoryKvCache.open(os.path.join(d, "memory"), os.path.join(d, "window"), 6, 2, 16,
                                               fingerprint=7, rotary_emb=emb)
            self.assertEqual(len(opened), 25)
            opened.append(k[25:], v[25:], torch.arange(25, n))
            self.assertTrue(torch.equal(opened.decode(q, n - 1, top_k=8), out))
            with self.assertRaises(ValueError) as caught:
                rotary.MemoryKvCache.open(os.path.join(d, "memory"), os.path.join(d, "window"), 6, 2, 16,
                                          fingerprint=7, rotary_emb=emb, memory_storage="bf16")
            self.assertIn("storage", str(caught.exception))

    def test_bad_arguments_are_named(self):
        emb = rotary.RotaryEmbedding(16)
        cache = rotary.MemoryKvCache(4, 2, 16, rotary_emb=emb)
        cases = [
            (ValueError, "policy", lambda: rotary.MemoryKvCache(4, 2, 16, rotary_emb=emb, policy="lru")),
            (ValueError, "memory_storage", lambda: rotary.MemoryKvCache(4, 2, 16, rotary_emb=emb,
                                                                         memory_storage="q8")),
            (ValueError, "inv_freq", lambda: rotary.MemoryKvCache(4, 2, 16)),
            (ValueError, "q.dtype", lambda: cache.decode(torch.randn(4, 16).double(), 0)),
            (ValueError, "top_k", lambda: cache.decode(torch.randn(4, 16), 0, top_k=-1)),
        ]
        assert_each_refused(self, cases)


if __name__ == "__main__":
    unittest.main()
