#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: Nsight Compute on the grouped GEMM kernels of gemm.json cases.
#   bench/device/profile_gemm.sh BENCH CASE [CASE ...]
# BENCH: a moekit-bench executable; CASE: a case name of CONFIG (default bench/configs/gemm.json). Each case runs once per entry of
# PATHS (MOEKIT_GEMM_PATH values, default "mma wgmma"), and ncu profiles the first launch of the case's tile kernel
# (kernel names matching KERNELS, default "grouped_gemm") with its default clocks left alone (--clock-control none).
# stdout: per case and path, the lines that say where the time goes (duration, throughputs, grid, stalls) and
# the stall samples by kernel region (stall_regions.py: the wgmma kernel's consumer mainloop and epilogue,
# producer, barrier-wait stubs);
# Output folder: $OUT (default /tmp/moekit-profile-out); profile.tgz there: every report (.ncu-rep, its details page as text, its SASS source page with the stall samples
# of each instruction as CSV).
set -uo pipefail
bench=$(realpath "${1:?usage: profile_gemm.sh BENCH CASE [CASE ...]}")
shift
paths=${PATHS:-mma wgmma}
kernels=${KERNELS:-grouped_gemm}
config=${CONFIG:-bench/configs/gemm.json}
out=${OUT:-/tmp/moekit-profile-out}
reports=$(mktemp -d)
mkdir -p "$out"
for case_name in "$@"; do
  for path in $paths; do
    report="$reports/${path}_${case_name}"
    MOEKIT_GEMM_PATH=$path timeout 150 ncu --clock-control none -k "regex:$kernels" -c 1 -o "$report" \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section SourceCounters --import-source no \
      --metrics lts__t_bytes.sum.per_second,smsp__inst_executed.sum \
      "$bench" "$config" --backend cuda --filter "^${case_name}\$" >"$report.log" 2>&1
    ncu -i "$report.ncu-rep" --page details >"$report.txt" 2>&1
    # Per SASS instruction: its stall samples by reason (the columns of the source page).
    ncu -i "$report.ncu-rep" --page source --print-source sass --csv >"$report.sass.csv" 2>&1
    echo "== $case_name, MOEKIT_GEMM_PATH=$path"
    grep -E '^\s+(Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Grid Size|Cluster Size|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued Instruction|lts__t_bytes|smsp__inst_executed)' \
      "$report.txt" | sed 's/  */ /g'
    grep -E '^\s+grouped_gemm|^\s+void moekit' "$report.txt" | head -1 | cut -c1-160
    python3 "$(dirname "${BASH_SOURCE[0]}")/stall_regions.py" "$report.sass.csv" --top 8
  done
done
tar -czf "$out/profile.tgz" -C "$reports" .
