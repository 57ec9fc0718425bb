#!/bin/sh
# bench/setlookup.sh: what one nftables set lookup costs a packet, by the set kinds kuport's
# table could use (a hash set, an interval set of a concatenation, an interval set of the
# port alone), each beside the same node without the lookups, one BENCH line per kind.
# Root: it builds network namespaces (a client, a node, a server) and needs nft.
#   sudo bench/setlookup.sh                               # the figures BENCHMARKS.md records
#   sudo bench/setlookup.sh --rounds 1 --traffic 200ms    # a smoke run
set -eu
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/bench" ./bench/setlookup
"$out/bench" "$@"
