#!/usr/bin/env bash
# Runs on the GPU machine: the GPU side of examples/python, the CUDA gradient check, then the 200-step training
# comparison against the plain-PyTorch layer.
#   examples/python/gpu/run_on_device.sh LIBMOEKIT_SO
# LIBMOEKIT_SO: libmoekit.so.0.2 of a CUDA build, copied to the GPU machine, e.g. in an ignored folder of the
# repository (cmake --build build-cuda --target moekit && mkdir -p build-python-device &&
#  cp build-cuda/libmoekit.so.0.2 build-python-device/). Uses the machine's python3 (which holds PyTorch).
# Each script exits 2 when the CUDA backend answers NOT_SUPPORTED for a layer (a GPU it does not serve).
set -uo pipefail
export MOEKIT_LIBRARY=$(realpath "${1:?usage: run_on_device.sh LIBMOEKIT_SO}")
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
here=$(dirname "${BASH_SOURCE[0]}")
status=0
python3 "$here/check_gradients_cuda.py" || status=$?
python3 "$here/train_moe_lm.py" || status=$?
exit "$status"
