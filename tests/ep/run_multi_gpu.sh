#!/usr/bin/env bash
# Launches one process per GPU for a moekit_ep multi-GPU program and waits for all of them; no MPI needed (the
# ncclUniqueId passes through a file, tests/ep/ep_bootstrap.h). Exit status: 0 when every rank passed, 77 when the
# program skipped (too few GPUs), else the first failing rank's status.
#
#   tests/ep/run_multi_gpu.sh RANKS PROGRAM [ARGS...]
#   e.g. for R in 2 4 8; do tests/ep/run_multi_gpu.sh $R build-cuda/tests/ep/moekit_ep_multi_gpu; done
#        tests/ep/run_multi_gpu.sh 8 build-cuda/bench/device/moekit_ep_bench --json ep_bench_8.json
set -u
ranks=${1:?usage: run_multi_gpu.sh RANKS PROGRAM [ARGS...]}
program=${2:?usage: run_multi_gpu.sh RANKS PROGRAM [ARGS...]}
shift 2
id_file=$(mktemp -u "${TMPDIR:-/tmp}/moekit_ep_id.XXXXXX")
pids=()
for ((r = 0; r < ranks; ++r)); do
  "$program" --rank "$r" --ranks "$ranks" --id-file "$id_file" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid"
  s=$?
  if [[ $status -eq 0 && $s -ne 0 ]]; then status=$s; fi
done
rm -f "$id_file"
exit "$status"
