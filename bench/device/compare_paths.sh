#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: one bench config under several grouped GEMM kernel paths, side
# by side — how a kernel variant is judged before it becomes a default.
#   bench/device/compare_paths.sh BENCH CONFIG [REGEX]
# BENCH: a moekit-bench executable; CONFIG: a bench config (e.g. bench/configs/gemm.json); REGEX: moekit-bench's
# --filter (default: every case). PATHS: the MOEKIT_GEMM_PATH values, one run each, in this order (default
# "mma wgmma"). Output folder: $OUT (default /tmp/moekit-paths-out). stdout and paths.md there: a Markdown table of each case's TFLOP/s (or GB/s) per path, its ratio to
# the first path, the cuBLAS baseline of the first run, and the kernel each path chose (`kernel_config`);
# paths.tgz there: every run's JSON and log.
set -uo pipefail
bench=$(realpath "${1:?usage: compare_paths.sh BENCH CONFIG [REGEX]}")
config=${2:?usage: compare_paths.sh BENCH CONFIG [REGEX]}
filter=${3:-}
paths=${PATHS:-mma wgmma}
out=${OUT:-/tmp/moekit-paths-out}
runs=$(mktemp -d)
mkdir -p "$out"
jsons=()
for path in $paths; do
  args=("$config" --backend cuda --out "$runs/$path.json")
  [[ -n $filter ]] && args+=(--filter "$filter")
  MOEKIT_GEMM_PATH=$path "$bench" "${args[@]}" >"$runs/$path.log" 2>&1
  echo "MOEKIT_GEMM_PATH=$path: moekit-bench exit $?" >&2
  [[ -f $runs/$path.json ]] && jsons+=("$runs/$path.json")
done
python3 - "${jsons[@]}" <<'EOF' | tee "$out/paths.md"
import json, os, sys

runs = [(os.path.basename(f)[:-5], {c["name"]: c for c in json.load(open(f))["cases"]}) for f in sys.argv[1:]]
if not runs:
    sys.exit("no run wrote its JSON (see the logs in paths.tgz)")
first_path, first = runs[0]


def rate(case):
    if case is None or case.get("status") != "ok":
        return None
    return case.get("tflops") or case.get("gbps")


def kernel(case):
    chosen = (case or {}).get("kernel_config") or []
    return "; ".join(line.rsplit(": ", 1)[-1] for line in chosen) or "-"


head = ["case"] + [p for p, _ in runs] + [f"{p} / {first_path}" for p, _ in runs[1:]] + ["cuBLAS"]
head += [f"kernel ({p})" for p, _ in runs]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for name, case in first.items():
    rates = [rate(r.get(name)) for _, r in runs]
    cells = [name] + ["-" if x is None else f"{x:.0f}" for x in rates]
    cells += ["-" if x is None or rates[0] in (None, 0) else f"{x / rates[0]:.2f}" for x in rates[1:]]
    baseline = (case.get("baseline") or {}).get("tflops")
    cells.append("-" if baseline is None else f"{baseline:.0f}")
    cells += [kernel(r.get(name)) for _, r in runs]
    print("| " + " | ".join(cells) + " |")
EOF
tar -czf "$out/paths.tgz" -C "$runs" .
