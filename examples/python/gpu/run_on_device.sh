#!/usr/bin/env bash
# The H200 side of examples/python: the CUDA gradient check, then the 200-step training comparison.
#   examples/python/gpu/run_on_device.sh LIBMOEKIT_SO
# LIBMOEKIT_SO: libmoekit.so.0.1 of a CUDA build, staged into an ignored folder that the device run carries
# (e.g. cmake --build build-cuda --target moekit && mkdir -p build-python-device &&
#  cp build-cuda/libmoekit.so.0.1 build-python-device/). Uses the machine's python3 (which holds PyTorch).
# Both scripts exit 2 while the CUDA backend answers NOT_SUPPORTED for the layers (before "CUDA kernels III").
set -uo pipefail
export MOEKIT_LIBRARY=$(realpath "${1:?usage: run_on_device.sh LIBMOEKIT_SO}")
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
here=$(dirname "${BASH_SOURCE[0]}")
status=0
python3 "$here/check_gradients_cuda.py" || status=$?
python3 "$here/train_moe_lm.py" || status=$?
exit "$status"
