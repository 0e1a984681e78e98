"""`pip install .` / `pip wheel .`: the rotary Python package (python/rotary) with the op library built by CMake.

build_ext configures the repository with ROTARY_PYTHON_PACKAGE=ON (the core and the torch op library alone, no lab,
engine or tests) into build-python-package/ (Release, Ninja, ccache where installed), builds the target rotary_torch
and copies librotary_torch.so and the librotary.so.0 it links into the package as rotary/lib/. The version is
CMakeLists.txt's project(rotary VERSION ...), the one place it is written.

build-python-package/ sits beside build/, at the same depth, on purpose: ccache (CCACHE_BASEDIR, CMakeLists.txt)
hashes the compile commands with paths relative to the build folder, so only a folder as deep as build/ gets the
normal build's objects from the cache (build/python-package/ missed all 68: a 6.5 min compile instead of 25 s).

No pyproject.toml on purpose: with one, pip builds in an isolated environment and downloads setuptools and wheel
into it; without, pip uses the setuptools and wheel it runs with (Debian's python3-setuptools, python3-wheel), so
the install needs no network. Needs Debian's python3-torch / libtorch-dev, cmake and ninja (scripts/setup.sh).
docs/python-package.md has the details.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
BUILD_DIR = ROOT / "build-python-package"
# What goes into rotary/lib: the op library and the core library it links (by its soname, found through $ORIGIN).
PACKAGED_LIBRARIES = [("torch", "librotary_torch.so"), ("core", "librotary.so.0")]


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"^\s*project\(\s*rotary\s+VERSION\s+([0-9]+(?:\.[0-9]+){1,3})\b", text, flags=re.M)
    if not match:
        raise RuntimeError(f"{ROOT / 'CMakeLists.txt'}: no `project(rotary VERSION x.y.z ...)` line")
    return match.group(1)


class CleanBuild(build):
    """Starts the package's files from nothing each time: setuptools' build folder outlives a run, and a file left in
    it from an earlier one (a module since removed, a library no longer packaged) would go into the wheel."""

    def run(self):
        build_lib = Path(self.build_lib).resolve()
        if SETUPTOOLS_DIR.resolve() in build_lib.parents and build_lib.exists():
            shutil.rmtree(build_lib)
        super().run()


class CMakeLibrary(Extension):
    """The op library, built by CMake (no sources of its own for setuptools to compile)."""

    def __init__(self):
        super().__init__("rotary.lib.librotary_torch", sources=[])


class BuildWithCMake(build_ext):
    """Builds the target rotary_torch with CMake and copies the libraries into the package's lib/ folder."""

    def get_ext_filename(self, fullname):
        # librotary_torch.so as it is, not a CPython extension's name (torch.ops.load_library loads it). setuptools
        # asks with the full name (rotary/lib/librotary_torch.so) and with the last part alone.
        if fullname.split(".")[-1] == "librotary_torch":
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_outputs(self):
        # librotary.so.0 beside the op library (the wheel takes the whole build folder; this is for --record).
        outputs = super().get_outputs()
        return outputs + [str(Path(path).parent / name) for path in outputs if path.endswith("librotary_torch.so")
                          for _, name in PACKAGED_LIBRARIES[1:]]

    def copy_extensions_to_source(self):
        # `pip install -e .` (build_ext --inplace): setuptools copies librotary_torch.so into python/rotary/lib; the
        # library it links goes with it.
        inplace = ROOT / "python" / "rotary" / "lib"
        inplace.mkdir(exist_ok=True)
        super().copy_extensions_to_source()
        built = Path(self.build_lib) / "rotary" / "lib"
        for _, name in PACKAGED_LIBRARIES[1:]:
            self.copy_file(str(built / name), str(inplace / name))

    def build_extension(self, ext):
        if not isinstance(ext, CMakeLibrary):
            return super().build_extension(ext)
        for tool in ("cmake", "ninja"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"rotary: `{tool}` not found; install Debian's cmake and ninja-build "
                                   "(bash scripts/setup.sh installs every build dependency)")
        jobs = os.environ.get("ROTARY_JOBS") or str(os.cpu_count() or 1)
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        configure = ["cmake", "-S", str(ROOT), "-B", str(BUILD_DIR), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                     "-DROTARY_PYTHON_PACKAGE=ON", "-DROTARY_BUILD_LAB=OFF", "-DROTARY_BUILD_TESTS=OFF",
                     "-DROTARY_FUZZ=OFF", "-DROTARY_WITH_TORCH=ON", "-DROTARY_SANITIZE=OFF"]
        build = ["cmake", "--build", str(BUILD_DIR), "--target", "rotary_torch", "-j", jobs]
        for command in (configure, build):
            print("rotary:", " ".join(command), flush=True)
            subprocess.run(command, check=True)
        target_dir = Path(self.get_ext_fullpath(ext.name)).parent
        target_dir.mkdir(parents=True, exist_ok=True)
        for folder, name in PACKAGED_LIBRARIES:
            built = BUILD_DIR / folder / name
            if not built.exists():
                raise RuntimeError(f"rotary: the build made no {built}")
            # copyfile follows librotary.so.0's symlink: the wheel holds the file itself under the soname.
            shutil.copyfile(built.resolve(), target_dir / name)
            print(f"rotary: {built} -> {target_dir / name}", flush=True)


# setuptools' own folders (build/lib.*, build/bdist.*, rotary.egg-info) in the package build's folder, not in build/
# beside the CMake build or in python/. Except the egg-info of `pip install -e .` (setup.py develop), which must sit
# beside the package: python/rotary.egg-info (ignored by git), with the libraries copied into python/rotary/lib.
SETUPTOOLS_DIR = BUILD_DIR / "setuptools"
SETUPTOOLS_DIR.mkdir(parents=True, exist_ok=True)
OPTIONS = {"build": {"build_base": str(SETUPTOOLS_DIR)}}
if "develop" not in sys.argv:
    OPTIONS["egg_info"] = {"egg_base": str(SETUPTOOLS_DIR)}

setup(
    name="rotary",
    version=project_version(),
    description="Rotary position embeddings (RoPE, RoPER, ReRoPE) and attention as PyTorch ops over a C++20 core",
    python_requires=">=3.9",
    package_dir={"": "python"},
    packages=find_packages(where="python", include=["rotary", "rotary.*"]),
    # No install_requires: the op library is built against the libtorch on this machine and must be loaded by that
    # same torch (Debian's python3-torch), which pip cannot supply; a requirement would only make `pip wheel .` try to
    # build a torch wheel with no index. `import rotary` names the missing torch instead (python/rotary/__init__.py).
    ext_modules=[CMakeLibrary()],
    cmdclass={"build": CleanBuild, "build_ext": BuildWithCMake},
    zip_safe=False,
    options=OPTIONS,
)
