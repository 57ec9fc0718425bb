#!/bin/sh
# bench/fanout.sh: many real agent streams (package agent's client, TLS and token auth) in one
# process against the real kuport-controller in the embedded lab; a class change touching
# every node, acknowledged by all (issue 13). Root: it starts the lab.
#   sudo sh bench/fanout.sh                  # the figures BENCHMARKS.md records (1,000 agents)
#   sudo sh bench/fanout.sh --agents 10      # a smoke run
set -eu
cd "$(dirname "$0")/.."
k8s=$(lab/build-binaries.sh)
make --no-print-directory build
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/fanout" ./bench/fanout
"$out/fanout" --k8s-bin "$k8s" --bin "$PWD/bin" "$@"
