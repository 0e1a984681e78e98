"""torch.ops.rotary.linear_attention against a plain-torch materialised RoFormer eq. 19, and gradcheck in float64."""
import unittest

import torch

import rotary
from test_rope_op import inv_freq_default, rotate_pairs

EPS32 = torch.finfo(torch.float32).eps


def rotate(x, pos, inv, a, layout):
    """a R(pos) x [S, H, D] on the first rotary_dim features, in x's dtype (angles and cos/sin built in float64)."""
    ang = pos.double()[:, None] * inv  # [S, r/2]
    cos = (torch.cos(ang) * a).to(x.dtype)[:, None, :]
    sin = (torch.sin(ang) * a).to(x.dtype)[:, None, :]
    return rotate_pairs(x, cos, sin, layout)


def linear_attention_plain(q, k, v, pos, inv=None, a=1.0, layout="half_split", causal=True):
    """Eq. 19 for one sequence, q, k [S, H, D], v [S, H, Dv] -> [S, H, Dv] in the inputs' dtype: the S x S
    numerator (a R_m phi(q_m)) . (a R_n phi(k_n)) and denominator phi(q_m) . phi(k_n) materialised."""
    pq, pk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    qr = pq if inv is None else rotate(pq, pos, inv, a, layout)
    kr = pk if inv is None else rotate(pk, pos, inv, a, layout)
    num = torch.einsum("mhd,nhd->hmn", qr, kr)  # [H, S, S]
    den = torch.einsum("mhd,nhd->hmn", pq, pk)
    if causal:
        future = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
        num, den = num.masked_fill(future, 0.0), den.masked_fill(future, 0.0)
    return torch.einsum("hmn,nhe->mhe", num, v) / den.sum(-1).T[:, :, None]


def packed_plain(q, k, v, pos, cu, **kw):
    """The reference over packed sequences [T, H, .] marked by cu_seqlens, one sequence at a time."""
    parts = [linear_attention_plain(q[b:e], k[b:e], v[b:e], pos[b:e], **kw) for b, e in zip(cu[:-1], cu[1:])]
    return torch.cat(parts)


def call(q, k, v, pos, cu=None, inv=None, a=1.0, layout="half_split", causal=True):
    return rotary.linear_attention(q, k, v, pos, cu, causal, inv, a, layout)


# (head_dim D, value_dim Dv, reference keywords): no rotation, full and partial rotation, both layouts, a != 1.
CASES = [
    (8, 8, dict()),
    (8, 8, dict(inv=inv_freq_default(8))),
    (10, 6, dict(inv=inv_freq_default(6), a=1.3, layout="interleaved")),
    (12, 5, dict(inv=inv_freq_default(8), layout="half_split", a=0.8)),
]
CU = torch.tensor([0, 5, 5, 6, 13])  # lengths 5, 0, 1, 7
T, H = 13, 3


def inputs(D, Dv, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = [torch.randn(T, H, n, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
         for n in (D, D, Dv)]
    pos = torch.randint(-50, 3000, (T,), generator=g)  # with gaps, negative, and far enough to wrap the angles
    return (*t, pos)


class LinearAttentionOpTest(unittest.TestCase):
    def test_second_derivative_raises_instead_of_dropping_the_term(self):
        q, k, v, pos = inputs(8, 8, seed=5, requires_grad=True)
        out = call(q, k, v, pos, inv=inv_freq_default(8))
        (gk,) = torch.autograd.grad(out.sum(), k, create_graph=True)
        with self.assertRaises(RuntimeError) as cm:
            gk.sum().backward()
        self.assertIn("rotary: linear_attention has no second derivative", str(cm.exception))

    def test_forward_matches_plain_float64(self):
        for D, Dv, kw in CASES:
            for causal in (True, False):
                q, k, v, pos = inputs(D, Dv)
                got = call(q, k, v, pos, CU, causal=causal, **kw)
                want = packed_plain(q, k, v, pos, CU.tolist(), causal=causal, **kw)
                self.assertEqual(got.shape, (T, H, Dv))
                # Same formula in another order: the error is a few float64 ulps of the largest term.
                err = (got - want).abs().max().item()
                self.assertLess(err, 1e-12 * want.abs().max().item(), f"{D} {Dv} {kw} causal={causal}")

    def test_float32_within_plain_float32_error(self):
        # The op accumulates its running state in float32; a float32 plain-torch reference errs too (its S x S sums
        # in float32). The op may err against the float64 truth by at most 3x that, plus a floor of 8 float32 ulps
        # of the largest value, the bound tests/nn uses for the whole model.
        for D, Dv, kw in CASES:
            for causal in (True, False):
                q, k, v, pos = inputs(D, Dv, seed=1)
                truth = packed_plain(q, k, v, pos, CU.tolist(), causal=causal, **kw)
                q32, k32, v32 = q.float(), k.float(), v.float()
                got = call(q32, k32, v32, pos, CU, causal=causal, **kw)
                plain32 = packed_plain(q32, k32, v32, pos, CU.tolist(), causal=causal, **kw)
                self.assertEqual(got.dtype, torch.float32)
                bound = 3 * (plain32.double() - truth).abs().max().item() + 8 * EPS32 * truth.abs().max().item()
                err = (got.double() - truth).abs().max().item()
                self.assertLessEqual(err, bound, f"{D} {Dv} {kw} causal={causal}")

    def test_float32_backward_within_plain_float32_error(self):
        D, Dv, kw = CASES[2]
        q, k, v, pos = inputs(D, Dv, seed=2, requires_grad=True)
        dout = torch.randn(T, H, Dv, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

        def grads(fn, dtype):
            xs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            torch.autograd.backward(fn(*xs), dout.to(dtype))
            return [x.grad.double() for x in xs]

        plain = lambda a, b, c: packed_plain(a, b, c, pos, CU.tolist(), **kw)  # noqa: E731
        truth, plain32 = grads(plain, torch.float64), grads(plain, torch.float32)
        got = grads(lambda a, b, c: call(a, b, c, pos, CU, **kw), torch.float32)
        for name, g, t, p in zip("qkv", got, truth, plain32):
            bound = 3 * (p - t).abs().max().item() + 8 * EPS32 * t.abs().max().item()
            self.assertLessEqual((g - t).abs().max().item(), bound, name)

    def test_gradcheck_float64(self):
        # Packed varlen (an empty and a one-token sequence included), explicit positions, causal and not, with and
        # without rotation, value_dim != head_dim; smaller than the other tests, as gradcheck perturbs every input.
        cu = torch.tensor([0, 3, 3, 4, 8])
        g = torch.Generator().manual_seed(4)
        for D, Dv, kw in CASES[:3]:
            for causal in (True, False):
                q, k, v = (torch.randn(8, 2, n, generator=g, dtype=torch.float64, requires_grad=True)
                           for n in (D, D, Dv))
                pos = torch.randint(-50, 3000, (8,), generator=g)
                fn = lambda q, k, v: call(q, k, v, pos, cu, causal=causal, **kw)  # noqa: E731
                self.assertTrue(torch.autograd.gradcheck(fn, (q, k, v), atol=1e-8), f"{D} {Dv} {kw} {causal}")

    def test_batched_4d_equals_packed_and_default_positions(self):
        B, S, D = 3, 5, 8
        inv = inv_freq_default(D)
        q, k, v = (torch.randn(B, S, H, D, dtype=torch.float64) for _ in range(3))
        out4 = call(q, k, v, None, inv=inv)
        cu = torch.arange(B + 1) * S
        pos = torch.arange(S).repeat(B)  # index inside each sequence, as the default
        out3 = call(q.reshape(B * S, H, D), k.reshape(B * S, H, D), v.reshape(B * S, H, D), pos, cu, inv=inv)
        self.assertEqual(out4.shape, (B, S, H, D))
        self.assertLess((out4.reshape(B * S, H, D) - out3).abs().max().item(), 1e-13)

    def test_bad_input_names_the_field(self):
        q = torch.randn(4, 4, 8)
        inv = inv_freq_default(8)
        bad = [
            ("k.heads", (q, torch.randn(4, 3, 8), torch.randn(4, 3, 8)), dict()),
            ("v.shape[0]", (q, q, torch.randn(5, 4, 8)), dict()),
            ("k.shape[-1]", (q, torch.randn(4, 4, 6), q), dict()),
            ("v.shape[-1]", (q, q, torch.randn(4, 4, 0)), dict()),
            ("k.dtype", (q, q.double(), q), dict()),
            ("q.dtype", (q.int(), q.int(), q.int()), dict()),
            ("q.dim()", (q[0], q[0], q[0]), dict()),
            ("cu_seqlens[batch]", (q, q, q), dict(cu=torch.tensor([0, 3]))),
            ("cu_seqlens", (q[None], q[None], q[None]), dict(cu=torch.tensor([0, 4]))),
            ("positions.numel()", (q, q, q), dict(pos=torch.arange(3))),
            ("positions.dtype", (q, q, q), dict(pos=torch.arange(4, dtype=torch.int32))),
            ("freqs.rotary_dim", (q, q, q), dict(inv=inv_freq_default(10))),
            ("layout", (q, q, q), dict(inv=inv, layout="sideways")),
            ("layout", (q, q, q), dict(layout="sideways")),  # even with no rotation
        ]
        for field, (a, b, c), kw in bad:
            pos = kw.pop("pos", None)
            with self.assertRaises(ValueError, msg=field) as cm:
                call(a, b, c, pos, **kw)
            self.assertIn(field, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            torch.ops.rotary.linear_attention_backward(torch.randn(4, 4, 7), q, q, q, None, None, True, inv, 1.0,
                                                       "half_split")
        self.assertIn("dout.shape", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
