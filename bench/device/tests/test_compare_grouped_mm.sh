#!/usr/bin/env bash
# compare_grouped_mm.sh against stand-in moekit-bench and torch_bench whose rates change from round to round: the
# medians, their ratio, each round's ratio range, a case one tool failed as "-", the turns and the arguments.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A stand-in tool: its Nth run (counted in its own folder) reports case "gemm_a" at the Nth of its RATES (moekit's
# record, or torch's with the grouped_mm_alone timing) and "gemm_b" as failed, and logs its arguments in turn.
make_tool() {
  mkdir -p "$work/$1"
  cat >"$work/$1/tool" <<TOOL
#!/usr/bin/env bash
dir=\$(dirname "\$0")
run=\$(cat "\$dir/runs" 2>/dev/null || echo 0)
echo \$((run + 1)) >"\$dir/runs"
echo "$1 \$*" >>"$work/turns"
rates=($2)
out=""
while [[ \$# -gt 0 ]]; do [[ \$1 == --out ]] && out=\$2; shift; done
rate=\${rates[\$run]}
if [[ $1 == moekit ]]; then a='"tflops": '\$rate; else a='"tflops": 1, "grouped_mm_alone": {"tflops": '\$rate'}'; fi
printf '{"cases": [{"name": "gemm_a", "status": "ok", %s},
                   {"name": "gemm_b", "status": "failed"}]}\n' "\$a" >"\$out"
TOOL
  chmod +x "$work/$1/tool"
}
make_tool moekit "100 110 90"
make_tool torch "100 100 100"

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
