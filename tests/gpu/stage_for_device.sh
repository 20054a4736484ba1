#!/usr/bin/env bash
# Runs on the build machine: packs the GPU test and timing executables of a CUDA build into one folder inside the
# repository (ignored by git as build*/), small enough to copy to a GPU machine: stripped, then packed into one xz
# archive
# with a window wider than one executable (every executable holds the whole static library, so they share most of
# their bytes: ~8 MiB for all of them, where gzip's 32 KiB window left 127 MiB); run_on_device.sh unpacks it.
#   tests/gpu/stage_for_device.sh BUILD_DIR [DEST=build-device]
set -euo pipefail
build=${1:?usage: stage_for_device.sh BUILD_DIR [DEST]}
dest=${2:-build-device}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
cp "$build"/tests/gpu/moekit_gpu_test_* "$build"/bench/micro/moekit_time_* "$staging"/
strip "$staging"/*
rm -rf "$dest"
mkdir -p "$dest"
tar -cf - -C "$staging" . | xz -T2 --lzma2=preset=6,dict=256MiB >"$dest/executables.txz"
du -sh "$dest"
