"""rotary: rotary position embeddings (RoPE, RoPER, ReRoPE; softmax and linear attention) as PyTorch ops backed by
the rotary C++ core.

Install with `python3 -m pip install .` from the repository (docs/python-package.md); the package loads its
librotary_torch.so with torch.ops.load_library (ROTARY_TORCH_LIB names another build). docs/python.md lists every
function and op.
"""

try:
    import torch as _torch
except ImportError as _e:  # no install_requires (setup.py): say what is missing and where it comes from
    raise ImportError("rotary needs PyTorch, the one its op library was built against: Debian's python3-torch "
                      "(apt install python3-torch; in a venv, create it with --system-site-packages)") from _e

from ._load import library_path as _library_path
from ._load import library_version as _library_version

_torch.ops.load_library(_library_path())
__version__ = _library_version()  # the version the loaded library was built from (CMakeLists.txt's project())

from . import _meta  # noqa: E402,F401  (meta kernels: meta tensors and torch.compile)
from .caches import KvCache, MemoryKvCache  # noqa: E402,F401
from .embedding import RotaryEmbedding, apply_rotary_emb, apply_rotary_pos_emb  # noqa: E402,F401
from .ops import attention, linear_attention, rope, rope_inverse  # noqa: E402,F401

# The package's public functions (docs/python.md lists their signatures; tests/python/test_signatures.py checks it).
__all__ = ["KvCache", "MemoryKvCache", "RotaryEmbedding", "apply_rotary_emb", "apply_rotary_pos_emb", "attention",
           "linear_attention", "rope", "rope_inverse"]
