#!/usr/bin/env bash
# Runs on the GPU machine (the device tool) from the repository root: the GPU tests, compute-sanitizer memcheck
# and racecheck over the reduced set tagged [sanitize], and the kernel timing programs.
#   tests/gpu/run_on_device.sh BIN_DIR [tests|sanitize|timing|all]
# BIN_DIR holds the moekit_gpu_test_* and moekit_time_* executables (a build dir's tests/gpu and bench/micro
# outputs; tests/gpu/stage_for_device.sh copies them into one small folder that fits the device tool's carry).
set -uo pipefail
bin=${1:?usage: run_on_device.sh BIN_DIR [tests|sanitize|timing|all]}
what=${2:-all}
out=${OUT:-/tmp/moekit-device-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
status=0
summary=()
if [[ $what == tests || $what == all ]]; then
  for exe in "$bin"/moekit_gpu_test_*; do
    name=$(basename "$exe")
    "$exe" >"$out/$name.log" 2>&1
    rc=$?
    summary+=("tests     $name: rc=$rc $(grep -E '^(All tests passed|test cases:)' "$out/$name.log" | tail -1)")
    ((rc == 0)) || { status=1; tail -40 "$out/$name.log"; }
  done
fi
if [[ $what == sanitize || $what == all ]]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for exe in "$bin"/moekit_gpu_test_*; do
    name=$(basename "$exe")
    for tool in memcheck racecheck; do
      log="$out/sanitize_${tool}_$name.log"
      timeout 240 "$sanitizer" --tool "$tool" --error-exitcode 1 "$exe" "[sanitize]" >"$log" 2>&1
      rc=$?
      summary+=("$tool $name: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)")
      ((rc == 0)) || { status=1; tail -20 "$log"; }
    done
  done
fi
if [[ $what == timing || $what == all ]]; then
  for exe in "$bin"/moekit_time_*; do
    echo "== $(basename "$exe")"
    "$exe" 2>&1 | tee "$out/$(basename "$exe").log" | tail -25
  done
fi
printf '%s\n' "${summary[@]}"
exit $status
