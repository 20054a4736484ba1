#!/usr/bin/env bash
# CTest bench_device_configs: every config that bench/device/run_all.sh runs parses. moekit-bench reads and checks
# the whole file before --filter picks its cases, so a filter that matches no case must end with "no case of ...
# matches" (exit 2), not with a config error; the GPU-sized configs are never timed here.
#   test_configs.sh MOEKIT_BENCH
set -uo pipefail
bench=${1:?usage: test_configs.sh MOEKIT_BENCH}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
configs=$(grep -o 'bench/configs/[a-z0-9_]*\.json' "$root/bench/device/run_all.sh" | sort -u)
[[ -n $configs ]] || { echo "no config found in run_all.sh"; exit 1; }
status=0
for config in $configs; do
  message=$("$bench" "$root/$config" --backend reference --filter '^no case has this name$' 2>&1 >/dev/null)
  rc=$?
  if ((rc == 2)) && [[ $message == *"no case of $root/$config matches"* ]]; then
    echo "ok   $config"
  else
    echo "FAIL $config (exit $rc): $message"
    status=1
  fi
done
exit "$status"
