#!/bin/sh
# bench/datapath.sh: kuport's datapath at 1, 1,000 and 10,000 mappings in one run,
# one BENCH line per size, then 10,000 mappings of which 100 are 1,000-port ranges and one
# 16,384-port UDP range. Root: it builds network namespaces (a client, a node, a pod).
#   sudo bench/datapath.sh                 # the figures BENCHMARKS.md records
#   sudo bench/datapath.sh --mappings 1,10 --ranged 10:2 --traffic 200ms   # a smoke run
set -eu
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The agent as the Makefile builds it for the images (static, no cgo).
CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$out/kuport-agent" ./cmd/kuport-agent
go build -o "$out/bench" ./bench/datapath
"$out/bench" --agent "$out/kuport-agent" "$@"
