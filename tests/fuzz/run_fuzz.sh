#!/usr/bin/env bash
# usage: run_fuzz.sh --source DIR --build DIR [--seconds N] [--jobs N] [--generator G] [--cc CC] [--cxx CXX] TARGET...
#
# The test fuzz_c_abi: configures a fuzzer build of the repository at DIR (MOEKIT_SANITIZE=fuzzer: Clang, ASan +
# UBSan + libFuzzer, reference backend only) in BUILD/build, builds the fuzz targets, then runs each TARGET
# (fuzz_TARGET) for N seconds (default 60) over a fresh copy of its seeds, tests/fuzz/corpus/TARGET/, with
# -print_final_stats=1. Fails on a failed step or on any finding (a crash, a sanitizer report, a violated property,
# a leak, a timeout); libFuzzer then leaves the input as BUILD/artifacts/TARGET-*. Prints a table of executions per
# target and writes it to BUILD/fuzz_stats.txt.
# CC/CXX: the Clang to use; empty or absent, the first clang/clang++ pair on PATH (unversioned, then clang-19 down
# to clang-14). Exits 77 (skipped) when there is none, or when it cannot link -fsanitize=fuzzer.
set -euo pipefail

source_dir= build_dir= seconds=60 jobs=2 generator= cc= cxx=
targets=()
while (($#)); do
  case $1 in
    --source) source_dir=$2; shift 2 ;;
    --build) build_dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --generator) generator=$2; shift 2 ;;
    --cc) cc=$2; shift 2 ;;
    --cxx) cxx=$2; shift 2 ;;
    -*) echo "run_fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [[ -z $source_dir || -z $build_dir || ${#targets[@]} -eq 0 ]]; then
  echo "usage: run_fuzz.sh --source DIR --build DIR [--seconds N] [--jobs N] [--generator G] [--cc CC] [--cxx CXX] TARGET..." >&2
  exit 2
fi

if [[ -z $cxx ]]; then
  for suffix in "" -19 -18 -17 -16 -15 -14; do
    if command -v "clang$suffix" >/dev/null && command -v "clang++$suffix" >/dev/null; then
      cc=$(command -v "clang$suffix") cxx=$(command -v "clang++$suffix")
      break
    fi
  done
fi
if [[ -z $cxx ]]; then
  echo "fuzz: no clang/clang++ on PATH - skipped (Debian: apt-get install clang libclang-rt-dev)"
  exit 77
fi
mkdir -p "$build_dir"
probe="$build_dir/libfuzzer_probe"
if ! printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
    "$cxx" -x c++ - -fsanitize=fuzzer,address,undefined -o "$probe" 2>"$probe.log"; then
  cat "$probe.log"
  echo "fuzz: $cxx cannot link -fsanitize=fuzzer,address,undefined - skipped (Debian: apt-get install libclang-rt-dev)"
  exit 77
fi
echo "fuzz: $("$cxx" --version | head -n1)"

step() {
  local what=$1; shift
  local t0=$SECONDS
  if ! "$@" >"$build_dir/step.log" 2>&1; then
    cat "$build_dir/step.log"
    echo "fuzz: $what failed after $((SECONDS - t0)) s"
    exit 1
  fi
  echo "fuzz: $what: $((SECONDS - t0)) s"
}

generator_args=()
[[ -n $generator ]] && generator_args=(-G "$generator")
# RelWithDebInfo: optimised like the usual build, with file:line in the reports.
step configure cmake -S "$source_dir" -B "$build_dir/build" "${generator_args[@]}" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOEKIT_SANITIZE=fuzzer -DMOEKIT_CUDA=OFF -DMOEKIT_BUILD_BENCH=OFF -DMOEKIT_BUILD_EXAMPLES=OFF
step "build the fuzz targets" cmake --build "$build_dir/build" --target moekit_fuzz_targets -j "$jobs"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
rm -rf "$build_dir/corpus" "$build_dir/artifacts"
mkdir -p "$build_dir/corpus" "$build_dir/artifacts"
stats="$build_dir/fuzz_stats.txt"
printf '%-14s %8s %12s %10s %7s  %s\n' target seconds executions exec/s corpus result >"$stats"
failed=0
for target in "${targets[@]}"; do
  corpus="$build_dir/corpus/$target"
  cp -r "$source_dir/tests/fuzz/corpus/$target" "$corpus"
  seeds=$(find "$corpus" -type f | wc -l)
  log="$build_dir/$target.log"
  t0=$SECONDS
  rc=0
  "$build_dir/build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -print_final_stats=1 -max_len=512 \
    -timeout=20 -rss_limit_mb=2048 -artifact_prefix="$build_dir/artifacts/$target-" "$corpus" >"$log" 2>&1 || rc=$?
  elapsed=$((SECONDS - t0))
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
  units=$(find "$corpus" -type f | wc -l)
  result=ok
  if ((rc != 0)) || [[ -n $(ls -A "$build_dir/artifacts" | grep "^$target-" || true) ]]; then
    result="FAILED (exit $rc)"
    failed=1
    tail -n 60 "$log"
  fi
  printf '%-14s %8s %12s %10s %7s  %s\n' "$target" "$elapsed" "${executions:-?}" "${per_second:-?}" \
    "$seeds->$units" "$result" >>"$stats"
done
cat "$stats"
if ((failed)); then
  echo "fuzz: a target found an input that breaks the property; it is under $build_dir/artifacts/"
  exit 1
fi
