#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: every grouped GEMM kernel configuration a plan may hold (they
# all give the same bits) on a bench config's GEMM cases, the candidates taking turns ROUNDS times (default 2,
# through compare_builds.sh), and per case the fastest — the measurement a table of winners per product class is
# made from.
#   bench/device/tune_gemm.sh BENCH CONFIG [REGEX]
# BENCH: a moekit-bench executable; CONFIG: a bench config of gemm cases (e.g. bench/configs/gemm.json); REGEX:
# moekit-bench's --filter (default: every case). CANDIDATES: the environment settings of each candidate, separated
# by spaces, each a comma-separated list (default below: both tiles single and paired, and ping-pong single and
# paired); the plan's default choice runs first, as the baseline. Output folder: $OUT (default
# /tmp/moekit-tune-out): builds.md and builds.tgz (compare_builds.sh's), and winners.tsv, one row per case: its
# product class (mode, epilogue, gather, b_layout, n, k, mean rows per group), the default's median TFLOP/s, the
# fastest candidate, its median, their ratio and the lowest and highest ratio of one round; also on stdout.
# bench/device/tuning_table.py turns winners.tsv into rows of cuda/gemm/gemm_tuning_sm90.tsv.
set -uo pipefail
bench=${1:?usage: tune_gemm.sh BENCH CONFIG [REGEX]}
config=${2:?usage: tune_gemm.sh BENCH CONFIG [REGEX]}
filter=${3:-}
candidates=${CANDIDATES:-"MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x256 MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x128
MOEKIT_GEMM_PATH=wgmma_pair,MOEKIT_GEMM_TILE=128x256 MOEKIT_GEMM_PATH=wgmma_pair,MOEKIT_GEMM_TILE=128x128
MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_SCHEDULE=pingpong MOEKIT_GEMM_PATH=wgmma_pair,MOEKIT_GEMM_SCHEDULE=pingpong"}
out=${OUT:-/tmp/moekit-tune-out}
mkdir -p "$out"
args=("$bench")
for c in $candidates; do args+=("$c@$bench"); done
here=$(dirname "${BASH_SOURCE[0]}")
ROUNDS=${ROUNDS:-2} OUT=$out bash "$here/compare_builds.sh" "$config" "$filter" "${args[@]}" >/dev/null
runs=$(mktemp -d)
tar -xzf "$out/builds.tgz" -C "$runs"
python3 - "$runs" "$bench" $candidates <<'PY' | tee "$out/winners.tsv"
import ast, glob, json, os, re, statistics, sys

runs, names = sys.argv[1], ["default"] + sys.argv[3:]
rates = {}  # case -> build -> round -> TFLOP/s
records = {}
for path in glob.glob(os.path.join(runs, "b*_r*.json")):
    build, round_ = map(int, re.match(r"b(\d+)_r(\d+)\.json", os.path.basename(path)).groups())
    for case in json.load(open(path))["cases"]:
        if case.get("status") != "ok" or not case.get("tflops"):
            continue
        rates.setdefault(case["name"], {}).setdefault(build, {})[round_] = case["tflops"]
        records.setdefault(case["name"], case)
print("\t".join(["case", "mode", "epilogue", "gather", "b_layout", "n", "k", "rows_per_group", "default_tflops", "best",
                 "best_tflops", "best_over_default", "per_round"]))
for name, by_build in rates.items():
    medians = {b: statistics.median(r.values()) for b, r in by_build.items()}
    if 0 not in medians:
        continue
    best = max(medians, key=medians.get)
    rounds = [by_build[best][r] / by_build[0][r] for r in by_build[best] if r in by_build[0]]
    cfg = ast.literal_eval(records[name]["config"]) if isinstance(records[name]["config"], str) else records[name]["config"]
    rows = (records[name].get("routing") or {}).get("counts", {}).get("mean", "")
    print("\t".join(str(v) for v in [name, cfg.get("mode", ""), cfg.get("epilogue", "store"), cfg.get("gather", "none"),
                                     cfg.get("b_layout", "nk"),
                                     cfg.get("n", ""), cfg.get("k", ""), rows, f"{medians[0]:.0f}", names[best],
                                     f"{medians[best]:.0f}", f"{medians[best] / medians[0]:.3f}",
                                     f"{min(rounds):.3f}-{max(rounds):.3f}"]))
PY
