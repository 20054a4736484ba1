#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the GPU tests, compute-sanitizer memcheck,
# racecheck, initcheck and synccheck, and the kernel timing programs.
#   tests/gpu/run_on_device.sh BIN_DIR [tests|sanitize|timing|all] [SANITIZE_SPEC]
# SANITIZE_SPEC is the Catch2 test spec the sanitizers run: "[sanitize]" (default, the reduced set of small cases
# of every kernel family) or "~[large]~[load]" (every case but the > 2^31-element and T = 32768 x E = 4096 shapes
# and the minute-long load cases).
# SANITIZE_TIMEOUT (seconds per executable and tool, default 240) bounds each sanitizer run; SANITIZE_TOOLS (default
# "memcheck racecheck initcheck synccheck") and PROGRAMS (a glob, default "moekit_gpu_test_*") narrow a run.
# Output folder: $OUT (default /tmp/moekit-device-out): summary.txt, device.txt and every log packed into logs.tgz
# (one archive instead of a file per program).
# BIN_DIR holds the moekit_gpu_test_* and moekit_time_* executables (a build dir's tests/gpu and bench/micro
# outputs), or tests/gpu/stage_for_device.sh's executables.txz of them, unpacked here first.
set -uo pipefail
bin=${1:?usage: run_on_device.sh BIN_DIR [tests|sanitize|timing|all]}
what=${2:-all}
spec=${3:-[sanitize]}
sanitize_timeout=${SANITIZE_TIMEOUT:-240}
out=${OUT:-/tmp/moekit-device-out}
mkdir -p "$out"
if [[ -f $bin/executables.txz ]]; then
  tar -xJf "$bin/executables.txz" -C "$bin"
  rm "$bin/executables.txz"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
status=0
summary=()
# The kernels that read outputs stored by TMA (see the initcheck NOTE below).
tma_output_readers='routing::router_(forward|backward)_kernel|routing::<unnamed>::(row_lse|column_sums|gradient)_kernel|'
tma_output_readers+='sparse_ffn::group_energy_topk_kernel|reduce::combine_kernel'
# The kernel of every report in sanitizer log $1 (the "at" line under each report's header), its offset dropped.
report_kernels() {
  grep -E -A1 '^========= [A-Z]' "$1" | grep -E '^=========     at ' | sed -E 's/^=========     at //; s/\+0x[0-9a-f]+//'
}
if [[ $what == tests || $what == all ]]; then
  # The test programs run at once (the GPU has room for all of them; none of them times anything).
  pids=()
  for exe in "$bin"/${PROGRAMS:-moekit_gpu_test_*}; do
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
  for exe in "$bin"/${PROGRAMS:-moekit_gpu_test_*}; do
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
      log="$out/sanitize_${tool}_$(basename "$exe").log"
      # initcheck prints every report, without backtraces, so the summary below counts all of them by kernel.
      extra=()
      [[ $tool == initcheck ]] && extra=(--show-backtrace no --print-limit 100000000)
      timeout "$sanitize_timeout" "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 1 "$exe" "$spec" \
        >"$log" 2>&1 &
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
      [[ -z $(grep -E 'access at ' "$log" | grep -v 'access at nvjet_') ]]; then
      summary+=("$tool $(basename "$exe"): hazards reported only inside cuBLAS (nvjet_*) kernels:")
      summary+=("$(grep -E 'access at ' "$log" | sed -E 's/.*access at ([A-Za-z0-9_]+).*/    \1/' | sort | uniq -c)")
      rc=0
    fi
    # NOTE: initcheck does not see stores made by TMA (cp.async.bulk.tensor): cuBLASLt's kernels store so (every
    # element a cuBLASLt matmul writes is reported uninitialized when a later kernel reads it; tests/gpu/
    # initcheck_cublaslt/ shows it with cuBLASLt alone: m x n reports for an m x n product), and so do the grouped
    # GEMM's TMA-store epilogues. The kernels that read such outputs: the router's and the aux losses' (the router
    # linear's logits), the group-energy kernel (the gate pre-activations) and the combine (the down-projection's
    # rows). The router and aux-loss kernels are clean where the logits come from cudaMemcpy (the router test), the
    # combine in the reduce test likewise, and the layers' combine reports vanish with MOEKIT_GEMM_PATH=mma (whose
    # stores are the threads'). So a log counts as clean when its tests pass and every report lies in one of those
    # kernels.
    if ((rc != 0)) && [[ $tool == initcheck ]] && grep -qE '^All tests passed' "$log" &&
      [[ -z $(report_kernels "$log" | grep -vE "$tma_output_readers") ]]; then
      summary+=("$tool $(basename "$exe"): reports only on reads of outputs stored by TMA:")
      summary+=("$(report_kernels "$log" | sed -E 's/^(void )?([A-Za-z0-9_:]+).*/    \2/' | sort | uniq -c)")
      rc=0
    fi
    summary+=("$tool $(basename "$exe") ($spec): rc=$rc $(grep -E '^(All tests passed|test cases:)|ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')")
    if ((rc != 0)); then
      status=1
      tail -8 "$log"
      # Where the reports are: the kernel and report kind of each, counted.
      summary+=("$(report_kernels "$log" | cut -c1-220 | sort | uniq -c | sort -rn | head -12)")
    fi
  done
fi
if [[ $what == timing || $what == all ]]; then
  for exe in "$bin"/moekit_time_*; do
    echo "== $(basename "$exe")"
    "$exe" 2>&1 | tee "$out/$(basename "$exe").log" | tail -25
  done
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
(cd "$out" && tar -czf logs.tgz ./*.log && rm -f ./*.log)
exit $status
