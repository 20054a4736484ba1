#!/usr/bin/env bash
# Runs on the GPU machine (the device tool) from the repository root: the GPU tests, compute-sanitizer memcheck,
# racecheck and initcheck, and the kernel timing programs.
#   tests/gpu/run_on_device.sh BIN_DIR [tests|sanitize|timing|all] [SANITIZE_SPEC]
# SANITIZE_SPEC is the Catch2 test spec the sanitizers run: "[sanitize]" (default, the reduced set of small cases
# of every kernel family) or "~[large]" (every case but the > 2^31-element and T = 32768 x E = 4096 shapes).
# SANITIZE_TIMEOUT (seconds per executable and tool, default 240) bounds each sanitizer run.
# BIN_DIR holds the moekit_gpu_test_* and moekit_time_* executables (a build dir's tests/gpu and bench/micro
# outputs), or tests/gpu/stage_for_device.sh's executables.tgz of them, unpacked here first.
set -uo pipefail
bin=${1:?usage: run_on_device.sh BIN_DIR [tests|sanitize|timing|all]}
what=${2:-all}
spec=${3:-[sanitize]}
sanitize_timeout=${SANITIZE_TIMEOUT:-240}
out=${OUT:-/tmp/moekit-device-out}
mkdir -p "$out"
if [[ -f $bin/executables.tgz ]]; then
  tar -xzf "$bin/executables.tgz" -C "$bin"
  rm "$bin/executables.tgz"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
status=0
summary=()
if [[ $what == tests || $what == all ]]; then
  # The test programs run at once (the GPU has room for all of them; none of them times anything).
  pids=()
  for exe in "$bin"/moekit_gpu_test_*; do
    "$exe" >"$out/$(basename "$exe").log" 2>&1 &
    pids+=("$!:$exe")
  done
  for job in "${pids[@]}"; do
    IFS=: read -r pid exe <<<"$job"
    wait "$pid"
    rc=$?
    name=$(basename "$exe")
    summary+=("tests     $name: rc=$rc $(grep -E '^(All tests passed|test cases:)' "$out/$name.log" | tail -1)")
    ((rc == 0)) || { status=1; tail -40 "$out/$name.log"; }
  done
fi
if [[ $what == sanitize || $what == all ]]; then
  # Every (executable, tool) pair runs at once: the sanitizers' cost is mostly host-side instrumentation, and the
  # machine has 16 cores.
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  jobs=()
  for exe in "$bin"/moekit_gpu_test_*; do
    for tool in memcheck racecheck initcheck; do
      log="$out/sanitize_${tool}_$(basename "$exe").log"
      timeout "$sanitize_timeout" "$sanitizer" --tool "$tool" --error-exitcode 1 "$exe" "$spec" >"$log" 2>&1 &
      jobs+=("$!:$tool:$exe:$log")
    done
  done
  for job in "${jobs[@]}"; do
    IFS=: read -r pid tool exe log <<<"$job"
    wait "$pid"
    rc=$?
    # NOTE: racecheck reports hazards inside cuBLAS's own kernels (nvjet_*, run by the group-selection GEMM),
    # whose mbarrier/TMA synchronisation it cannot see; excluding them with --kernel-name-exclude skips running
    # them and breaks the test. So they run, and a log counts as clean when its tests pass and every reported
    # access lies in an nvjet kernel.
    if ((rc != 0)) && [[ $tool == racecheck ]] && grep -qE '^All tests passed' "$log" &&
      ! grep -E 'access at ' "$log" | grep -qv 'access at nvjet_'; then
      summary+=("$tool $(basename "$exe"): hazards reported only inside cuBLAS (nvjet_*) kernels:")
      summary+=("$(grep -E 'access at ' "$log" | sed -E 's/.*access at ([A-Za-z0-9_]+).*/    \1/' | sort | uniq -c)")
      rc=0
    fi
    summary+=("$tool $(basename "$exe") ($spec): rc=$rc $(grep -E '^(All tests passed|test cases:)|ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')")
    ((rc == 0)) || { status=1; tail -20 "$log"; }
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
