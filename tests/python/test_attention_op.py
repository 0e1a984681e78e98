"""torch.ops.rotary.attention against a plain-torch float64 materialised reference, and gradcheck in float64."""
import math
import unittest

import torch

import rotary
from test_rope_op import inv_freq_default, rope_plain, rotate_pairs


def attention_plain(q, k, v, pos, mode, inv, a=1.0, layout="half_split", roper=False, window=0, leaky_k=1.0,
                    logn=0, causal=True, scale=None):
    """q [S, Hq, D], k/v [S, Hkv, D], one sequence, float64. ReRoPE the seed's two-matrix way."""
    S, Hq, D = q.shape
    Hkv = k.shape[1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    q, k, v = q.double(), k.double(), v.double()
    if logn:
        q = q * torch.clamp(torch.log(pos.double() + 1) / math.log(logn), min=1.0)[:, None, None]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    rope = lambda x, p: rope_plain(x, p, inv, a, layout)  # noqa: E731
    d = pos[:, None] - pos[None, :]  # [S, S] distance i - j
    if mode == "none":
        s = torch.einsum("ihd,jhd->hij", q, k)
    else:
        s1 = torch.einsum("ihd,jhd->hij", rope(q, pos), rope(k, pos))
        if mode == "rope":
            s = s1
        else:
            if mode == "rerope":
                qf = rope(q, torch.full_like(pos, window))
                s2 = torch.einsum("ihd,jhd->hij", qf, k)
            else:
                s2 = torch.empty_like(s1)
                for i in range(S):
                    for j in range(S):
                        dist = window + (pos[i] - pos[j] - window) / leaky_k
                        # q . R(-dist) k = (R(dist) q) . k
                        s2[:, i, j] = (rope_frac(q[i], float(dist), inv, a, layout) * k[j]).sum(-1)
            s = torch.where(d < window, s1, s2)
    s = s * scale
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    if not roper:
        return torch.einsum("hij,jhd->ihd", p, v)
    # RoPER: o_i = sum_j a_ij R(-delta_ij) v_j (pure rotation); for rope delta = pos_i - pos_j
    out = torch.zeros_like(q)
    for i in range(S):
        for j in range(S):
            delta = float(pos[i] - pos[j])
            if mode == "rerope" and delta >= window:
                delta = float(window)
            if mode == "leaky_rerope" and delta >= window:
                delta = window + (delta - window) / leaky_k
            out[i] += p[:, i, j, None] * rope_frac(v[j], -delta, inv, 1.0, layout)
    return out


def rope_frac(x, p, inv, a, layout):
    """Rotate x [H, D] by a real-valued position p (angle p * inv_freq), factor a."""
    ang = p * inv
    cos, sin = torch.cos(ang) * a, torch.sin(ang) * a
    return rotate_pairs(x, cos, sin, layout)


def call(q, k, v, pos, mode, inv, a=1.0, layout="half_split", roper=False, window=0, leaky_k=1.0, logn=0,
         causal=True):
    out, lse = torch.ops.rotary.attention(q, k, v, pos, None, causal, 0.0, mode, inv, a, layout, roper, window,
                                          leaky_k, logn)
    return out


CASES = [
    dict(mode="none"),
    dict(mode="rope"),
    dict(mode="rope", layout="interleaved", a=1.2),
    dict(mode="rope", roper=True),
    dict(mode="rope", logn=8),
    dict(mode="rerope", window=4),
    dict(mode="rerope", window=3, logn=6),
    dict(mode="leaky_rerope", window=4, leaky_k=4.0),
]


def t5_bucket(rel, num_buckets, max_distance, bidirectional):
    """Hugging Face's T5Attention._relative_position_bucket, rel = key - query, written out independently."""
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(rel < max_exact, rel, large)


def biased_attention_plain(q, k, v, pos, bias, table=None, slopes=None, buckets=8, max_distance=12, causal=True):
    """softmax(q k^T / sqrt(D) + b) v, b = -slope_h (pos_i - pos_j) (alibi) or table[bucket, h] (t5); float64."""
    S, Hq, D = q.shape
    k = k.repeat_interleave(Hq // k.shape[1], dim=1)
    v = v.repeat_interleave(Hq // v.shape[1], dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
    d = pos[:, None] - pos[None, :]
    if bias == "alibi":
        s = s - slopes[:, None, None] * d[None].double()
    else:
        b = t5_bucket(-d, buckets, max_distance, not causal)  # rel = key - query
        s = s + table[b].permute(2, 0, 1)
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), v)


class AttentionOpTest(unittest.TestCase):
    def test_score_bias_alibi_and_t5_match_plain_and_gradcheck(self):
        g = torch.Generator().manual_seed(5)
        S, Hq, Hkv, D = 13, 4, 2, 16
        pos = torch.arange(S) * 2 + 1  # distances up to 24: T5's log and clamped buckets (8 buckets to 12)
        slopes = torch.tensor([0.5, 0.25, -0.125, 0.0625], dtype=torch.float64)
        for bias in ("alibi", "t5"):
            for causal in (True, False):
                q = torch.randn(S, Hq, D, generator=g, dtype=torch.float64, requires_grad=True)
                k = torch.randn(S, Hkv, D, generator=g, dtype=torch.float64, requires_grad=True)
                v = torch.randn(S, Hkv, D, generator=g, dtype=torch.float64, requires_grad=True)
                table = torch.randn(8, Hq, generator=g, dtype=torch.float64, requires_grad=True)

                def fused(q, k, v, table):
                    out, _ = torch.ops.rotary.attention(q, k, v, pos, None, causal, 0.0, "none", None, 1.0,
                                                        "half_split", False, 0, 1.0, 0, bias, slopes, table, 8, 12,
                                                        not causal)
                    return out
                got = fused(q, k, v, table)
                want = biased_attention_plain(q, k, v, pos, bias, table, slopes, causal=causal)
                self.assertLess((got - want).abs().max().item(), 1e-12, f"{bias} causal={causal}")
                w = torch.randn(got.shape, generator=g, dtype=torch.float64)
                inputs = (q, k, v, table) if bias == "t5" else (q, k, v)
                g_got = torch.autograd.grad((got * w).sum(), inputs)
                g_want = torch.autograd.grad((want * w).sum(), inputs)
                for a, b in zip(g_got, g_want):
                    self.assertLess((a - b).abs().max().item(), 1e-11, f"{bias} causal={causal}")
        # The last case (t5, bidirectional): the table's gradient against finite differences too.
        self.assertTrue(torch.autograd.gradcheck(fused, (q, k, v, table), atol=1e-7))
        with self.assertRaises(ValueError) as cm:
            torch.ops.rotary.attention(q, k, v, pos, None, True, 0.0, "none", None, 1.0, "half_split", False, 0,
                                       1.0, 0, "t5", None, table[:5], 8, 12, False)
        self.assertIn("t5_table", str(cm.exception))


    def test_forward_matches_plain(self):
        g = torch.Generator().manual_seed(1)
        S, Hq, Hkv, D = 11, 4, 2, 16
        for case in CASES:
            for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
                q = torch.randn(S, Hq, D, generator=g, dtype=torch.float64)
                k = torch.randn(S, Hkv, D, generator=g, dtype=torch.float64)
                v = torch.randn(S, Hkv, D, generator=g, dtype=torch.float64)
                pos = torch.arange(S) * 3 + 5
                inv = inv_freq_default(12)
                got = call(q.to(dtype), k.to(dtype), v.to(dtype), pos, inv=inv, **case)
                want = attention_plain(q, k, v, pos, inv=inv, **case)
                err = (got.double() - want).abs().max().item()
                self.assertLess(err, tol, f"{case} {dtype}: {err}")

    def test_gradcheck_float64(self):
        S, Hq, Hkv, D = 6, 2, 1, 16
        inv = inv_freq_default(16)
        pos = torch.arange(S) * 2
        for case in CASES:
            q = torch.randn(S, Hq, D, dtype=torch.float64, requires_grad=True)
            k = torch.randn(S, Hkv, D, dtype=torch.float64, requires_grad=True)
            v = torch.randn(S, Hkv, D, dtype=torch.float64, requires_grad=True)
            fn = lambda q, k, v: call(q, k, v, pos, inv=inv, **case)  # noqa: E731
            self.assertTrue(torch.autograd.gradcheck(fn, (q, k, v), atol=1e-7), str(case))

    def test_batched_4d_equals_packed(self):
        B, S, H, D = 3, 5, 2, 16
        q, k, v = (torch.randn(B, S, H, D, dtype=torch.float64) for _ in range(3))
        inv = inv_freq_default(16)
        out4, _ = torch.ops.rotary.attention(q, k, v, None, None, True, 0.0, "rope", inv, 1.0, "half_split", False,
                                             0, 1.0, 0)
        cu = torch.tensor([0, S, 2 * S, 3 * S])
        out3, _ = torch.ops.rotary.attention(q.reshape(B * S, H, D), k.reshape(B * S, H, D), v.reshape(B * S, H, D),
                                             None, cu, True, 0.0, "rope", inv, 1.0, "half_split", False, 0, 1.0, 0)
        self.assertLess((out4.reshape(B * S, H, D) - out3).abs().max().item(), 1e-12)

    def test_hugging_face_layout_at_batch_one_and_two(self):
        # [B, H, S, D] transposed to [B, S, H, D], as Hugging Face models hold q, k, v: at B = 1 the op takes the
        # strided view as it is (heads outermost); at B = 2 it must copy. Both equal the contiguous call.
        S, H, D = 7, 2, 16
        inv = inv_freq_default(16)
        for B in (1, 2):
            q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64).transpose(1, 2) for _ in range(3))
            self.assertFalse(q.is_contiguous())
            got, _ = torch.ops.rotary.attention(q, k, v, None, None, True, 0.0, "rope", inv, 1.0, "half_split",
                                                False, 0, 1.0, 0)
            want, _ = torch.ops.rotary.attention(q.contiguous(), k.contiguous(), v.contiguous(), None, None, True,
                                                 0.0, "rope", inv, 1.0, "half_split", False, 0, 1.0, 0)
            self.assertLess((got - want).abs().max().item(), 1e-13, f"B={B}")

    def test_second_derivative_raises_instead_of_dropping_the_term(self):
        # A gradient penalty needs d(grad)/d(input); the fused backward has none. With create_graph the first
        # gradient keeps its value (first-order use works) and differentiating through it raises, naming the op.
        S, H, D = 5, 2, 16
        q, k, v = (torch.randn(S, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
        out = call(q, k, v, None, "rope", inv_freq_default(16))
        (gq,) = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
        (plain,) = torch.autograd.grad(call(q, k, v, None, "rope", inv_freq_default(16)).pow(2).sum(), q)
        self.assertLess((gq - plain).abs().max().item(), 1e-14)
        with self.assertRaises(RuntimeError) as cm:
            gq.pow(2).sum().backward()
        self.assertIn("rotary: attention has no second derivative", str(cm.exception))

    def test_bad_input_names_the_field(self):
        q = torch.randn(4, 4, 16)
        k = torch.randn(4, 3, 16)
        inv = inv_freq_default(16)
        with self.assertRaises(ValueError) as cm:
            call(q, k, k, None, "rope", inv)
        self.assertIn("heads", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            call(q, q, q, None, "sideways", inv)
        self.assertIn("mode", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            call(q, q, q, None, "rerope", inv, window=0)
        self.assertIn("window", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
