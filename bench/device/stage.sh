#!/usr/bin/env bash
# Runs on the build machine (no GPU needed): packs what bench/device/run_all.sh needs on the GPU machine into DEST,
# a folder inside the repository that git ignores (build*/), small enough (~4 MB) to copy to the GPU machine with
# the repository: moekit-bench and libmoekit.so.0.2 of a CUDA build, stripped, in one xz archive (gzip's is twice the
# size, too large beside SonicMoE's archive for a 64 MiB copy), and the commit they were built from.
#   bench/device/stage.sh BUILD_DIR DEST
# BUILD_DIR: a CUDA build of this checkout with the targets moekit-bench and moekit built, e.g.
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda -j2 --target moekit-bench moekit
set -euo pipefail
build=${1:?usage: stage.sh BUILD_DIR DEST}
dest=${2:?usage: stage.sh BUILD_DIR DEST}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for file in moekit-bench libmoekit.so.0.2; do
  [[ -f $build/$file ]] || { echo "stage.sh: $build/$file is missing (build the targets moekit-bench and moekit)" >&2; exit 1; }
done
# A message that only the CUDA backend's code path prints (main.cpp) tells a CUDA build from a reference-only one.
grep -aq 'measuring the ceilings' "$build/moekit-bench" ||
  { echo "stage.sh: $build is not a CUDA build (moekit-bench has no CUDA backend)" >&2; exit 1; }

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
cp "$build/moekit-bench" "$staging/"
cp -L "$build/libmoekit.so.0.2" "$staging/"
strip "$staging/moekit-bench" "$staging/libmoekit.so.0.2"

# The commit the binary reports (taken when CMake configured the build) must be the one being staged, or the
# tables would name the wrong code. The reference backend runs here without a GPU.
"$staging/moekit-bench" "$repo/bench/configs/smoke.json" --backend reference --filter '^dispatch$' \
  --out "$staging/probe.json" >/dev/null 2>&1 || { echo "stage.sh: the staged moekit-bench does not run" >&2; exit 1; }
built=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["meta"]["git_sha"])' "$staging/probe.json")
rm "$staging/probe.json"
head=$(git -C "$repo" rev-parse --short=12 HEAD)
if [[ $built != "$head"* && $head != "$built"* ]]; then
  echo "stage.sh: $build was configured at $built, the checkout is at $head: re-run cmake -S . -B $build and" \
    "rebuild first" >&2
  exit 1
fi
[[ -z $(git -C "$repo" status --porcelain --untracked-files=no) ]] ||
  echo "stage.sh: warning: the checkout has uncommitted changes; the tables will name $head" >&2
echo "$head" >"$staging/git_sha"

rm -rf "$dest"
mkdir -p "$dest"
tar -cf - -C "$staging" . | xz -T2 -9 >"$dest/bench.txz"
du -sh "$dest"
