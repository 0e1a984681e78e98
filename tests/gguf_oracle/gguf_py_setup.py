"""tests/gguf_oracle/gguf_py_setup.py: how the GGUF oracles (test_gguf_oracle.py, test_ggml_quants_oracle.py) find
gguf-py, llama.cpp's own Python package, and numpy.

gguf-py is not part of this repository: its path comes from ROTARY_GGUF_PY (a llama.cpp source tree's gguf-py
directory; docs/checkpoints.md says how to get the one llama.cpp release we compare with, from the node-llama-cpp
npm package), else the llama.cpp source scripts/setup.sh unpacks beside this file (tests/gguf_oracle/llama.cpp).
Without either, or without numpy, an oracle prints why and exits 77, which ctest reports as skipped - never as
passed. A wrong path is a failure (exit 1).
"""
import os
import sys

SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def import_gguf_py():
    """(gguf, numpy, the gguf-py directory), or the process ends as the module docstring says."""
    installed = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama.cpp", "gguf-py")
    gguf_py = os.environ.get("ROTARY_GGUF_PY", "") or (installed if os.path.isdir(installed) else "")
    if not gguf_py:
        skip("ROTARY_GGUF_PY is not set and scripts/setup.sh has not unpacked llama.cpp's source into "
             "tests/gguf_oracle/llama.cpp (the path of a llama.cpp gguf-py directory; docs/checkpoints.md)")
    try:
        import numpy
    except ImportError:
        skip(f"numpy is missing for {sys.executable} (Debian: python3-numpy)")
    if not os.path.isfile(os.path.join(gguf_py, "gguf", "__init__.py")):
        print(f"FAILED: ROTARY_GGUF_PY = {gguf_py!r} is not a gguf-py directory (no gguf/__init__.py)")
        sys.exit(1)
    sys.path.insert(0, gguf_py)
    import gguf
    return gguf, numpy, gguf_py


def start_oracle(usage):
    """An oracle's one argument (the tool under test; usage and exit 2 otherwise) and import_gguf_py()'s three."""
    if len(sys.argv) != 2:
        print(f"usage: {usage}", file=sys.stderr)
        sys.exit(2)
    return (sys.argv[1], *import_gguf_py())
