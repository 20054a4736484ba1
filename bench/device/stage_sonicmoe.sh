#!/usr/bin/env bash
# Runs on the build machine (network, no GPU needed): packs SonicMoE and what it needs beyond the GPU machine's own Python 3.12 (which
# has torch, triton, numpy, einops, cuda-bindings) into DEST/sonicmoe-site.tar.xz, the wheels unpacked as one
# site-packages folder, for bench/device/run_all.sh's step sonicmoe:sonicmoe_fig14 (bench/compare/sonicmoe_bench.py).
#   bench/device/stage_sonicmoe.sh DEST
# DEST: a folder inside the repository that git ignores (build*/), e.g. the one bench/device/stage.sh fills, copied
# to the GPU machine with the repository. The versions are pinned to the SonicMoE release the driver was written
# against (its own pins: nvidia-cutlass-dsl 4.4.2; quack-kernels of the same day). The archive is ~55 MB; with
# stage.sh's ~4 MB the folder stays under 64 MB.
set -euo pipefail
dest=${1:?usage: stage_sonicmoe.sh DEST}
wheels=(sonic-moe==0.1.2.post1 quack-kernels==0.3.11 nvidia-cutlass-dsl==4.4.2 nvidia-cutlass-dsl-libs-base==4.4.2
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$work/wheels" "${wheels[@]}"
mkdir -p "$work/site" "$dest"
for wheel in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/site"
done
# nvidia-cutlass-dsl-libs-base puts its Python packages under nvidia_cutlass_dsl/python_packages and a .pth file
# adds that folder to sys.path; PYTHONPATH entries do not read .pth files, so run_all.sh adds it by name.
tar -C "$work/site" -cf - . | xz -T0 -9 >"$dest/sonicmoe-site.tar.xz"
ls -l "$dest/sonicmoe-site.tar.xz"
