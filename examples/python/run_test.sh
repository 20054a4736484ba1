#!/usr/bin/env bash
# Runs test_moekit.py (or the script given, with the arguments after it) with the first Python that can import
# torch: $MOEKIT_PYTHON if set (CMake passes its cache variable, by default .ci/install-deps' virtualenv), else
# python3 on PATH, else /usr/bin/python3 (Debian's python3-torch installs there, and a PATH may put another python3
# first). The script exits 77 where torch cannot be imported; then the next
# Python is tried. Exits 77, which CTest reports as skipped, when none can.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script=${1:-$here/test_moekit.py}
shift || true

candidates=("${MOEKIT_PYTHON:-}" python3 /usr/bin/python3)
for python in "${candidates[@]}"; do
  if [[ -n $python ]] && command -v "$python" >/dev/null; then
    "$python" "$script" "$@"
    status=$?
    if ((status != 77)); then
      exit "$status"
    fi
  fi
done
echo "run_test.sh: no Python here imports torch (tried: ${candidates[*]}): the PyTorch tests are skipped"
exit 77
