#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: moekit-bench and torch._grouped_mm alone (torch_bench.py
# --grouped-mm-alone: rows gathered beforehand, no epilogue) on a grouped-GEMM config's cases, the two taking turns
# ROUNDS times (default 5), so that the chip's clock and power state over the minutes of the run (it steps by ~5%
# under the power cap) spreads over both — how a ratio to torch._grouped_mm near 1 is judged beyond one run of
# each.
#   bench/device/compare_grouped_mm.sh BENCH CONFIG REGEX
# BENCH: a moekit-bench executable; CONFIG: a bench config of gemm cases; REGEX: both tools' --filter. TORCH_BENCH
# (default "python3 bench/compare/torch_bench.py") runs the PyTorch side. Output folder: $OUT (default
# /tmp/moekit-grouped-mm-out). stdout and grouped_mm.md there: per case
# the median TFLOP/s of each tool over the rounds, the ratio of the medians (moekit's rate / grouped_mm's: > 1,
# moekit faster) and the lowest and highest ratio of one round (both tools' runs of the same round);
# grouped_mm.tgz there: every run's JSON and log.
set -uo pipefail
bench=$(realpath "${1:?usage: compare_grouped_mm.sh BENCH CONFIG REGEX}")
config=${2:?usage: compare_grouped_mm.sh BENCH CONFIG REGEX}
filter=${3?usage: compare_grouped_mm.sh BENCH CONFIG REGEX}
rounds=${ROUNDS:-5}
torch_bench=${TORCH_BENCH:-python3 bench/compare/torch_bench.py}
out=${OUT:-/tmp/moekit-grouped-mm-out}
runs=$(mktemp -d)
mkdir -p "$out"
for ((r = 0; r < rounds; ++r)); do
  "$bench" "$config" --backend cuda --filter "$filter" --out "$runs/moekit_r$r.json" >"$runs/moekit_r$r.log" 2>&1
  echo "round $r: moekit-bench exit $?" >&2
  $torch_bench "$config" --mode eager --grouped-mm-alone --filter "$filter" --out "$runs/torch_r$r.json" \
    >"$runs/torch_r$r.log" 2>&1
  echo "round $r: torch_bench exit $?" >&2
done
python3 - "$runs" "$rounds" <<'PY' | tee "$out/grouped_mm.md"
import json, os, statistics, sys

runs, rounds = sys.argv[1], int(sys.argv[2])
moekit, alone, order = {}, {}, []  # case -> {round: TFLOP/s}


def cases(path):
    return json.load(open(path))["cases"] if os.path.exists(path) else []


for r in range(rounds):
    for case in cases(os.path.join(runs, f"moekit_r{r}.json")):
        if case["name"] not in order:
            order.append(case["name"])
        if case.get("status") == "ok" and case.get("tflops"):
            moekit.setdefault(case["name"], {})[r] = case["tflops"]
    for case in cases(os.path.join(runs, f"torch_r{r}.json")):
        timing = case.get("grouped_mm_alone") if case.get("status") == "ok" else None
        if timing and timing.get("tflops"):
            alone.setdefault(case["name"], {})[r] = timing["tflops"]
print("| case | moekit TFLOP/s | grouped_mm TFLOP/s | moekit / grouped_mm | per round |")
print("|---|---|---|---|---|")
for name in order:
    mine, theirs = moekit.get(name, {}), alone.get(name, {})
    m = statistics.median(mine.values()) if mine else None
    g = statistics.median(theirs.values()) if theirs else None
    paired = [mine[r] / theirs[r] for r in mine if r in theirs]
    print(f"| {name} | {f'{m:.0f}' if m else '-'} | {f'{g:.0f}' if g else '-'} | "
          f"{f'{m / g:.3f}' if m and g else '-'} | "
          f"{f'{min(paired):.3f}–{max(paired):.3f}' if paired else '-'} |")
print()
print(f"medians of {rounds} rounds, moekit-bench and torch._grouped_mm alone taking turns")
PY
tar -czf "$out/grouped_mm.tgz" -C "$runs" .
