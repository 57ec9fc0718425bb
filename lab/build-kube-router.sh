#!/usr/bin/env bash
# Builds kube-router for the kubelet-backed lab from the Go module proxy, once per version,
# into a cache directory of its own, and prints that directory on stdout. The lab runs only
# its network policy controller beside Flannel, as Flannel-plus-policy clusters do
# (docs/design/cni.md#enforcing-networkpolicy); lab/build-binaries.sh links it into its output.
#
# v2.1.0 is the newest release the module proxy serves here. The advisories against it concern
# its service proxy and its BGP routing controller, which the lab leaves off
# (--run-service-proxy=false --run-router=false), and the binary never leaves the lab.
# `go install pkg@version` builds it with its own go.mod's requirements, exactly as released.
#
# Usage: lab/build-kube-router.sh        (cache: ${KUPORT_LAB_CACHE:-/var/cache/kuport-lab})
set -euo pipefail

KUBE_ROUTER_VERSION=v2.1.0
CACHE=${KUPORT_LAB_CACHE:-/var/cache/kuport-lab}
OUT="$CACHE/kube-router-$KUBE_ROUTER_VERSION"

if [[ -x "$OUT/kube-router" ]]; then
  echo "$OUT"
  exit 0
fi

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
# Outside any module, so that no go.mod or workspace of the caller's takes part.
cd "$OUT.tmp"
GOFLAGS='' GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$OUT.tmp" go install -trimpath \
  -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
  "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" >&2
cd "$CACHE"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
