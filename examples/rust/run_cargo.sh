#!/usr/bin/env bash
# cargo, run in examples/rust/ with the arguments given; what CTest's rust_* tests call (see CMakeLists.txt).
# Finds cargo on PATH, else in $CARGO_HOME/bin or ~/.cargo/bin (rustup's place, often not on a CI job's PATH).
# Exits 77, which CTest reports as skipped, when there is no cargo at all.
set -euo pipefail

cargo=$(command -v cargo || true)
for dir in "${CARGO_HOME:-}" "${HOME:-}/.cargo"; do
  if [[ -z $cargo && -n $dir && -x $dir/bin/cargo ]]; then
    cargo=$dir/bin/cargo
  fi
done
if [[ -z $cargo ]]; then
  echo "run_cargo.sh: no cargo on PATH, in \$CARGO_HOME/bin or ~/.cargo/bin: the Rust tests are skipped"
  exit 77
fi

cd "$(dirname "${BASH_SOURCE[0]}")"
exec "$cargo" "$@"
