"""rotary: rotary position embeddings (RoPE, RoPER, ReRoPE; softmax and linear attention) as PyTorch ops backed by
the rotary C++ core.

Loads librotary_torch.so (built by `bash scripts/build.sh`) with torch.ops.load_library. Set ROTARY_TORCH_LIB to
its path to use another build.
"""

import torch as _torch

from ._load import library_path as _library_path

_torch.ops.load_library(_library_path())

from .ops import attention, linear_attention, rope, rope_inverse  # noqa: E402,F401

# The package's public functions (docs/python.md lists their signatures; tests/python/test_signatures.py checks it).
__all__ = ["attention", "linear_attention", "rope", "rope_inverse"]
