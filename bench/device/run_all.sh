#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: every bench config through moekit-bench (the CUDA backend, and
# the reference backend on the machine's CPU), through bench/compare/torch_bench.py (eager, then torch.compile), the
# MoE layer shapes through torch_bench.py --mode moekit (moekit's layer called from its Python package) and, when
# bench/device/stage_sonicmoe.sh put SonicMoE into DEST, through bench/compare/sonicmoe_bench.py; then
# bench/device/perf_tables.py turns all the results into the generated part of docs/performance.md.
#   bench/device/run_all.sh DEST [STEP ...]
# DEST: the folder bench/device/stage.sh filled (copied to the GPU machine with the repository). STEP: only these
# steps (names as in the list below, e.g. "torch-compile:sonicmoe_fig14"); all by default.
# Each step runs under its own time limit, cut to what is left of the whole run's budget (MOEKIT_BENCH_BUDGET_S,
# default 540 s, so that the run fits in 10 minutes); a step that has no time left is skipped, and a step stopped by
# its limit keeps the cases it finished (every tool rewrites its JSON after every case).
# Writes into the output folder ($OUT, default /tmp/moekit-bench-out): tables.md (perf_tables.py's Markdown, to
# put into docs/performance.md) and results.tgz (every JSON, log, device.txt and steps.tsv: each step's exit
# status, seconds used and limit); with SonicMoE, its tuning results and compiled kernels as sonicmoe-autotune.tgz
# and sonicmoe-cache.tgz. stdout ends with steps.tsv.
set -uo pipefail
dest=${1:?usage: run_all.sh DEST [STEP ...]}
shift
start=$SECONDS
budget=${MOEKIT_BENCH_BUDGET_S:-540}
reserve=15  # for the tables and the archive
python=${PYTHON:-python3}
out=${OUT:-/tmp/moekit-bench-out}
results=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# moekit-bench --breakdown opens libcupti at run time: the toolkit's copy, where the loader does not find one.
for lib in /usr/local/cuda*/targets/x86_64-linux/lib /usr/local/cuda*/extras/CUPTI/lib64; do
  compgen -G "$lib/libcupti.so*" >/dev/null && LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
command_line="bash bench/device/run_all.sh $dest${*:+ $*}"
[[ -n ${MOEKIT_BENCH_BUDGET_S:-} ]] && command_line="MOEKIT_BENCH_BUDGET_S=$MOEKIT_BENCH_BUDGET_S $command_line"

if [[ -f $dest/bench.txz ]]; then
  tar -xJf "$dest/bench.txz" -C "$dest" && rm "$dest/bench.txz"
fi
bench=$(realpath "$dest/moekit-bench")
# The library moekit-bench was built with, for moekit's Python package (torch_bench.py --mode moekit).
moekit_library=$(realpath "$dest/libmoekit.so.0.2")
export MOEKIT_GIT_SHA=$(cat "$dest/git_sha" 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >"$results/device.txt" 2>&1
"$python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' >>"$results/device.txt" 2>&1
cat "$results/device.txt"

# SonicMoE (bench/device/stage_sonicmoe.sh packed it into DEST), unpacked where its step will run.
sonicmoe_site=$(mktemp -d)
if [[ -f $dest/sonicmoe-site.tar.xz ]] && { (($# == 0)) || [[ " $* " == *" sonicmoe:"* ]]; }; then
  tar -xJf "$dest/sonicmoe-site.tar.xz" -C "$sonicmoe_site"
fi
sonicmoe_path=$sonicmoe_site:$sonicmoe_site/nvidia_cutlass_dsl/python_packages
# SonicMoE autotunes each GEMM per shape on its first call (~2 min each on the H200, 6 per layer shape): QuACK
# compiles every candidate tile configuration, then times them. Its tuning results (QUACK_CACHE_AUTOTUNING) come
# back in the output folder as sonicmoe-autotune.tgz, and its compiled kernels, whose cache keys hold no shapes
# (dtypes, tile, cluster, schedule, layouts), as sonicmoe-cache.tgz; a later run takes either from DEST, so a
# shape's tuning is paid once and the compiles once for all shapes.
# The repository keeps the H200 tuning results of the shapes tuned so far (bench/compare/sonicmoe-autotune/, the
# versions of stage_sonicmoe.sh); DEST's archives, unpacked after them, take precedence.
sonicmoe_cache=$(mktemp -d)
cp -r bench/compare/sonicmoe-autotune/. "$sonicmoe_cache"/
for archive in sonicmoe-cache.tgz sonicmoe-autotune.tgz; do
  [[ -f $dest/$archive ]] && tar -xzf "$dest/$archive" -C "$sonicmoe_cache"
done
sonicmoe_env="PYTHONPATH=$sonicmoe_path QUACK_CACHE_AUTOTUNING=1 QUACK_CACHE_DIR=$sonicmoe_cache QUACK_COMPILE_WORKERS=16"

# step name | time limit (s) | command. The name is "tool:config"; perf_tables.py's topics name these steps. Order =
# priority: moekit first, the reference backend, then PyTorch eager, moekit from Python (after the eager step of the
# same config), torch.compile (its compile time, ~10-30 s per shape, comes on top of the timed calls) and SonicMoE
# last (its tuning alone outlasts one run: see docs/benchmark.md); the real-model shapes (models.json) come after the
# other moekit steps, and after every other PyTorch step. The limits are about twice the costs estimated from the
# shapes and the configs' iteration counts, or measured (docs/benchmark.md, "Reproducing the tables").
steps=(
  "moekit:smoke|60|$bench bench/configs/smoke.json --backend cuda --check --out $results/moekit_smoke.json"
  "moekit:sonicmoe_fig14|150|$bench bench/configs/sonicmoe_fig14.json --backend cuda --breakdown --out $results/moekit_sonicmoe_fig14.json"
  "moekit:blocks|60|$bench bench/configs/blocks.json --backend cuda --out $results/moekit_blocks.json"
  "moekit:gemm_rows_per_expert|60|$bench bench/configs/gemm_rows_per_expert.json --backend cuda --out $results/moekit_gemm_rows_per_expert.json"
  "moekit:sparse_ffn|60|$bench bench/configs/sparse_ffn.json --backend cuda --out $results/moekit_sparse_ffn.json"
  "moekit:gemm|150|$bench bench/configs/gemm.json --backend cuda --out $results/moekit_gemm.json"
  "moekit:models|60|$bench bench/configs/models.json --backend cuda --breakdown --out $results/moekit_models.json"
  "reference:reference_layer|120|$bench bench/configs/reference_layer.json --backend reference --out $results/reference_reference_layer.json"
  "torch-eager:sonicmoe_fig14|120|$python bench/compare/torch_bench.py bench/configs/sonicmoe_fig14.json --mode eager --out $results/torch-eager_sonicmoe_fig14.json"
  "torch-eager:gemm_rows_per_expert|60|$python bench/compare/torch_bench.py bench/configs/gemm_rows_per_expert.json --mode eager --grouped-mm-alone --out $results/torch-eager_gemm_rows_per_expert.json"
  "torch-eager:sparse_ffn|60|$python bench/compare/torch_bench.py bench/configs/sparse_ffn.json --mode eager --out $results/torch-eager_sparse_ffn.json"
  "torch-eager:gemm|150|$python bench/compare/torch_bench.py bench/configs/gemm.json --mode eager --out $results/torch-eager_gemm.json"
  "torch-moekit:sonicmoe_fig14|120|env MOEKIT_LIBRARY=$moekit_library $python bench/compare/torch_bench.py bench/configs/sonicmoe_fig14.json --mode moekit --out $results/torch-moekit_sonicmoe_fig14.json"
  "torch-compile:sonicmoe_fig14|240|$python bench/compare/torch_bench.py bench/configs/sonicmoe_fig14.json --mode compile --out $results/torch-compile_sonicmoe_fig14.json"
  "torch-compile:sparse_ffn|90|$python bench/compare/torch_bench.py bench/configs/sparse_ffn.json --mode compile --out $results/torch-compile_sparse_ffn.json"
  "torch-eager:models|60|$python bench/compare/torch_bench.py bench/configs/models.json --mode eager --out $results/torch-eager_models.json"
  "torch-moekit:models|60|env MOEKIT_LIBRARY=$moekit_library $python bench/compare/torch_bench.py bench/configs/models.json --mode moekit --out $results/torch-moekit_models.json"
  "torch-compile:models|120|$python bench/compare/torch_bench.py bench/configs/models.json --mode compile --out $results/torch-compile_models.json"
  "sonicmoe:sonicmoe_fig14|480|env $sonicmoe_env $python bench/compare/sonicmoe_bench.py bench/configs/sonicmoe_fig14.json --kernel-time --out $results/sonicmoe_sonicmoe_fig14.json"
  "sonicmoe:models|480|env $sonicmoe_env $python bench/compare/sonicmoe_bench.py bench/configs/models.json --kernel-time --out $results/sonicmoe_models.json"
)

printf 'step\texit\tseconds\tlimit\n' >"$results/steps.tsv"
for entry in "${steps[@]}"; do
  IFS='|' read -r name limit command <<<"$entry"
  if (($# > 0)) && [[ " $* " != *" $name "* ]]; then continue; fi
  if [[ $name == sonicmoe:* && ! -f $dest/sonicmoe-site.tar.xz ]]; then
    printf '%s\tskipped (not staged: bench/device/stage_sonicmoe.sh)\t0\t0\n' "$name" >>"$results/steps.tsv"
    continue
  fi
  left=$((budget - reserve - (SECONDS - start)))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    printf '%s\tskipped (no time left)\t0\t0\n' "$name" >>"$results/steps.tsv"
    continue
  fi
  log="$results/${name/:/_}.log"
  echo "== $name (limit ${limit} s): $command"
  step_start=$SECONDS
  # shellcheck disable=SC2086  # the command is a plain word list
  timeout --kill-after=10 "$limit" $command >"$log" 2>&1
  rc=$?
  ((rc == 124 || rc == 137)) && rc="$rc (time limit)"
  printf '%s\t%s\t%d\t%d\n' "$name" "$rc" $((SECONDS - step_start)) "$limit" >>"$results/steps.tsv"
  tail -3 "$log"
done

shopt -s nullglob
tuned=("$sonicmoe_cache"/*/*.autotune.json)
if ((${#tuned[@]} > 0)); then
  (cd "$sonicmoe_cache" && find . -name '*.autotune.json' | tar -czf "$out/sonicmoe-autotune.tgz" -T -)
  tar -czf "$out/sonicmoe-cache.tgz" -C "$sonicmoe_cache" .
  echo "SonicMoE: ${#tuned[@]} GEMM tunings in $out/sonicmoe-autotune.tgz; the whole QuACK cache, compiled" \
    "kernels included, $(du -sh "$sonicmoe_cache" | cut -f1) ($(du -h "$out/sonicmoe-cache.tgz" | cut -f1) packed)"
fi
jsons=("$results"/*.json)
if ((${#jsons[@]} > 0)); then
  "$python" bench/device/perf_tables.py "${jsons[@]}" --steps "$results/steps.tsv" --command "$command_line" \
    >"$out/tables.md" 2>"$results/perf_tables.log" ||
    cat "$results/perf_tables.log"
else
  echo "no result file was written (see the logs in results.tgz)" >"$out/tables.md"
fi
tar -czf "$out/results.tgz" -C "$results" .
echo "total $((SECONDS - start)) s"
column -t -s $'\t' "$results/steps.tsv" 2>/dev/null || cat "$results/steps.tsv"
