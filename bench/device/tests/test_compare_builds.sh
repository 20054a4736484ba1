#!/usr/bin/env bash
# compare_builds.sh against two stand-in moekit-bench executables whose rates change from round to round: the
# medians, their ratio, each round's ratio range, the cuBLAS column of the first build, a failed case as "-", and
# the arguments every run gets.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

. "$here/stand_in_tool.sh"
# Stand-in benches: case "gemm_a" at the run's rate, case "gemm_b" failed.
records='{"name": "gemm_a", "status": "ok", "tflops": %s, "baseline": {"tflops": 700}},
         {"name": "gemm_b", "status": "error", "message": "not supported"}'
make_stand_in "$work/old/moekit-bench" "100 110 90" "$records"
make_stand_in "$work/new/moekit-bench" "105 108 99" "$records"

ROUNDS=3 OUT="$work/out" bash "$here/../compare_builds.sh" config.json 'gemm_' "$work/old/moekit-bench" \
  "$work/new/moekit-bench" >"$work/stdout" 2>"$work/stderr" || fail "exit status $?"
table=$(cat "$work/out/builds.md")
# Medians 100 and 105; round ratios 1.050, 0.982, 1.100.
grep -qF '| gemm_a | 100 | 105 | 1.050 | 0.982–1.100 | 700 |' <<<"$table" || fail "gemm_a row: $table"
grep -qF '| gemm_b | - | - | - | - | - |' <<<"$table" || fail "gemm_b row: $table"
grep -qF '| case | build 0 | build 1 | build 1 / build 0 | per round | cuBLAS (build 0'"'"'s runs) |' <<<"$table" ||
  fail "header: $table"
grep -qF '|---|---|---|---|---|---|' <<<"$table" || fail "separator: $table"
[[ $(cat "$work/old/runs") == 3 && $(cat "$work/new/runs") == 3 ]] || fail "each build should run once per round"
grep -qE '^config\.json --backend cuda --out /.*/b0_r0\.json --filter gemm_$' "$work/old/args" ||
  fail "arguments: $(cat "$work/old/args")"
grep -qF "build 1: $work/new/moekit-bench; medians of 3 rounds" <<<"$table" || fail "legend: $table"
cmp -s "$work/stdout" "$work/out/builds.md" || fail "stdout should be builds.md"
[[ -f $work/out/builds.tgz ]] || fail "builds.tgz missing"
echo "compare_builds.sh: all checks passed"
