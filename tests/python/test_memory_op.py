"""torch.classes.rotary.MemoryKvCache: token by token, with top_k past the memory's size, every step equals softmax
attention over all tokens so far (RoPE written out here in plain torch: the check does not go through the core);
with top_k = 0 it attends to the window alone; a small top_k puts part of the mass on the memory; a bf16 memory
equals the same attention with the memory's rotated keys and values rounded to bf16, in half the file; bad input is
refused naming the field; the memory is saved to a file."""
import os
import tempfile
import unittest

import torch

import rotary  # noqa: F401  (loads the ops)

CORE_ERROR = (ValueError, RuntimeError)


def inv_freq_default(dim, base=100.0):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def rotate(x, pos, inv):  # half-split RoPE of x [..., D] at positions pos [...], float64
    ang = pos.to(torch.float64)[..., None] * inv
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def full_attention(q, k, v, pos, q_pos, inv):  # q [Hq, D]; k, v [n, Hkv, D]
    Hq, D = q.shape
    group = Hq // k.shape[1]
    qr = rotate(q.double(), torch.full((Hq,), q_pos), inv)
    kr = rotate(k.double(), pos[:, None].expand(k.shape[0], k.shape[1]), inv)
    kr, vv = kr.repeat_interleave(group, dim=1), v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("hd,nhd->hn", qr, kr) / D ** 0.5
    return torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), vv)


class MemoryKvCacheTest(unittest.TestCase):
    def test_every_step_equals_full_attention_with_all_of_memory(self):
        n, Hq, Hkv, D, W = 30, 4, 2, 16, 5
        g = torch.Generator().manual_seed(5)
        k, v = (torch.randn(n, Hkv, D, generator=g) for _ in range(2))
        q = 2 * torch.randn(n, Hq, D, generator=g)
        pos = torch.cumsum(torch.randint(1, 3, (n,), generator=g), 0)
        inv = inv_freq_default(D)
        cache = torch.classes.rotary.MemoryKvCache(W, Hkv, D, "exact", "rope", inv, 1.0, "half_split", 0, 0, "f32")
        for t in range(n):
            cache.append(k[t:t + 1], v[t:t + 1], pos[t:t + 1])
            out, mass, rows = cache.decode(q[t], int(pos[t]), 100, 0.0)
            want = full_attention(q[t], k[:t + 1], v[:t + 1], pos[:t + 1], int(pos[t]), inv)
            self.assertLess((out.double() - want).abs().max().item(), 2e-5, t)
            self.assertEqual(cache.size(), t + 1)
            m = cache.memory_size()
            self.assertTrue(bool((rows[:, :m] >= 0).all()) and bool((rows[:, m:] == -1).all()))
            if m > 0:
                self.assertTrue(bool((mass > 0).all()) and bool((mass < 1).all()))
        self.assertGreater(cache.memory_size(), 20)
        # The window alone: attention over the tokens still in it.
        out, mass, _ = cache.decode(q[-1], int(pos[-1]), 0, 0.0)
        w = cache.window_size()
        want = full_attention(q[-1], k[n - w:], v[n - w:], pos[n - w:], int(pos[-1]), inv)
        self.assertLess((out.double() - want).abs().max().item(), 2e-5)
        self.assertEqual(float(mass.abs().max()), 0.0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "doc.mem")
            cache.save_memory(path, 7)
            self.assertGreater(os.path.getsize(path), cache.memory_size() * Hkv * D * 8)

    def test_a_bf16_memory_rounds_its_keys_and_values(self):
        n, Hq, Hkv, D, W = 24, 4, 2, 16, 4
        g = torch.Generator().manual_seed(9)
        k, v = (torch.randn(n, Hkv, D, generator=g) for _ in range(2))
        q = 2 * torch.randn(Hq, D, generator=g)
        pos = torch.arange(n)
        inv = inv_freq_default(D)
        caches = {s: torch.classes.rotary.MemoryKvCache(W, Hkv, D, "exact", "rope", inv, 1.0, "half_split", 0, 0, s)
                  for s in ("f32", "bf16")}
        for c in caches.values():
            c.append(k, v, pos)
        m = caches["bf16"].memory_size()
        self.assertGreater(m, 10)
        out16, _, _ = caches["bf16"].decode(q, n - 1, 100, 0.0)
        out32, _, _ = caches["f32"].decode(q, n - 1, 100, 0.0)
        # The oracle: the memory's rows (the oldest m) keep R(pos) k and v rounded to bf16; the window's stay exact.
        kr = rotate(k.double(), pos[:, None].expand(n, Hkv), inv)
        kr[:m] = kr[:m].float().to(torch.bfloat16).double()
        vv = v.double().clone()
        vv[:m] = vv[:m].float().to(torch.bfloat16).double()
        qr = rotate(q.double(), torch.full((Hq,), n - 1), inv)
        s = torch.einsum("hd,nhd->hn", qr, kr.repeat_interleave(Hq // Hkv, dim=1)) / D ** 0.5
        want = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), vv.repeat_interleave(Hq // Hkv, dim=1))
        self.assertLess((out16.double() - want).abs().max().item(), 2e-3)
        self.assertGreater((out16 - out32).abs().max().item(), 1e-4)  # the rounding happened
        with tempfile.TemporaryDirectory() as d:
            sizes = {}
            for s, c in caches.items():
                c.save_memory(os.path.join(d, s), 3)
                sizes[s] = os.path.getsize(os.path.join(d, s))
            self.assertLess(sizes["bf16"], 0.75 * sizes["f32"])

    def test_bad_input_is_refused_naming_the_field(self):
        inv = inv_freq_default(16)
        with self.assertRaises(CORE_ERROR) as cm:
            torch.classes.rotary.MemoryKvCache(4, 2, 16, "unlimited", "rope", inv, 1.0, "half_split", 0, 0, "f32")
        self.assertIn("memory_policy", str(cm.exception))
        with self.assertRaises(CORE_ERROR) as cm:
            torch.classes.rotary.MemoryKvCache(4, 2, 16, "exact", "rope", inv, 1.0, "half_split", 0, 0, "f64")
        self.assertIn("memory_storage", str(cm.exception))
        cache = torch.classes.rotary.MemoryKvCache(4, 2, 16, "exact", "rope", inv, 1.0, "half_split", 0, 0, "f32")
        with self.assertRaises(CORE_ERROR) as cm:
            cache.append(torch.randn(2, 2, 16, dtype=torch.float64), torch.randn(2, 2, 16, dtype=torch.float64),
                         torch.arange(2))
        self.assertIn("float32", str(cm.exception))
        cache.append(torch.randn(2, 2, 16), torch.randn(2, 2, 16), torch.arange(2))
        with self.assertRaises(CORE_ERROR) as cm:
            cache.append(torch.randn(1, 2, 16), torch.randn(1, 2, 16), torch.tensor([1]))
        self.assertIn("positions", str(cm.exception))
        self.assertEqual(cache.size(), 2)
        with self.assertRaises(CORE_ERROR) as cm:
            cache.decode(torch.randn(3, 16), 5, 4, 0.0)
        self.assertIn("heads", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
