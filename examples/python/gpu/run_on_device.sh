#!/usr/bin/env bash
# Runs on the GPU machine: the GPU side of examples/python. The CUDA gradient, stream, torch.compile and CUDA-graph
# check; the option, aux-loss, custom-op and Hugging Face tests on CUDA tensors (MOEKIT_TEST_DEVICE=cuda); then the
# 200-step training comparison against the plain-PyTorch layer (examples/python/train_moe_lm.py at its GPU sizes;
# the loss-curve PNG goes to the current folder). Each script runs under a time limit and the next one runs whatever
# the last gave; a line per script says how it ended, and the status is 1 when one failed.
#   examples/python/gpu/run_on_device.sh LIBMOEKIT_SO
# LIBMOEKIT_SO: libmoekit.so.0.2 of a CUDA build, copied to the GPU machine, e.g. in an ignored folder of the
# repository (cmake --build build-cuda --target moekit && mkdir -p build-python-device &&
#  cp build-cuda/libmoekit.so.0.2 build-python-device/). Uses the machine's python3 (which holds PyTorch).
# check_gradients_cuda.py and train_moe_lm.py exit 2 when the CUDA backend answers NOT_SUPPORTED for a layer (a GPU
# it does not serve).
set -uo pipefail
export MOEKIT_LIBRARY=$(realpath "${1:?usage: run_on_device.sh LIBMOEKIT_SO}")
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Inductor's kernels compiled here, not replayed from a cache made against another schema of the custom ops.
export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
here=$(dirname "${BASH_SOURCE[0]}")
limit=300  # seconds a script may take: several times what any takes on an H200
status=0
summary=()

# run SCRIPT [ARGS...]: python3 SCRIPT under the time limit; adds its line to the summary.
run() {
  local script=$1 start=$SECONDS
  shift
  timeout "$limit" python3 "$script" "$@"
  local rc=$? how
  case $rc in
    0) how="passed" ;;
    124) how="FAILED: stopped after ${limit} s" ;;
    *) how="FAILED: exit $rc" ;;
  esac
  ((rc == 0)) || status=1
  summary+=("$(printf '%-24s %s (%d s)' "$(basename "$script")" "$how" $((SECONDS - start)))")
  echo "== ${summary[-1]}"
}

run "$here/check_gradients_cuda.py"
for test in test_options test_aux_losses test_compile test_hf; do
  MOEKIT_TEST_DEVICE=cuda run "$here/../$test.py"
done
run "$here/../train_moe_lm.py" --device cuda --plot train_moe_lm_loss.png

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$status"
