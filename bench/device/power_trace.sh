#!/usr/bin/env bash
# Runs on the GPU machine: runs a command while nvidia-smi samples the GPU every INTERVAL_MS (default 100) — SM
# clock, power draw against its limit, temperature and the active clock-throttle reasons — so a benchmark's rate can
# be read against what the chip ran at: a GEMM slowed by the power limit shows SM clocks below the maximum with
# the power-cap reason set, one slowed by its own code shows neither.
#   bench/device/power_trace.sh COMMAND [ARG...]
# Output folder: $OUT (default /tmp/moekit-power-out). power.csv there: every sample; stdout and power.md there:
# per throttle-reason mask, the sample count and the median
# SM clock and power; the command's own output passes through. Exit status: the command's.
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: power_trace.sh COMMAND [ARG...]" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "power_trace.sh: nvidia-smi not found" >&2; exit 2; }
out=${OUT:-/tmp/moekit-power-out}
mkdir -p "$out"
interval=${INTERVAL_MS:-100}
# NOTE: newer drivers name the reasons clocks_event_reasons, older ones clocks_throttle_reasons.
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu="$reasons" --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
fields=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,$reasons
nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits -lms "$interval" >"$out/power.csv" &
sampler=$!
"$@"
status=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
python3 - "$out/power.csv" <<'PY' | tee "$out/power.md"
import collections, statistics, sys

# NOTE: the reason mask is nvidia-smi's bit set: 0x1 idle, 0x4 software power cap, 0x20 software thermal
# slowdown, 0x40 hardware thermal slowdown, 0x80 hardware power brake.
names = {0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown", 0x20: "sw thermal",
         0x40: "hw thermal", 0x80: "power brake"}
groups = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 7:
        continue
    try:
        clock, max_clock, power, limit, temp = (float(p) for p in parts[1:6])
        mask = int(parts[6], 16)
    except ValueError:
        continue
    groups[mask].append((clock, max_clock, power, limit, temp))
print("| throttle reasons | samples | median SM MHz (max) | median W (limit) | median °C |")
print("|---|---|---|---|---|")
for mask, rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
    label = ", ".join(n for bit, n in names.items() if mask & bit) or "none"
    med = lambda i: statistics.median(r[i] for r in rows)
    print(f"| {label} (0x{mask:x}) | {len(rows)} | {med(0):.0f} ({med(1):.0f}) | {med(2):.0f} ({med(3):.0f}) | {med(4):.0f} |")
PY
exit "$status"
