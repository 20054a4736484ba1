#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root, with the build dir made here carried
# along (`carry: ["build"]`): the GPU tests, then compute-sanitizer memcheck and racecheck over them.
#   tests/gpu/run_on_device.sh [build-dir] [tests|sanitize|all]   (default: build all)
set -uo pipefail
build=${1:-build}
what=${2:-all}
out=${OUT:-/tmp/moekit-device-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
status=0
if [[ $what == tests || $what == all ]]; then
  ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$out/gpu_tests.log" || status=1
fi
if [[ $what == sanitize || $what == all ]]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for exe in "$build"/tests/gpu/moekit_gpu_test_*; do
    for tool in memcheck racecheck; do
      echo "== $tool $(basename "$exe")"
      # Reduced set: the sanitizers are ~100x slower, so tests tagged [large] are left out.
      "$sanitizer" --tool "$tool" --error-exitcode 1 "$exe" "~[large]" >"$out/sanitize_${tool}_$(basename "$exe").log" 2>&1 \
        && echo "   clean" || { echo "   FAILED (see log)"; tail -20 "$out/sanitize_${tool}_$(basename "$exe").log"; status=1; }
    done
  done
fi
exit $status
