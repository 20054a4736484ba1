#!/usr/bin/env bash
# compare_grouped_mm.sh against stand-in moekit-bench and torch_bench whose rates change from round to round: the
# medians, their ratio, each round's ratio range, a case one tool failed as "-", the turns and the arguments.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

. "$here/stand_in_tool.sh"
# Stand-in tools: case "gemm_a" at the run's rate (moekit's record, or torch's with the grouped_mm_alone timing),
# case "gemm_b" failed.
make_stand_in "$work/moekit/tool" "100 110 90" \
  '{"name": "gemm_a", "status": "ok", "tflops": %s}, {"name": "gemm_b", "status": "failed"}'
make_stand_in "$work/torch/tool" "100 100 100" \
  '{"name": "gemm_a", "status": "ok", "tflops": 1, "grouped_mm_alone": {"tflops": %s}},
   {"name": "gemm_b", "status": "failed"}'

ROUNDS=3 OUT="$work/out" TORCH_BENCH="$work/torch/tool" bash "$here/../compare_grouped_mm.sh" "$work/moekit/tool" \
  config.json 'gemm_' >"$work/stdout" 2>"$work/stderr" || fail "exit status $?"
table=$(cat "$work/out/grouped_mm.md")
# moekit's median 100, grouped_mm's 100; round ratios 1.000, 1.100, 0.900.
grep -qF '| gemm_a | 100 | 100 | 1.000 | 0.900–1.100 |' <<<"$table" || fail "gemm_a row: $table"
grep -qF '| gemm_b | - | - | - | - |' <<<"$table" || fail "gemm_b row: $table"
grep -qF '| case | moekit TFLOP/s | grouped_mm TFLOP/s | moekit / grouped_mm | per round |' <<<"$table" ||
  fail "header: $table"
[[ $(cut -d' ' -f1 "$work/turns" | tr '\n' ' ') == "moekit torch moekit torch moekit torch " ]] ||
  fail "the tools should take turns: $(cat "$work/turns")"
grep -qE '^moekit config\.json --backend cuda --filter gemm_ --out /.*/moekit_r0\.json$' "$work/turns" ||
  fail "moekit arguments: $(cat "$work/turns")"
grep -qE '^torch config\.json --mode eager --grouped-mm-alone --filter gemm_ --out /.*/torch_r0\.json$' \
  "$work/turns" || fail "torch arguments: $(cat "$work/turns")"
cmp -s "$work/stdout" "$work/out/grouped_mm.md" || fail "stdout should be grouped_mm.md"
[[ -f $work/out/grouped_mm.tgz ]] || fail "grouped_mm.tgz missing"
echo "compare_grouped_mm.sh: all checks passed"
