#!/bin/sh
# bench/compile.sh: compile at 10,000 mappings over 200 nodes: a full compile of
# the snapshot, and the controller's incremental compile after one mapping's endpoint moved.
# Prints one line:
#   BENCH compile n=10000 nodes=200 full_ms=<x> change_ms=<x>
#   sh bench/compile.sh               # the figures BENCHMARKS.md records
#   sh bench/compile.sh --smoke       # one iteration each, asserting it completes
set -eu
cd "$(dirname "$0")/.."
full=5x change=400x
if [ "${1:-}" = --smoke ]; then
  full=1x change=2x
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench 'CompileCluster/full$' -benchtime "$full" ./controller/compile/ >"$out"
go test -run '^$' -bench 'CompileCluster/change$' -benchtime "$change" ./controller/compile/ >>"$out"
awk '
  /^BenchmarkCompileCluster\/full/   { full = $3 / 1e6 }
  /^BenchmarkCompileCluster\/change/ { change = $3 / 1e6 }
  END {
    if (full == "" || change == "") { print "bench/compile.sh: a benchmark did not run" > "/dev/stderr"; exit 1 }
    printf "BENCH compile n=10000 nodes=200 full_ms=%.1f change_ms=%.2f\n", full, change
  }' "$out"
