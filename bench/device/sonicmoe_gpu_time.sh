#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: moekit and SonicMoE on the MoE layer shapes of
# bench/configs/sonicmoe_fig14.json, each timed two ways: CUDA events per call (what a caller waits for) and GPU
# time per call (the kernels' CUPTI durations summed: moekit-bench --breakdown, sonicmoe_bench.py --kernel-time).
#   bench/device/sonicmoe_gpu_time.sh DEST [FILTER]
# DEST: the folder bench/device/stage.sh and stage_sonicmoe.sh filled (bench.txz, sonicmoe-site.tar.xz; optional
# sonicmoe-autotune.tgz, SonicMoE's tuning from an earlier run). FILTER: a regex of case names (default: every case).
# SonicMoE tunes each GEMM per shape on its first call; QuACK's compiled kernels (cache keys without shapes) and
# tunings stay in SONICMOE_CACHE (default DEST/quack-cache), so a second run on the same machine, with DEST left in
# place, goes on where a time limit stopped the first. BUDGET_S (default 560) bounds the whole run; MOEKIT=0 skips
# moekit-bench (a continuation). Output folder: $OUT (default /tmp/moekit-sonicmoe-out): moekit.json,
# sonicmoe.json, their logs, sonicmoe-autotune.tgz and gpu_time.md (bench/device/gpu_time_table.py).
set -uo pipefail
dest=${1:?usage: sonicmoe_gpu_time.sh DEST [FILTER]}
filter=${2:-.}
out=${OUT:-/tmp/moekit-sonicmoe-out}
budget=${BUDGET_S:-560}
cache=${SONICMOE_CACHE:-$dest/quack-cache}
config=bench/configs/sonicmoe_fig14.json
python=${PYTHON:-python3}
start=$SECONDS
mkdir -p "$out" "$cache"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [[ -f $dest/bench.txz ]]; then
  tar -xJf "$dest/bench.txz" -C "$dest" && rm "$dest/bench.txz"
fi
export MOEKIT_GIT_SHA=$(cat "$dest/git_sha" 2>/dev/null)
site=$dest/sonicmoe-site
if [[ -f $dest/sonicmoe-site.tar.xz ]]; then
  mkdir -p "$site" && tar -xJf "$dest/sonicmoe-site.tar.xz" -C "$site" && rm "$dest/sonicmoe-site.tar.xz"
fi
if [[ -f $dest/sonicmoe-autotune.tgz ]]; then
  tar -xzf "$dest/sonicmoe-autotune.tgz" -C "$cache" && rm "$dest/sonicmoe-autotune.tgz"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"

if [[ ${MOEKIT:-1} != 0 ]]; then
  timeout 200 "$dest/moekit-bench" "$config" --backend cuda --filter "$filter" --breakdown --out "$out/moekit.json" \
    >"$out/moekit.log" 2>&1
  echo "moekit-bench exit $? ($((SECONDS - start)) s)"
fi
left=$((budget - 20 - (SECONDS - start)))
timeout --kill-after=10 "$left" env PYTHONPATH="$site:$site/nvidia_cutlass_dsl/python_packages" \
  QUACK_CACHE_AUTOTUNING=1 QUACK_CACHE_DIR="$cache" QUACK_COMPILE_WORKERS=16 \
  "$python" bench/compare/sonicmoe_bench.py "$config" --filter "$filter" --kernel-time --out "$out/sonicmoe.json" \
  >"$out/sonicmoe.log" 2>&1
echo "sonicmoe_bench.py exit $? ($((SECONDS - start)) s)"
grep -E '^\[[0-9]+/[0-9]+\]' "$out/sonicmoe.log" | tail -30
(cd "$cache" && find . -name '*.autotune.json' | tar -czf "$out/sonicmoe-autotune.tgz" -T -)
jsons=()
for f in moekit.json sonicmoe.json; do [[ -f $out/$f ]] && jsons+=("$out/$f"); done
((${#jsons[@]} > 0)) && "$python" bench/device/gpu_time_table.py "${jsons[@]}" | tee "$out/gpu_time.md"
echo "total $((SECONDS - start)) s"
