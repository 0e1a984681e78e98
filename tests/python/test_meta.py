"""The ops' meta kernels (python/rotary/_meta.py) give every output the shape, dtype and strides the CPU kernel
gives it, so meta tensors and torch.compile's fake tensors go through the ops; on torch >= 2.1, torch.compile with
fullgraph=True (no graph break) traces the fused ops and runs them to the eager result."""
import unittest

import torch

import rotary


def to_meta(args):
    return [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]


def outputs(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


class MetaKernelTest(unittest.TestCase):
    def cases(self):
        torch.manual_seed(0)
        q, k, v = torch.randn(2, 5, 4, 16), torch.randn(2, 5, 2, 16), torch.randn(2, 5, 2, 16)
        inv = rotary.RotaryEmbedding(16).inv_freq
        x = torch.randn(2, 4, 5, 16).transpose(1, 2)  # [B, S, H, D] seen through a [B, H, S, D] tensor
        cos, sin = torch.randn(5, 8), torch.randn(5, 8)
        rows = torch.arange(5).repeat(2, 1)
        out, lse = torch.ops.rotary.attention(q, k, v, None, None, True, 0.0, "rope", inv, 1.0, "half_split", False,
                                              0, 1.0, 0)
        return {
            "rope": (q, torch.arange(10).view(2, 5), inv, 1.0, "half_split", "forward"),
            "rope_table": (x, cos, sin, rows, 16, "half_split", "pairs", False),
            "attention": (q, k, v, None, None, True, 0.0, "rope", inv, 1.0, "half_split", False, 0, 1.0, 0),
            "attention_backward": (torch.randn_like(out), q, k, v, out, lse, None, None, True, 0.0, "rope", inv, 1.0,
                                   "half_split", False, 0, 1.0, 0),
            "linear_attention": (q[..., :2, :], k, torch.randn(2, 5, 2, 8), None, None, True, inv, 1.0,
                                 "half_split"),
            "linear_attention_backward": (torch.randn(2, 5, 2, 8), q[..., :2, :], k, torch.randn(2, 5, 2, 8), None,
                                          None, True, inv, 1.0, "half_split"),
        }

    def test_meta_outputs_match_the_cpu_kernels(self):
        for name, args in self.cases().items():
            with self.subTest(op=name):
                op = getattr(torch.ops.rotary, name)
                cpu, meta = outputs(op(*args)), outputs(op(*to_meta(args)))
                self.assertEqual(len(cpu), len(meta))
                for c, m in zip(cpu, meta):
                    self.assertEqual(m.device.type, "meta")
                    self.assertEqual((m.shape, m.dtype, m.stride()), (c.shape, c.dtype, c.stride()))

    def test_in_place_meta_returns_its_input(self):
        x = torch.empty(1, 5, 2, 16, device="meta")
        cos = torch.empty(5, 8, device="meta")
        rows = torch.empty(1, 5, dtype=torch.int64, device="meta")
        self.assertIs(torch.ops.rotary.rope_table_(x, cos, cos, rows, 16, "half_split", "pairs", False), x)

    @unittest.skipUnless(hasattr(torch, "compile") and hasattr(torch.library, "register_fake")
                         or hasattr(torch.library, "impl_abstract"),
                         "torch.compile with custom-op fake kernels needs torch >= 2.1 (the accelerator machine's)")
    def test_torch_compile_traces_the_ops_without_a_graph_break(self):
        torch.manual_seed(1)
        emb = rotary.RotaryEmbedding(16)
        q, k, v = torch.randn(1, 6, 4, 16), torch.randn(1, 6, 2, 16), torch.randn(1, 6, 2, 16)
        cos, sin = emb.cos_sin(6)

        def step(q, k, v):
            qr = torch.ops.rotary.rope_table(q, cos, sin, torch.arange(6).unsqueeze(0), 16, "half_split", "pairs",
                                             False)
            out, _ = torch.ops.rotary.attention(qr, k, v, None, None, True, 0.0, "rope", emb.inv_freq, 1.0,
                                                "half_split", False, 0, 1.0, 0)
            return out * 2

        compiled = torch.compile(step, fullgraph=True)
        self.assertTrue(torch.allclose(compiled(q, k, v), step(q, k, v)))


if __name__ == "__main__":
    unittest.main()
