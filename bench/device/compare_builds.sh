#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: one bench config under two or more moekit-bench builds, the
# builds taking turns ROUNDS times (default 3) so that clock and thermal drift over the minutes of the run spreads
# over all of them; each case's rate is the median of its rounds — how a kernel change is judged against the
# build before it (a single run of each differs by up to ~5-10% on the H200 from one run to the next).
#   bench/device/compare_builds.sh CONFIG REGEX BENCH [BENCH ...]
# CONFIG: a bench config; REGEX: moekit-bench's --filter ('' for every case); BENCH: moekit-bench executables, the
# first the baseline, each optionally after environment settings of its own and an '@' (e.g.
# MOEKIT_GEMM_SCHEDULE=pingpong@DEST/moekit-bench; several separated by commas): one build under two settings.
# Env MOEKIT_GEMM_PATH etc. pass through. Output folder: $OUT (default /tmp/moekit-builds-out).
# stdout and builds.md there: a Markdown table of each
# case's median TFLOP/s (or GB/s) per build, the ratio of the medians to the first build's, the lowest and highest
# ratio of one round (build i's run against the first build's run of the same round, which ran next to it: a ratio
# whose range spans 1 is within the noise) and the first build's cuBLAS baseline; builds.tgz there: every run's
# JSON and log.
set -uo pipefail
config=${1:?usage: compare_builds.sh CONFIG REGEX BENCH [BENCH ...]}
filter=${2?usage: compare_builds.sh CONFIG REGEX BENCH [BENCH ...]}
shift 2
benches=()
settings=()
for b in "$@"; do
  if [[ $b == *@* ]]; then
    settings+=("${b%%@*}")
    b=${b#*@}
  else
    settings+=("")
  fi
  benches+=("$(realpath "$b")")
done
rounds=${ROUNDS:-3}
out=${OUT:-/tmp/moekit-builds-out}
runs=$(mktemp -d)
mkdir -p "$out"
for ((r = 0; r < rounds; ++r)); do
  for i in "${!benches[@]}"; do
    args=("$config" --backend cuda --out "$runs/b${i}_r$r.json")
    [[ -n $filter ]] && args+=(--filter "$filter")
    IFS=, read -r -a assignments <<<"${settings[$i]}"
    env "${assignments[@]}" "${benches[$i]}" "${args[@]}" >"$runs/b${i}_r$r.log" 2>&1
    echo "round $r build $i (${settings[$i]:+${settings[$i]} }${benches[$i]}): moekit-bench exit $?" >&2
  done
done
labels=()
for i in "${!benches[@]}"; do labels+=("${settings[$i]:+${settings[$i]} }${benches[$i]}"); done
python3 - "$runs" "${#benches[@]}" "$rounds" "${labels[@]}" <<'PY' | tee "$out/builds.md"
import json, os, statistics, sys

runs, count, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = sys.argv[4:]
rates = [{} for _ in range(count)]  # build -> case -> {round: rate}
baseline = {}
order = []
for i in range(count):
    for r in range(rounds):
        path = os.path.join(runs, f"b{i}_r{r}.json")
        if not os.path.exists(path):
            continue
        for case in json.load(open(path))["cases"]:
            name = case["name"]
            if name not in order:
                order.append(name)
            rate = (case.get("tflops") or case.get("gbps")) if case.get("status") == "ok" else None
            if rate is not None:
                rates[i].setdefault(name, {})[r] = rate
            base = (case.get("baseline") or {}).get("tflops")
            if i == 0 and base is not None:
                baseline.setdefault(name, []).append(base)
print("| case | " + " | ".join(f"build {i}" for i in range(count)) + " | "
      + " | ".join(f"build {i} / build 0 | per round" for i in range(1, count)) + " | cuBLAS (build 0's runs) |")
print("|---" * (3 * count) + "|")
med = lambda xs: statistics.median(xs) if xs else None
for name in order:
    m = [med(list(rates[i].get(name, {}).values())) for i in range(count)]
    cells = [f"{v:.0f}" if v else "-" for v in m]
    for i in range(1, count):
        cells.append(f"{m[i] / m[0]:.3f}" if m[i] and m[0] else "-")
        first, other = rates[0].get(name, {}), rates[i].get(name, {})
        paired = [other[r] / first[r] for r in first if r in other]
        cells.append(f"{min(paired):.3f}–{max(paired):.3f}" if paired else "-")
    b = med(baseline.get(name, []))
    cells.append(f"{b:.0f}" if b else "-")
    print(f"| {name} | " + " | ".join(cells) + " |")
print()
for i, n in enumerate(names):
    print(f"build {i}: {n}; medians of {rounds} rounds, builds taking turns")
PY
tar -czf "$out/builds.tgz" -C "$runs" .
