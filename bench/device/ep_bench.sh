#!/usr/bin/env bash
# The expert-parallel benchmark at 1, 2, 4 and 8 GPUs for both slices (bench/device/ep_bench.cpp), exact and
# capacity modes; one JSON line per case in ep_bench.json, the table on stdout. Counts past the visible GPUs are
# skipped.
#
#   bench/device/ep_bench.sh BUILD_DIR [TOKENS_PER_RANK]
#   e.g. bench/device/ep_bench.sh build-cuda 4096
set -eu
build=${1:?usage: ep_bench.sh BUILD_DIR [TOKENS_PER_RANK]}
tokens=${2:-4096}
here=$(cd "$(dirname "$0")" && pwd)
launcher="$here/../../tests/ep/run_multi_gpu.sh"
program="$build/bench/device/moekit_ep_bench"
gpus=$(nvidia-smi -L | wc -l)
rm -f ep_bench.json
for ranks in 1 2 4 8; do
  if (( ranks > gpus )); then echo "skipping $ranks GPUs ($gpus visible)"; continue; fi
  for model in dsv3 qwen3; do
    "$launcher" "$ranks" "$program" --model "$model" --tokens "$tokens" --json ep_bench.json
    "$launcher" "$ranks" "$program" --model "$model" --tokens "$tokens" --capacity 1 --json ep_bench.json
  done
done
