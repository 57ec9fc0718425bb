#!/usr/bin/env bash
# Builds the lab's WireGuard daemon, the userspace wireguard-go
# (docs/design/mesh.md#what-runs), from the Go module proxy and caches it by version outside
# the repository, as lab/build-binaries.sh does for the control plane (in a directory of its
# own, so the two builds never share one). The module has no tags: the pin is a
# pseudo-version. Prints the path of the binary on stdout; lab/netlab runs it as each node's
# wt0 (KUPORT_WIREGUARD).
#
# Usage: lab/build-wireguard.sh            (cache: ${KUPORT_LAB_CACHE:-/var/cache/kuport-lab})
set -euo pipefail

WIREGUARD_GO_VERSION=v0.0.0-20260522210424-ecfc5a8d5446
CACHE=${KUPORT_LAB_CACHE:-/var/cache/kuport-lab}
OUT="$CACHE/wireguard-go-$WIREGUARD_GO_VERSION"

if [[ ! -x "$OUT/wireguard" ]]; then
  mkdir -p "$OUT"
  tmp=$(mktemp -d "$OUT/build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath GOBIN="$tmp" \
    go install "golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION" >&2
  mv "$tmp/wireguard" "$OUT/wireguard"
fi
echo "$OUT/wireguard"
