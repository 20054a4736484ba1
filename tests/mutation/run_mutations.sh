#!/usr/bin/env bash
# Mutation check of the CPU test suite: plants plausible formula bugs into the reference backend, one at a time,
# in a private copy of the tree, rebuilds the CPU tests incrementally and runs them. A mutation the suite fails on
# is "caught"; one it passes is "MISSED". See README.md beside this file.
#
# Usage: tests/mutation/run_mutations.sh [--working-tree] [--only NAME_SUBSTRING] [MUTATIONS_FILE]
#   --working-tree  copy the working tree (tracked and untracked, not ignored files) instead of HEAD
#   --only S        run only the mutations whose name contains S
# Environment: MOEKIT_MUTATION_DIR (default /tmp/moekit-mutation; reused so reruns build incrementally),
#              MOEKIT_MUTATION_JOBS (build parallelism, default 2), MOEKIT_MUTATION_TIMEOUT (seconds per test run,
#              default 900).
# Exit status: 0 when the unmutated suite passes and every mutation applied exactly once and was caught.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
source_mode=head
only=""
list="$here/mutations.txt"
while (($#)); do
  case "$1" in
    --working-tree) source_mode=worktree ;;
    --only) only="$2"; shift ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) list="$1" ;;
  esac
  shift
done

work=${MOEKIT_MUTATION_DIR:-/tmp/moekit-mutation}
jobs=${MOEKIT_MUTATION_JOBS:-2}
test_timeout=${MOEKIT_MUTATION_TIMEOUT:-900}
tree="$work/tree"
build="$work/build"
log="$work/logs"
mkdir -p "$tree" "$build" "$log"

# ---- The mutation list: blocks of "name:", "file:", "find:", "replace:" lines; '#' starts a comment line. ----
names=() files=() finds=() replaces=()
current_name="" current_file="" current_find="" current_replace=""
flush() {
  if [[ -n $current_name ]]; then
    if [[ -z $current_file || -z $current_find ]]; then
      echo "mutations: '$current_name' lacks file: or find:" >&2
      exit 2
    fi
    if [[ -z $only || $current_name == *"$only"* ]]; then
      names+=("$current_name") files+=("$current_file") finds+=("$current_find") replaces+=("$current_replace")
    fi
  fi
  current_name="" current_file="" current_find="" current_replace=""
}
while IFS= read -r line || [[ -n $line ]]; do
  case "$line" in
    "#"*) ;;
    "name: "*) flush; current_name=${line#name: } ;;
    "file: "*) current_file=${line#file: } ;;
    "find: "*) current_find=${line#find: } ;;
    "replace: "*) current_replace=${line#replace: } ;;
    "replace:") current_replace="" ;;
    "") ;;
    *) echo "mutations: cannot read line: $line" >&2; exit 2 ;;
  esac
done < "$list"
flush
if ((${#names[@]} == 0)); then
  echo "mutations: none selected from $list" >&2
  exit 2
fi

# ---- A pristine copy of the sources; only files whose content changed are rewritten, so builds stay incremental. ----
stage="$work/stage"
rm -rf "$stage"
mkdir -p "$stage"
if [[ $source_mode == head ]]; then
  git -C "$repo" archive HEAD | tar -x -C "$stage"
else
  (cd "$repo" && git ls-files -z -c -o --exclude-standard | tar --null --ignore-failed-read -T - -c 2>/dev/null) |
    tar -x -C "$stage"
fi
(cd "$stage" && find . -type f) | while IFS= read -r f; do
  if ! cmp -s "$stage/$f" "$tree/$f"; then
    mkdir -p "$(dirname "$tree/$f")"
    cp "$stage/$f" "$tree/$f"  # cp gives it a fresh mtime: make rebuilds what depends on it
  fi
done
(cd "$tree" && find . -type f) | while IFS= read -r f; do
  [[ -e "$stage/$f" ]] || rm -f "$tree/$f"
done

# Replaces the single occurrence of a literal string; prints the number of occurrences found (exit 3 unless 1).
replace_once() {
  perl -e '
    my ($file, $find, $replace) = @ARGV;
    local $/;
    open(my $in, "<", $file) or do { print "0\n"; exit 3 };
    my $text = <$in>;
    close($in);
    my $count = () = $text =~ /\Q$find\E/g;
    print "$count\n";
    exit 3 if $count != 1;
    $text =~ s/\Q$find\E/$replace/;
    open(my $out, ">", $file) or die "cannot write $file";
    print $out $text;
    close($out);
  ' "$1" "$2" "$3"
}

build_tests() {
  cmake --build "$build" --target moekit_cpu_tests -j "$jobs" > "$1" 2>&1
}

# Runs the whole CPU suite, stopping at the first failure; prints the first failed assertion or test.
run_tests() {
  local output=$1
  (cd "$build" && timeout "$test_timeout" ./tests/moekit_cpu_tests --abort --reporter compact > "$output" 2>&1)
}

first_failure() {
  grep -m1 -E "failed|FAILED|error" "$1" | sed "s|$tree/||" | cut -c1-150
}

start=$(date +%s)
echo "mutation check: $(git -C "$repo" rev-parse --short HEAD) ($source_mode), ${#names[@]} mutations, work dir $work"

# ---- Every pattern must match exactly once in the pristine tree before anything is built. ----
pattern_problems=0
for i in "${!names[@]}"; do
  scratch="$work/pattern-check"
  cp "$tree/${files[$i]}" "$scratch" 2>/dev/null || : > "$scratch"
  count=$(replace_once "$scratch" "${finds[$i]}" "${replaces[$i]}")
  if [[ $count != 1 ]]; then
    echo "pattern of '${names[$i]}' occurs $count times in ${files[$i]} (must be exactly once)"
    pattern_problems=$((pattern_problems + 1))
  fi
done
rm -f "$work/pattern-check"

# ---- The unmutated suite must build and pass, or no result below means anything. ----
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$tree" -B "$build" -DMOEKIT_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_BENCH=OFF \
    -DMOEKIT_BUILD_EXAMPLES=OFF > "$log/configure.log" 2>&1 || { echo "configure failed: $log/configure.log"; exit 2; }
fi
if ! build_tests "$log/baseline-build.log"; then
  echo "the unmutated tree does not build: $log/baseline-build.log"
  exit 2
fi
baseline_start=$(date +%s)
if ! run_tests "$log/baseline-test.log"; then
  echo "the unmutated suite fails, so no mutation can be judged: $log/baseline-test.log"
  first_failure "$log/baseline-test.log"
  exit 2
fi
echo "unmutated suite passes ($(( $(date +%s) - baseline_start )) s)"

# ---- One mutation at a time. ----
results=() details=() seconds=()
missed=0
for i in "${!names[@]}"; do
  t0=$(date +%s)
  file="$tree/${files[$i]}"
  cp "$stage/${files[$i]}" "$file"
  tag=$(printf '%02d' "$i")
  count=$(replace_once "$file" "${finds[$i]}" "${replaces[$i]}")
  if [[ $count != 1 ]]; then
    results+=("NO-MATCH") details+=("pattern occurs $count times")
  elif ! build_tests "$log/$tag-build.log"; then
    results+=("BUILD-FAIL") details+=("see $log/$tag-build.log")
  elif run_tests "$log/$tag-test.log"; then
    results+=("MISSED") details+=("the whole suite passed")
  else
    status=$?
    if ((status == 124)); then
      results+=("caught") details+=("timed out after $test_timeout s")
    else
      results+=("caught") details+=("$(first_failure "$log/$tag-test.log")")
    fi
  fi
  [[ ${results[-1]} == caught ]] || missed=$((missed + 1))
  cp "$stage/${files[$i]}" "$file"
  seconds+=("$(( $(date +%s) - t0 ))")
  printf '%-7s %-10s %s\n' "[$tag]" "${results[-1]}" "${names[$i]}"
done
# Leave the build matching the pristine tree for the next run.
build_tests "$log/restore-build.log" || true

echo
printf '%-3s %-10s %4s  %-75s %s\n' "#" "result" "sec" "mutation" "file"
for i in "${!names[@]}"; do
  printf '%-3s %-10s %4s  %-75s %s\n' "$i" "${results[$i]}" "${seconds[$i]}" "${names[$i]}" "${files[$i]}"
  printf '%-3s %-10s %4s    %s\n' "" "" "" "${details[$i]}"
done
echo
echo "caught $(( ${#names[@]} - missed )) of ${#names[@]}; pattern problems $pattern_problems;" \
  "$(( $(date +%s) - start )) s"
if ((missed > 0 || pattern_problems > 0)); then
  exit 1
fi
exit 0
