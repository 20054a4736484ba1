#!/usr/bin/env bash
# power_trace.sh against a stand-in nvidia-smi that prints three fixed samples: the command's exit status passes
# through, and power.md groups the samples by throttle-reason mask with their medians.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
cat >"$work/bin/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
case "$*" in
  *-lms*)
    printf '%s\n' "2026/11/30 19:48:37.460, 1395, 1980, 690.50, 700.00, 60, 0x0000000000000004" \
      "2026/11/30 19:48:37.560, 1305, 1980, 694.50, 700.00, 61, 0x0000000000000004" \
      "2026/11/30 19:48:37.660, 345, 1980, 79.00, 700.00, 41, 0x0000000000000001"
    exec sleep 30 ;;
  *) echo "0x0000000000000000" ;;
esac
SMI
chmod +x "$work/bin/nvidia-smi"
fail() { echo "FAIL: $*" >&2; exit 1; }

PATH="$work/bin:$PATH" OUT="$work/out" bash "$here/../power_trace.sh" bash -c 'sleep 0.5; exit 3' >"$work/stdout"
status=$?
[[ $status -eq 3 ]] || fail "exit status $status, expected the command's 3"
[[ $(wc -l <"$work/out/power.csv") -eq 3 ]] || fail "power.csv should hold the 3 samples"
grep -qF '| power cap (0x4) | 2 | 1350 (1980) | 692 (700) | 60 |' "$work/out/power.md" || fail "power-cap row: $(cat "$work/out/power.md")"
grep -qF '| idle (0x1) | 1 | 345 (1980) | 79 (700) | 41 |' "$work/out/power.md" || fail "idle row: $(cat "$work/out/power.md")"
cmp -s "$work/stdout" "$work/out/power.md" || fail "stdout should be power.md"

PATH="$work/bin:$PATH" bash "$here/../power_trace.sh" >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "no command: expected exit 2"
echo "power_trace.sh: all checks passed"
