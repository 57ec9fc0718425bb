#!/bin/sh
# bench/link.sh: kuport's link against the path without it, in one run: one TCP flow and the
# request/response p50 over the link to a pod on the serving node, over the same to a pod on
# the accepting node, as the programs set the link up and as a program without its source
# ports does (the device kuport made before), two BENCH lines. Root: it builds network
# namespaces (a client, two nodes, a pod on each).
#   sudo bench/link.sh                                 # the figures BENCHMARKS.md records
#   sudo bench/link.sh --rounds 1 --traffic 200ms      # a smoke run
set -eu
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/bench" ./bench/link
"$out/bench" "$@"
