#!/usr/bin/env bash
# The Python wheel, built and installed the way a user does (CTest install_python_wheel, label cpu):
#
#   python_wheel.sh PYTHON SOURCE_DIR WORK_DIR
#
# 1. a build virtualenv gets pyproject.toml's build requirements (scikit-build-core) from the package index;
# 2. `pip wheel` builds the wheel from SOURCE_DIR with the reference backend only (MOEKIT_CUDA=OFF keeps it quick);
# 3. a fresh virtualenv installs the wheel alone (--no-index: the wheel needs nothing else);
# 4. python_wheel_check.py runs there, outside the source tree.
# Everything stays under WORK_DIR; its pip cache and CMake build tree make a second run quicker.
# Exits 77 (CTest: skipped) where PYTHON cannot make a virtualenv (Debian: python3-venv), has no tomllib (Python
# 3.11+) to read pyproject.toml, or the build requirements cannot be installed (no network).
set -euo pipefail
python=$1 source=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

skip() {
  echo "install_python_wheel: $*: skipped"
  exit 77
}

command -v "$python" >/dev/null || skip "no $python"
mkdir -p "$work"
rm -rf "$work/build-env" "$work/env" "$work/dist"
export PIP_CACHE_DIR=$work/pip-cache PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
unset MOEKIT_LIBRARY PYTHONPATH

"$python" -m venv "$work/build-env" || skip "$python cannot make a virtualenv (Debian: apt-get install python3-venv)"
requires_lines=$("$work/build-env/bin/python" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))' "$source/pyproject.toml") ||
  skip "$python has no tomllib (Python 3.11+) to read pyproject.toml"
mapfile -t requires <<<"$requires_lines"
"$work/build-env/bin/pip" install --quiet "${requires[@]}" ||
  skip "the build requirements (${requires[*]}) cannot be installed from the package index"

"$work/build-env/bin/pip" wheel --no-build-isolation --no-deps --wheel-dir "$work/dist" \
  --config-settings=cmake.define.MOEKIT_CUDA=OFF --config-settings=build-dir="$work/cmake" "$source"
wheel=$(echo "$work"/dist/moekit-*.whl)

"$python" -m venv "$work/env"
"$work/env/bin/pip" install --quiet --no-index --no-deps "$wheel"
cd "$work"
"$work/env/bin/python" "$here/python_wheel_check.py" "$wheel"
