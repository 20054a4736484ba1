#!/usr/bin/env bash
# On the GPU machine: builds cublaslt_initcheck.cu there (it needs cuBLASLt's shared library) and runs it under
# compute-sanitizer initcheck at a few shapes; each prints its initcheck report count (m x n when initcheck does
# not see cuBLASLt's stores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/cuda/bin:$PATH
exe=$(mktemp -d)/cublaslt_initcheck
nvcc -O2 -arch=sm_90a "$here/cublaslt_initcheck.cu" -lcublasLt -o "$exe"
for shape in "37 16 72" "200 16 128" "64 64 64" "4096 128 4096" "1024 256 1024"; do
  compute-sanitizer --tool initcheck --print-limit 1 "$exe" $shape 2>&1 | grep -E '^m |ERROR SUMMARY'
done
