#!/usr/bin/env bash
# Builds the lab's real control plane (kube-apiserver, kubectl, etcd) from the Go module
# proxy and caches the binaries by version outside the repository (DESIGN.md, "A real API
# server builds here"). Prints the directory holding the binaries on stdout.
#
# Usage: lab/build-binaries.sh            (cache: ${KUPORT_LAB_CACHE:-/var/cache/kuport-lab})
set -euo pipefail

K8S_VERSION=v1.36.3
STAGING_VERSION=v0.36.3
ETCD_VERSION=v3.6.8
CACHE=${KUPORT_LAB_CACHE:-/var/cache/kuport-lab}
OUT="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"

if [[ -x "$OUT/kube-apiserver" && -x "$OUT/kubectl" && -x "$OUT/etcd" ]]; then
  echo "$OUT"
  exit 0
fi

work="$CACHE/build-$K8S_VERSION"
mkdir -p "$work/cmd/etcd" "$OUT"
cd "$work"

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')

{
  echo "module kuport.lab/k8sbuild"
  echo
  echo "go 1.26"
  echo
  echo "require ("
  echo "	k8s.io/kubernetes $K8S_VERSION"
  echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  echo ")"
  echo
  echo "replace ("
  # Every staging module the kubernetes go.mod points at ./staging, pinned to the published
  # release instead; sample-cli-plugin is not served and not needed.
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod" |
    grep -v '^k8s.io/sample-cli-plugin$' |
    while read -r m; do echo "	$m => $m $STAGING_VERSION"; done
  echo ")"
} > go.mod

cat > cmd/etcd/main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO

cat > tools.go <<'GO'
//go:build tools

package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO

go mod tidy >&2
ver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
ver="$ver -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36"
go build -trimpath -ldflags "$ver" -o "$OUT/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
go build -trimpath -ldflags "$ver" -o "$OUT/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl >&2
go build -trimpath -o "$OUT/etcd.tmp" ./cmd/etcd >&2
for b in kube-apiserver kubectl etcd; do mv "$OUT/$b.tmp" "$OUT/$b"; done
echo "$OUT"
