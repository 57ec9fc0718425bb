#!/usr/bin/env bash
# Builds Flannel for the kubelet-backed lab from the Go module proxy, once per version, into
# a cache directory of its own, and prints that directory on stdout: flanneld (the daemon,
# github.com/flannel-io/flannel) and flannel (its CNI plugin, which delegates to the bridge
# plugin). lab/build-binaries.sh runs it and links both into its output.
#
# The CNI plugin Flannel ships today, github.com/flannel-io/cni-plugin, is not served by the
# module proxy; its source was forked from containernetworking/plugins' plugins/meta/flannel,
# whose last release carrying it (v0.9.1) is served, and its ADD and DEL write the same bridge
# delegate from flanneld's subnet file (docs/design/cni.md#running-flannel-for-real).
#
# Usage: lab/build-flannel.sh            (cache: ${KUPORT_LAB_CACHE:-/var/cache/kuport-lab})
set -euo pipefail

FLANNEL_VERSION=v0.28.10
CNI_PLUGIN_VERSION=v0.9.1
TENCENT_VPC_VERSION=v1.3.75
CACHE=${KUPORT_LAB_CACHE:-/var/cache/kuport-lab}
OUT="$CACHE/flannel-$FLANNEL_VERSION-cni-$CNI_PLUGIN_VERSION"

if [[ -x "$OUT/flanneld" && -x "$OUT/flannel" ]]; then
  echo "$OUT"
  exit 0
fi

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$OUT"

# Each in a scratch module of its own: flanneld's go.mod takes containernetworking/plugins
# v1.x, which no longer has the flannel plugin, so one module cannot hold both.
build() { # build <dir> <output> <package> <ldflags> <go.mod lines>...
  local dir=$1 out=$2 pkg=$3 ldflags=$4
  shift 4
  [[ -x "$OUT/$out" ]] && return 0
  mkdir -p "$dir"
  (
    cd "$dir"
    { printf 'module kuport.lab/%s\n\ngo 1.26\n\n' "$out"; printf '%s\n' "$@"; } > go.mod
    printf '//go:build tools\n\npackage build\n\nimport _ "%s"\n' "$pkg" > tools.go
    go mod tidy >&2
    go build -trimpath -ldflags "$ldflags" -o "$OUT/$out.tmp" "$pkg" >&2
  )
  mv "$OUT/$out.tmp" "$OUT/$out"
}

# flanneld's go.mod asks for a Tencent Cloud VPC SDK release the proxy does not serve; only its
# tencentvpc backend (unused here: the lab runs vxlan) imports it, and the release flannel
# v0.28.4 was built with is served and compiles. Its udp backend needs cgo on amd64, as
# flannel's own Makefile builds it (gcc is on every machine of this kind).
CGO_ENABLED=1 build "$CACHE/build-flanneld-$FLANNEL_VERSION" flanneld github.com/flannel-io/flannel \
  "-X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" \
  "require github.com/flannel-io/flannel $FLANNEL_VERSION" \
  "replace github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc => github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc $TENCENT_VPC_VERSION"
build "$CACHE/build-flannel-cni-$CNI_PLUGIN_VERSION" flannel github.com/containernetworking/plugins/plugins/meta/flannel "" \
  "require github.com/containernetworking/plugins $CNI_PLUGIN_VERSION"
echo "$OUT"
