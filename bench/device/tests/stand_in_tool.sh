# Sourced by the bench/device script tests: stand-ins for moekit-bench and torch_bench.py.
#   make_stand_in PATH "RATE RATE ..." RECORDS
# writes an executable PATH whose Nth run (counted in its own folder) writes to its --out file the JSON
# '{"cases": [RECORDS]}' with the Nth RATE in place of RECORDS' %s, and logs its arguments to its folder's `args`
# and, after its folder's name, to `turns` in the folder above (the order the tools ran in).
make_stand_in() {
  local path=$1 rates=$2 records=$3
  mkdir -p "$(dirname "$path")"
  cat >"$path" <<STAND_IN
#!/usr/bin/env bash
dir=\$(dirname "\$0")
run=\$(cat "\$dir/runs" 2>/dev/null || echo 0)
echo \$((run + 1)) >"\$dir/runs"
echo "\$*" >>"\$dir/args"
echo "\$(basename "\$dir") \$*" >>"\$dir/../turns"
rates=($rates)
out=""
while [[ \$# -gt 0 ]]; do [[ \$1 == --out ]] && out=\$2; shift; done
printf '{"cases": [$records]}\n' "\${rates[\$run]}" >"\$out"
STAND_IN
  chmod +x "$path"
}
