#!/usr/bin/env bash
# The Python package as a user gets it (docs/python-package.md): a fresh virtual environment over Debian's python3
# (--system-site-packages: its torch), `pip wheel` and `pip install` of the repository with no index (PIP_NO_INDEX:
# nothing downloaded), the wheel's and the install's files checked (the op library and every module of python/rotary
# in them, a platform wheel, no RUNPATH into the build tree), then every tests/python/test_*.py run by the venv's
# python from a folder outside the repository with no PYTHONPATH and no ROTARY_TORCH_LIB: `import rotary` and the
# library it loads must be the installed ones. Prints a summary and its time; exits non-zero when anything fails.
# The build is setup.py's (build/python-package, ccache); scripts/test.sh runs this as its "python package" phase.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${ROTARY_PYTHON:-/usr/bin/python3}"  # Debian's, with python3-torch
start=$SECONDS
tmp="$(mktemp -d "${TMPDIR:-/tmp}/rotary-python-package.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PYTHONPATH ROTARY_TORCH_LIB PYTHONHOME PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS
version="$(sed -nE 's/^\s*project\(\s*rotary\s+VERSION\s+([0-9.]+).*/\1/p' "$root/CMakeLists.txt")"
fail() { echo "python package: FAILED: $*" >&2; exit 1; }

echo "== venv ($python -m venv --system-site-packages $tmp/venv)"
"$python" -m venv --system-site-packages "$tmp/venv"
venv="$tmp/venv"
py="$venv/bin/python"

echo "== pip wheel $root (no index)"
phase=$SECONDS
"$py" -m pip wheel --wheel-dir "$tmp/wheels" "$root"
wheel_s=$((SECONDS - phase))
wheels=("$tmp"/wheels/rotary-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || fail "pip wheel made no single rotary wheel: ${wheels[*]}"
echo "wheel: $(basename "${wheels[0]}")"
# The wheel holds the op library, the core library it links and every module of python/rotary; it is a platform
# wheel (not py3-none-any: it carries a compiled library) and says so (Root-Is-Purelib: false).
(cd "$root/python" && ls rotary/*.py) > "$tmp/modules.txt"
"$py" - "${wheels[0]}" "$tmp/modules.txt" "$version" <<'EOF' || fail "the wheel's contents"
import sys, zipfile
wheel, modules, version = sys.argv[1], open(sys.argv[2]).read().split(), sys.argv[3]
names = set(zipfile.ZipFile(wheel).namelist())
want = ["rotary/lib/librotary_torch.so", "rotary/lib/librotary.so.0"] + modules
missing = [n for n in want if n not in names]
assert not missing, f"not in {wheel}: {missing}"
assert not wheel.endswith("-none-any.whl") and f"rotary-{version}-" in wheel, f"{wheel}: not a platform wheel of {version}"
meta = zipfile.ZipFile(wheel).read(f"rotary-{version}.dist-info/WHEEL").decode()
assert "Root-Is-Purelib: false" in meta, meta
print(f"wheel: {len(want)} expected files present ({', '.join(want[:2])}, {len(modules)} modules), Root-Is-Purelib: false")
EOF

echo "== pip install $root (no index)"
phase=$SECONDS
"$py" -m pip install "$root"
install_s=$((SECONDS - phase))
# What pip installed (its RECORD): the same files, under the venv's site-packages.
"$py" -m pip show -f rotary > "$tmp/show.txt"
cat "$tmp/show.txt"
grep -q "^Version: $version\$" "$tmp/show.txt" || fail "pip show: not version $version"
for f in rotary/lib/librotary_torch.so rotary/lib/librotary.so.0 $(cat "$tmp/modules.txt"); do
  grep -qE "^ +$f\$" "$tmp/show.txt" || fail "pip show -f rotary does not list $f"
done
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
lib="$site/rotary/lib/librotary_torch.so"
[ -f "$lib" ] && [ -f "$site/rotary/lib/librotary.so.0" ] || fail "no $lib or librotary.so.0 beside it"
# The libraries find each other by $ORIGIN and the system's libtorch, Highway and OpenMP on the loader's path: no
# RPATH / RUNPATH into the build tree (or anywhere in the repository).
for so in "$lib" "$site/rotary/lib/librotary.so.0"; do
  paths="$(readelf -d "$so" | sed -nE 's/.*\((RPATH|RUNPATH)\).*\[(.*)\]/\2/p')"
  echo "$(basename "$so"): RUNPATH [${paths}]"
  case "$paths" in *"$root"*|*build*) fail "$so: RUNPATH [$paths] points into the build tree" ;; esac
done

# Outside the repository, no PYTHONPATH, no ROTARY_TORCH_LIB: the venv's package and its libraries, nothing else.
mkdir -p "$tmp/run"
cd "$tmp/run"
echo "== the installed package"
"$py" - "$venv" "$version" <<'EOF' || fail "import rotary from the venv"
import os, sys
from pathlib import Path
venv, version = Path(sys.argv[1]).resolve(), sys.argv[2]
import rotary
from rotary import _load
here = Path(rotary.__file__).resolve()
assert venv in here.parents, f"rotary imported from {here}, not from the venv {venv}"
packaged = here.parent / "lib" / "librotary_torch.so"
assert Path(_load.library_path()) == packaged, f"library_path() = {_load.library_path()}, not {packaged}"
# The libraries this process mapped: the packaged op library and the packaged librotary, no other copy.
maps = {line.split()[-1] for line in open("/proc/self/maps") if "librotary" in line}
assert maps == {str(packaged), str(packaged.parent / "librotary.so.0")}, f"mapped: {sorted(maps)}"
got = _load.library_version()
assert isinstance(got, str) and got == version, f"torch.ops.rotary.version() = {got!r}, CMakeLists.txt says {version}"
print(f"rotary {got} from {here.parent}, libraries {sorted(maps)}")
EOF

echo "== tests/python in the venv (from $tmp/run)"
# One process per file, as ctest ran them; discover with tests/python as its top folder lets a test import another
# by module name (test_rope_op's helpers). tests/python holds no `rotary`, so the package still comes from the venv.
phase=$SECONDS
files=0 failed=0 ran=0 bad_cases=0 skipped=0
results=()
for test in "$root"/tests/python/test_*.py; do
  name="$(basename "$test")"
  files=$((files + 1))
  file_status=0
  "$py" -m unittest discover -v -s "$root/tests/python" -t "$root/tests/python" -p "$name" > "$tmp/test.log" 2>&1 ||
    file_status=$?
  cat "$tmp/test.log"
  n=$(sed -nE 's/^Ran ([0-9]+) tests? in .*/\1/p' "$tmp/test.log" | tail -1)
  f=$(sed -nE 's/^FAILED \((.*)\)$/\1/p' "$tmp/test.log" | grep -oE '(failures|errors)=[0-9]+' |
      awk -F= '{s += $2} END {print s + 0}' || true)
  s=$(grep -oE 'skipped=[0-9]+' "$tmp/test.log" | tail -1 | cut -d= -f2 || true)
  ran=$((ran + ${n:-0})) bad_cases=$((bad_cases + ${f:-0})) skipped=$((skipped + ${s:-0}))
  if [ $file_status -ne 0 ] || [ "${n:-0}" -eq 0 ]; then
    failed=$((failed + 1))
    results+=("$(printf 'FAILED  %-40s %s tests (exit %d)' "$name" "${n:-0}" "$file_status")")
  else
    results+=("$(printf 'passed  %-40s %s tests' "$name" "$n")")
  fi
done
tests_s=$((SECONDS - phase))

echo "== python package summary"
printf '%s\n' "${results[@]}"
echo "unittest cases: $ran run, $bad_cases failed or errored, $skipped skipped"
echo "times: pip wheel ${wheel_s} s, pip install ${install_s} s, tests ${tests_s} s, total $((SECONDS - start)) s"
# In ctest's words, so scripts/test.sh's closing line counts these files as it counted them under ctest.
echo "python package: $failed tests failed out of $files"
[ $failed -eq 0 ]
