#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: what the validation mode costs — a bench config's cases run by
# one moekit-bench with and without --validate (a handle made with MOEKIT_HANDLE_VALIDATE), the two taking turns
# ROUNDS times (default 2) through compare_builds.sh; build 1 / build 0 in its table is the validating run's rate
# over the plain one's.
#   bench/device/validation_cost.sh BENCH CONFIG [REGEX]
# Output folder: $OUT (default /tmp/moekit-validation-out): compare_builds.sh's builds.md and builds.tgz.
set -euo pipefail
bench=$(realpath "${1:?usage: validation_cost.sh BENCH CONFIG [REGEX]}")
config=${2:?usage: validation_cost.sh BENCH CONFIG [REGEX]}
filter=${3:-}
# compare_builds.sh runs executables; the validating one is moekit-bench with --validate appended.
wrapper_dir=$(mktemp -d)
trap 'rm -rf "$wrapper_dir"' EXIT
printf '#!/usr/bin/env bash\nexec %q "$@" --validate\n' "$bench" >"$wrapper_dir/moekit-bench-validate"
chmod +x "$wrapper_dir/moekit-bench-validate"
ROUNDS=${ROUNDS:-2} OUT=${OUT:-/tmp/moekit-validation-out} \
  bash "$(dirname "${BASH_SOURCE[0]}")/compare_builds.sh" "$config" "$filter" "$bench" "$wrapper_dir/moekit-bench-validate"
