"""Where the op library librotary_torch.so is, and the version it was built from (docs/python-package.md)."""
import os
from pathlib import Path

_NAME = "librotary_torch.so"
_BUILD_HINT = ("install the package with `python3 -m pip install .` from the repository (it builds and packages the "
               "library), build the repository with `bash scripts/build.sh`, or set ROTARY_TORCH_LIB to the path of a "
               f"built {_NAME}")


def _packaged() -> Path:
    """The library `pip install .` put into the package: rotary/lib/ beside this module."""
    return Path(__file__).resolve().parent / "lib" / _NAME


def _developer_build() -> Path:
    """The repository's own build (scripts/build.sh), when this module is the repository's python/rotary."""
    return Path(__file__).resolve().parents[2] / "build" / "torch" / _NAME


def library_path() -> str:
    """Path of librotary_torch.so, the first of: $ROTARY_TORCH_LIB (when set, it must exist); the packaged
    rotary/lib/librotary_torch.so (`pip install .`); the repository's build/torch/librotary_torch.so (the
    in-tree developer build). ImportError naming the three when none is there."""
    env = os.environ.get("ROTARY_TORCH_LIB")
    if env:
        if not Path(env).is_file():
            raise ImportError(f"rotary: ROTARY_TORCH_LIB={env} is not a file; point it at a built {_NAME}, or "
                              f"unset it to use the installed package's library or the repository's build")
        return env
    for candidate in (_packaged(), _developer_build()):
        if candidate.is_file():
            return str(candidate)
    raise ImportError(f"rotary: {_NAME} not found; tried $ROTARY_TORCH_LIB (not set), {_packaged()} (the "
                      f"installed package's) and {_developer_build()} (the repository's build); {_BUILD_HINT}")


def library_version() -> str:
    """The project version the loaded library was built from (torch.ops.rotary.version(); CMakeLists.txt's
    project(rotary VERSION ...)). Call it after the library is loaded (importing rotary loads it)."""
    import torch

    return torch.ops.rotary.version()
