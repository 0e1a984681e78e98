"""The Python-visible signatures against docs/python.md: every schema the built library registers (the ops'
torch.ops.rotary.<op>.default._schema, every method of every torch.classes.rotary class, constructors included) and
the rotary package's functions must be listed there, as torch and inspect print them, and nothing else - a changed,
added or removed argument fails here until the page shows it. Also: an argument added to a class after callers
existed has a default, so those callers still run (MemoryKvCache without memory_storage)."""
import inspect
import re
import unittest
from pathlib import Path

import torch

import rotary

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
CLASS_PREFIX = "__torch__.torch.classes.rotary."


def documented():
    """Every line of the page's ```text blocks."""
    blocks = re.findall(r"^```text\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def registered():
    ops = sorted(str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("rotary::"))
    methods = sorted(str(s) for s in torch._C._jit_get_custom_class_schemas()
                     if len(s.arguments) > 0 and str(s.arguments[0].type).startswith(CLASS_PREFIX))
    functions = sorted(f"rotary.{name}{inspect.signature(getattr(rotary, name))}" for name in rotary.__all__)
    return ops, methods, functions


class SignaturesTest(unittest.TestCase):
    def test_the_page_lists_every_registered_schema_and_nothing_else(self):
        ops, methods, functions = registered()
        self.assertTrue(ops and methods and functions)
        want, doc = ops + methods + functions, documented()
        self.assertEqual(len(doc), len(set(doc)), "a line listed twice in docs/python.md")
        missing = sorted(set(want) - set(doc))
        stale = sorted(set(doc) - set(want))
        if missing or stale:
            self.fail("docs/python.md differs from the built library:\n  not in the page:\n    "
                      + "\n    ".join(missing) + "\n  in the page, not registered:\n    " + "\n    ".join(stale))

    def test_each_op_schema_is_its_default_overload(self):
        for line in registered()[0]:
            name = line[len("rotary::"):line.index("(")]
            self.assertEqual(str(getattr(torch.ops.rotary, name).default._schema), line)

    def test_memory_kv_cache_runs_with_the_arguments_before_memory_storage(self):
        inv = 1.0 / (100.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
        k, v, pos, q = torch.randn(12, 2, 16), torch.randn(12, 2, 16), torch.arange(12), torch.randn(4, 16)
        outs = []
        for args, kwargs in [((4, 2, 16, "exact", "rope", inv, 1.0, "half_split", 0, 0), {}),  # before memory_storage
                             ((4, 2, 16, "exact", "rope", inv), {}),
                             ((4, 2, 16, "exact", "rope", inv, 1.0, "half_split", 0, 0, "f32"), {}),
                             ((), dict(window=4, kv_heads=2, head_dim=16, policy="exact", mode="rope", inv_freq=inv,
                                       memory_storage="f32"))]:
            cache = torch.classes.rotary.MemoryKvCache(*args, **kwargs)
            cache.append(k, v, pos)
            outs.append(cache.decode(q, 11, 100)[0])
            self.assertGreater(cache.memory_size(), 0)
        for out in outs[1:]:
            self.assertTrue(torch.equal(out, outs[0]))


if __name__ == "__main__":
    unittest.main()
