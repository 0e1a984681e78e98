"""torch.ops.rotary.rope against a plain-torch float64 reference, and gradcheck in float64."""
import math
import unittest

import torch

import rotary


def inv_freq_default(rotary_dim, base=10000.0):
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def rotate_pairs(x, cos, sin, layout):
    """(x1 cos - x2 sin, x1 sin + x2 cos) on the pairs of the first r = 2 * cos.shape[-1] features of x (layout
    "half_split": (i, i + r/2); "interleaved": (2i, 2i+1)); the rest pass through. cos, sin broadcast to the pairs."""
    r = 2 * cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    if layout == "half_split":
        x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
        out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)


def rope_plain(x, positions, inv_freq, a, layout):
    """The usual composition x*cos + rotate_half(x)*sin, in float64, on the first rotary_dim features."""
    xd = x.double()
    ang = positions.double()[..., None] * inv_freq  # [..., r/2]
    cos, sin = (torch.cos(ang) * a)[..., None, :], (torch.sin(ang) * a)[..., None, :]
    return rotate_pairs(xd, cos, sin, layout)


class RopeOpTest(unittest.TestCase):
    def test_matches_plain_torch(self):
        g = torch.Generator().manual_seed(0)
        for layout in ("half_split", "interleaved"):
            for (D, r) in ((64, 64), (64, 32), (20, 6)):
                for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
                    x = torch.randn(2, 5, 3, D, generator=g).to(dtype)
                    pos = torch.randint(0, 100000, (2, 5), generator=g)
                    inv = inv_freq_default(r)
                    got = rotary.rope(x, pos, inv, 1.3, layout)
                    want = rope_plain(x, pos, inv, 1.3, layout)
                    self.assertEqual(got.dtype, dtype)
                    err = (got.double() - want).abs().max().item()
                    self.assertLessEqual(err, tol * 1.3 * 4, f"{layout} D={D} r={r} {dtype}: {err}")

    def test_inverse_undoes_forward(self):
        x = torch.randn(7, 4, 32, dtype=torch.float64)
        pos = torch.arange(7) * 1000
        inv = inv_freq_default(32)
        back = rotary.rope_inverse(rotary.rope(x, pos, inv, 0.7), pos, inv, 0.7)
        self.assertLess((back - x).abs().max().item(), 1e-12)

    def test_gradcheck_float64(self):
        for layout in ("half_split", "interleaved"):
            x = torch.randn(3, 2, 12, dtype=torch.float64, requires_grad=True)
            pos = torch.tensor([0, 5, 900])
            inv = inv_freq_default(8)
            self.assertTrue(torch.autograd.gradcheck(lambda t: rotary.rope(t, pos, inv, 1.1, layout), (x,)))
            self.assertTrue(torch.autograd.gradcheck(lambda t: rotary.rope_inverse(t, pos, inv, 1.1, layout), (x,)))

    def test_second_derivative_float64(self):
        # rope is linear in x and its backward is rope itself (transposed), so it differentiates twice.
        x = torch.randn(3, 2, 12, dtype=torch.float64, requires_grad=True)
        pos = torch.tensor([0, 5, 900])
        inv = inv_freq_default(8)
        fn = lambda t: rotary.rope(t, pos, inv, 1.1, "half_split") ** 2  # noqa: E731 (non-linear on top)
        self.assertTrue(torch.autograd.gradgradcheck(fn, (x,)))

    def test_non_contiguous_input(self):
        x = torch.randn(6, 4, 2, 16, dtype=torch.float64).transpose(0, 1)  # [4, 6, 2, 16], not viewable as tokens
        pos = torch.arange(24).reshape(4, 6)
        inv = inv_freq_default(16)
        err = (rotary.rope(x, pos, inv) - rope_plain(x, pos, inv, 1.0, "half_split")).abs().max().item()
        self.assertLess(err, 1e-12)

    def test_bad_input_names_the_field(self):
        x = torch.randn(3, 2, 16)
        inv = inv_freq_default(16)
        cases = [
            (lambda: rotary.rope(x, torch.arange(4), inv), "positions.numel()"),
            (lambda: rotary.rope(x, torch.arange(3).float(), inv), "positions.dtype"),
            (lambda: rotary.rope(x, torch.arange(3), inv_freq_default(18)), "rotary_dim"),
            (lambda: rotary.rope(x, torch.arange(3), inv, layout="diagonal"), "layout"),
            (lambda: rotary.rope(x.int(), torch.arange(3), inv), "x.dtype"),
            (lambda: rotary.rope(x, torch.arange(3), inv, attention_factor=math.nan), "attention_factor"),
        ]
        for fn, field in cases:
            with self.assertRaises(ValueError) as cm:
                fn()
            self.assertIn(field, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
