#!/usr/bin/env bash
# Copies the GPU test and timing executables of a CUDA build into one folder inside the repository (ignored by
# git as build*/), stripped, so the device tool can carry it (its limit is 64 MiB).
#   tests/gpu/stage_for_device.sh BUILD_DIR [DEST=build-device]
set -euo pipefail
build=${1:?usage: stage_for_device.sh BUILD_DIR [DEST]}
dest=${2:-build-device}
rm -rf "$dest"
mkdir -p "$dest"
cp "$build"/tests/gpu/moekit_gpu_test_* "$build"/bench/micro/moekit_time_* "$dest"/
strip "$dest"/*
du -sh "$dest"
