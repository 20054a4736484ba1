#!/usr/bin/env bash
# Packs the GPU test and timing executables of a CUDA build into one folder inside the repository (ignored by
# git as build*/) so the device tool can carry it (its limit is 64 MiB): stripped, then gzipped into one archive
# (every executable holds the whole static library, so they share most of their bytes); run_on_device.sh unpacks it.
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
tar -czf "$dest/executables.tgz" -C "$staging" .
du -sh "$dest"
