import os
from pathlib import Path


def library_path() -> str:
    """Path of librotary_torch.so: $ROTARY_TORCH_LIB, else the repository's build/torch/."""
    env = os.environ.get("ROTARY_TORCH_LIB")
    if env:
        return env
    candidate = Path(__file__).resolve().parents[2] / "build" / "torch" / "librotary_torch.so"
    if not candidate.exists():
        raise ImportError(f"rotary: {candidate} not found; build it with `bash scripts/build.sh` "
                          "or set ROTARY_TORCH_LIB")
    return str(candidate)
