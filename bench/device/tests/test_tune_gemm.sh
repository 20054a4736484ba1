#!/usr/bin/env bash
# tune_gemm.sh (and compare_builds.sh's NAME=VALUE@BENCH builds) against a stand-in moekit-bench whose rate depends
# on the environment it runs under: each candidate runs with its own settings, the default first, and winners.tsv
# names the fastest candidate per case with its product class, the ratio to the default and its range.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# gemm_a: 100 by default, 120 with 128x128 tiles, 90 paired; gemm_b: fastest by default.
cat >"$work/moekit-bench" <<'STAND_IN'
#!/usr/bin/env bash
echo "${MOEKIT_GEMM_PATH:-}/${MOEKIT_GEMM_TILE:-}/${MOEKIT_GEMM_SCHEDULE:-}" >>"$(dirname "$0")/settings"
a=100
[[ ${MOEKIT_GEMM_TILE:-} == 128x128 ]] && a=120
[[ ${MOEKIT_GEMM_PATH:-} == wgmma_pair ]] && a=90
b=$([[ -z ${MOEKIT_GEMM_PATH:-} ]] && echo 200 || echo 150)
out=""
while [[ $# -gt 0 ]]; do [[ $1 == --out ]] && out=$2; shift; done
cat >"$out" <<JSON
{"cases": [
 {"name": "gemm_a", "status": "ok", "tflops": $a, "routing": {"counts": {"mean": 512.0}},
  "config": {"mode": "varlen_m", "epilogue": "gated", "gather": "a", "n": 512, "k": 768}},
 {"name": "gemm_b", "status": "ok", "tflops": $b, "config": {"mode": "varlen_k", "n": 256, "k": 1024}}]}
JSON
STAND_IN
chmod +x "$work/moekit-bench"

ROUNDS=2 OUT="$work/out" CANDIDATES="MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x128 MOEKIT_GEMM_PATH=wgmma_pair" \
  bash "$here/../tune_gemm.sh" "$work/moekit-bench" config.json >"$work/stdout" 2>"$work/stderr" ||
  fail "exit status $?: $(cat "$work/stderr")"
expected_settings=$'//\nwgmma/128x128/\nwgmma_pair//\n//\nwgmma/128x128/\nwgmma_pair//'
[[ $(cat "$work/settings") == "$expected_settings" ]] || fail "settings per run: $(cat "$work/settings")"
winners=$(cat "$work/out/winners.tsv")
grep -qP '^gemm_a\tvarlen_m\tgated\ta\tnk\t512\t768\t512.0\t100\tMOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x128\t120\t1.200\t1.200-1.200$' \
  <<<"$winners" || fail "gemm_a row: $winners"
grep -qP '^gemm_b\tvarlen_k\tstore\tnone\tnk\t256\t1024\t\t200\tdefault\t200\t1.000\t1.000-1.000$' <<<"$winners" ||
  fail "gemm_b row: $winners"
cmp -s "$work/stdout" "$work/out/winners.tsv" || fail "stdout should be winners.tsv"
grep -qF "build 1: MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x128 $work/moekit-bench" "$work/out/builds.md" ||
  fail "legend: $(cat "$work/out/builds.md")"
echo "tune_gemm.sh: all checks passed"
