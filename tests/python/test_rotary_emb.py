"""rotary.apply_rotary_emb (flash-attn's contract) and rotary.apply_rotary_pos_emb (transformers' and Liger's)
against float64 rewrites of the reference functions they replace: flash-attn's `apply_rotary_emb_torch` and
transformers' `q * cos + rotate_half(q) * sin`. Every storage type, both layouts, partial rotation, offsets, packed
against padded batches, in place against out of place, gradcheck in float64, and bad input named.

Tolerance, the flash-attention way: against the float64 reference, our error may be at most twice the error of the
same formula computed by PyTorch in the input's dtype (plus a float32-ulp floor for the float32 / float64 cases,
where both are near exact)."""
import unittest

import torch

import rotary
from refusals import assert_each_refused

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def rotate_half(x, interleaved=False):
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def flash_attn_reference(x, cos, sin, interleaved=False):
    """flash-attn's apply_rotary_emb_torch: x [B, S, H, D], cos / sin [S, r / 2] (already the rows of x's tokens)."""
    ro = cos.shape[-1] * 2
    if interleaved:
        c, s = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    else:
        c, s = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)  # over heads
    return torch.cat([x[..., :ro] * c + rotate_half(x[..., :ro], interleaved) * s, x[..., ro:]], dim=-1)


def transformers_reference(q, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]
    return torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)


def tables(rows, rotary_dim, base=10000.0, dtype=torch.float32):
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    f = torch.outer(torch.arange(rows, dtype=torch.float64), inv)
    return f.cos().to(dtype), f.sin().to(dtype)


def assert_within_flash_attn_tolerance(test, ours, same_dtype_torch, exact, what):
    err = (ours.double() - exact).abs().max().item()
    torch_err = (same_dtype_torch.double() - exact).abs().max().item()
    test.assertLessEqual(err, 2 * torch_err + 1e-6, f"{what}: ours {err:.3g}, PyTorch in the same dtype {torch_err:.3g}")


class ApplyRotaryEmbTest(unittest.TestCase):
    def test_matches_flash_attn_reference_in_every_dtype_layout_and_rotary_dim(self):
        torch.manual_seed(0)
        for dtype in DTYPES:
            for interleaved in (False, True):
                for rotary_dim, head_dim in ((64, 64), (32, 80), (6, 10)):
                    with self.subTest(dtype=dtype, interleaved=interleaved, rotary_dim=rotary_dim):
                        x = torch.randn(2, 37, 3, head_dim).to(dtype)
                        cos, sin = tables(50, rotary_dim, dtype=dtype)
                        out = rotary.apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=5)
                        self.assertEqual(out.dtype, dtype)
                        self.assertEqual(out.shape, x.shape)
                        c, s = cos[5:42], sin[5:42]
                        exact = flash_attn_reference(x.double(), c.double(), s.double(), interleaved)
                        same = flash_attn_reference(x, c, s, interleaved)
                        assert_within_flash_attn_tolerance(self, out, same, exact, "forward")
                        # features past the rotary dim are copied bit for bit
                        self.assertTrue(torch.equal(out[..., rotary_dim:], x[..., rotary_dim:]))

    def test_per_sequence_offsets_and_packed_sequences_equal_padded_ones(self):
        torch.manual_seed(1)
        cos, sin = tables(64, 16)
        lengths, offsets = [5, 0, 11, 3], torch.tensor([2, 9, 0, 40], dtype=torch.int32)
        seqs = [torch.randn(n, 4, 16) for n in lengths]
        packed = torch.cat(seqs)
        cu = torch.tensor([0, 5, 5, 16, 19], dtype=torch.int32)
        out = rotary.apply_rotary_emb(packed, cos, sin, seqlen_offsets=offsets, cu_seqlens=cu, max_seqlen=11)
        padded = torch.zeros(4, 11, 4, 16)
        for b, s in enumerate(seqs):
            padded[b, :len(s)] = s
        out_padded = rotary.apply_rotary_emb(padded, cos, sin, seqlen_offsets=offsets)
        for b, (start, n) in enumerate(zip([0, 5, 5, 16], lengths)):
            self.assertTrue(torch.equal(out[start:start + n], out_padded[b, :n]), f"sequence {b}")
            exact = flash_attn_reference(seqs[b].double().unsqueeze(0), cos[offsets[b]:offsets[b] + n].double(),
                                         sin[offsets[b]:offsets[b] + n].double())
            self.assertLess((out[start:start + n].double() - exact[0]).abs().max().item() if n else 0, 1e-5)

    def test_in_place_writes_into_x_and_equals_out_of_place(self):
        torch.manual_seed(2)
        cos, sin = tables(32, 64)
        for interleaved in (False, True):
            x = torch.randn(1, 32, 8, 64)
            expected = rotary.apply_rotary_emb(x, cos, sin, interleaved=interleaved)
            y = x.clone()
            ptr = y.data_ptr()
            out = rotary.apply_rotary_emb(y, cos, sin, interleaved=interleaved, inplace=True)
            self.assertIs(out, y)
            self.assertEqual(y.data_ptr(), ptr)
            self.assertTrue(torch.equal(y, expected))
        # nothing the size of x is allocated in place (torch.profiler's memory view); out of place, x's copy is
        y = torch.randn(1, 256, 8, 64)
        cos256, sin256 = tables(256, 64)
        for inplace, least, most in ((True, 0, y.numel() * 4 // 8), (False, y.numel() * 4, None)):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as p:
                rotary.apply_rotary_emb(y, cos256, sin256, inplace=inplace)
            largest = max(e.cpu_memory_usage for e in p.key_averages())
            self.assertGreaterEqual(largest, least)
            if most is not None:
                self.assertLess(largest, most, "in place allocated a tensor the size of x")
        # a strided view (every other head) in place: the other heads stay as they were
        x = torch.randn(1, 32, 8, 64)
        before = x.clone()
        rotary.apply_rotary_emb(x[:, :, ::2], cos, sin, inplace=True)
        self.assertTrue(torch.equal(x[:, :, 1::2], before[:, :, 1::2]))
        self.assertTrue(torch.equal(x[:, :, ::2], rotary.apply_rotary_emb(before[:, :, ::2], cos, sin)))

    def test_gradients_in_float64(self):
        torch.manual_seed(3)
        cos, sin = tables(20, 8, dtype=torch.float64)
        for interleaved in (False, True):
            x = torch.randn(2, 7, 3, 12, dtype=torch.float64, requires_grad=True)
            self.assertTrue(torch.autograd.gradcheck(
                lambda a: rotary.apply_rotary_emb(a, cos, sin, interleaved=interleaved, seqlen_offsets=4), (x,)))
            packed = torch.randn(9, 2, 8, dtype=torch.float64, requires_grad=True)
            cu = torch.tensor([0, 4, 9])
            self.assertTrue(torch.autograd.gradcheck(
                lambda a: rotary.apply_rotary_emb(a, cos, sin, interleaved=interleaved, cu_seqlens=cu), (packed,)))
            # in place on a non-leaf: the gradient flows through the dirtied tensor
            w = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
            self.assertTrue(torch.autograd.gradcheck(
                lambda a: rotary.apply_rotary_emb(a * 1.0, cos, sin, interleaved=interleaved, inplace=True), (w,)))

    def test_bad_input_names_the_argument(self):
        cos, sin = tables(8, 16)
        x = torch.randn(1, 8, 2, 16)
        cases = [
            (TypeError, "x", lambda: rotary.apply_rotary_emb(x.numpy(), cos, sin)),
            (ValueError, "x.dtype", lambda: rotary.apply_rotary_emb(x.int(), cos, sin)),
            (ValueError, "x.dim()", lambda: rotary.apply_rotary_emb(x[0], cos, sin)),
            (ValueError, "sin.shape", lambda: rotary.apply_rotary_emb(x, cos, sin[:4])),
            (ValueError, "cos.shape[-1]", lambda: rotary.apply_rotary_emb(x[..., :8], cos, sin)),
            (ValueError, "cos.shape[0]", lambda: rotary.apply_rotary_emb(x, cos, sin, seqlen_offsets=1)),
            (ValueError, "seqlen_offsets", lambda: rotary.apply_rotary_emb(x, cos, sin, seqlen_offsets=-1)),
            (ValueError, "seqlen_offsets.shape",
             lambda: rotary.apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(2, dtype=torch.int64))),
            (ValueError, "cu_seqlens[2]",
             lambda: rotary.apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 5, 3, 8]))),
            (ValueError, "cu_seqlens[-1]",
             lambda: rotary.apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 5]))),
            (ValueError, "cu_seqlens.dtype",
             lambda: rotary.apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0.0, 8.0]))),
            (ValueError, "max_seqlen",
             lambda: rotary.apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 8]), max_seqlen=4)),
            (ValueError, "x.stride(-1)",
             lambda: rotary.apply_rotary_emb(x.transpose(2, 3)[..., :2, :], cos[:, :1], sin[:, :1], inplace=True)),
            (ValueError, "cos.requires_grad",
             lambda: rotary.apply_rotary_emb(x, cos.clone().requires_grad_(), sin)),
            (TypeError, "inplace", lambda: rotary.apply_rotary_emb(x, cos, sin, inplace=1)),
        ]
        assert_each_refused(self, cases)


class RopeTableOpTest(unittest.TestCase):
    def test_the_op_refuses_bad_arguments_by_name(self):
        x, cos = torch.randn(1, 4, 2, 8), torch.randn(4, 4)
        rows = torch.arange(4).unsqueeze(0)
        op = torch.ops.rotary.rope_table
        assert_each_refused(self, [
            (ValueError, "width", lambda: op(x, cos, cos, rows, 8, "half_split", "per_pair", False)),
            (ValueError, "layout", lambda: op(x, cos, cos, rows, 8, "diagonal", "pairs", False)),
            (ValueError, "rows.shape", lambda: op(x, cos, cos, rows[:, :3], 8, "half_split", "pairs", False)),
            (ValueError, "rows.dtype", lambda: op(x, cos, cos, rows.int(), 8, "half_split", "pairs", False)),
            (ValueError, "cos.shape[-1]", lambda: op(x, cos, cos, rows, 8, "half_split", "features", False)),
            (ValueError, "rows[3]", lambda: op(x, cos[:3], cos[:3], rows, 8, "half_split", "pairs", False)),
            (ValueError, "x.dim()", lambda: op(x[0], cos, cos, rows, 8, "half_split", "pairs", False)),
        ])

    def test_rope_freqs_refuses_a_negative_length(self):
        with self.assertRaises(ValueError) as caught:
            torch.ops.rotary.rope_freqs('{"head_dim": 8}', -1)
        self.assertIn("seq_len", str(caught.exception))


class ApplyRotaryPosEmbTest(unittest.TestCase):
    def test_matches_transformers_formula_in_every_dtype_and_form(self):
        torch.manual_seed(4)
        B, Hq, Hk, S, D = 2, 4, 2, 9, 32
        for dtype in DTYPES:
            cos2, sin2 = tables(S, D, dtype=dtype)
            cos_full, sin_full = torch.cat([cos2, cos2], -1), torch.cat([sin2, sin2], -1)  # [S, D] as transformers
            for unsqueeze_dim in (1, 2):
                with self.subTest(dtype=dtype, unsqueeze_dim=unsqueeze_dim):
                    shape_q = (B, Hq, S, D) if unsqueeze_dim == 1 else (B, S, Hq, D)
                    shape_k = (B, Hk, S, D) if unsqueeze_dim == 1 else (B, S, Hk, D)
                    q, k = torch.randn(shape_q).to(dtype), torch.randn(shape_k).to(dtype)
                    cos, sin = cos_full.unsqueeze(0).expand(B, S, D), sin_full.unsqueeze(0).expand(B, S, D)
                    qe, ke = rotary.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
                    self.assertEqual(qe.shape, q.shape)
                    self.assertEqual(ke.shape, k.shape)
                    self.assertTrue(qe.is_contiguous())
                    for ours, t in ((qe, q), (ke, k)):
                        exact = transformers_reference(t.double(), cos.double(), sin.double(), unsqueeze_dim)
                        same = transformers_reference(t, cos, sin, unsqueeze_dim)
                        assert_within_flash_attn_tolerance(self, ours, same, exact, "transformers formula")

    def test_position_ids_partial_rotation_and_tables_whose_halves_differ(self):
        torch.manual_seed(5)
        q, k = torch.randn(2, 3, 6, 20, dtype=torch.float64), torch.randn(2, 1, 6, 20, dtype=torch.float64)
        cos, sin = torch.randn(30, 12, dtype=torch.float64), torch.randn(30, 12, dtype=torch.float64)  # any table
        ids = torch.tensor([[0, 3, 7, 8, 29, 1], [5, 5, 5, 6, 7, 8]])
        qe, ke = rotary.apply_rotary_pos_emb(q, k, cos, sin, position_ids=ids)
        self.assertTrue(torch.allclose(qe, transformers_reference(q, cos[ids], sin[ids]), atol=1e-12))
        self.assertTrue(torch.allclose(ke, transformers_reference(k, cos[ids], sin[ids]), atol=1e-12))
        qe, ke = rotary.apply_rotary_pos_emb(q, k, cos[:6], sin[:6])  # no ids: rows 0..S-1
        self.assertTrue(torch.allclose(qe, transformers_reference(q, cos[:6].expand(2, 6, 12),
                                                                  sin[:6].expand(2, 6, 12)), atol=1e-12))

    def test_gradients_in_float64(self):
        torch.manual_seed(6)
        cos, sin = torch.randn(1, 5, 8, dtype=torch.float64), torch.randn(1, 5, 8, dtype=torch.float64)
        q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(1, 1, 5, 8, dtype=torch.float64, requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(lambda a, b: rotary.apply_rotary_pos_emb(a, b, cos, sin), (q, k)))

    def test_bad_input_names_the_argument(self):
        q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
        cos, sin = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
        cases = [
            (ValueError, "unsqueeze_dim", lambda: rotary.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)),
            (ValueError, "k.shape", lambda: rotary.apply_rotary_pos_emb(q, k[:, :, :3], cos, sin)),
            (ValueError, "cos.shape", lambda: rotary.apply_rotary_pos_emb(q, k, cos[:, :3], sin[:, :3])),
            (ValueError, "cos.shape[-1]",
             lambda: rotary.apply_rotary_pos_emb(q, k, torch.randn(1, 4, 10), torch.randn(1, 4, 10))),
            (ValueError, "position_ids",
             lambda: rotary.apply_rotary_pos_emb(q, k, cos[0], sin[0], position_ids=torch.tensor([[0, 1, 2, 4]]))),
            (ValueError, "k.dtype", lambda: rotary.apply_rotary_pos_emb(q, k.long(), cos, sin)),
            (TypeError, "sin", lambda: rotary.apply_rotary_pos_emb(q, k, cos, [1.0])),
        ]
        assert_each_refused(self, cases)


if __name__ == "__main__":
    unittest.main()
