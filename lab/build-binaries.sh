#!/usr/bin/env bash
# Builds the lab's real control plane and node components from the Go module proxy and caches
# the binaries by version outside the repository (docs/design/lab.md, "A real API server, built
# from the module proxy" and "A real node"): kube-apiserver, kubectl and etcd for every lab, and kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS for the kubelet-backed
# cluster the install is proven on, and links in flanneld and Flannel's CNI plugin, its CNI,
# and kube-router, its NetworkPolicy engine, which lab/build-flannel.sh and
# lab/build-kube-router.sh build into cache directories of their own. Prints the directory
# holding the binaries on stdout.
#
# Usage: lab/build-binaries.sh            (cache: ${KUPORT_LAB_CACHE:-/var/cache/kuport-lab})
set -euo pipefail

K8S_VERSION=v1.36.3
STAGING_VERSION=v0.36.3
ETCD_VERSION=v3.6.8
COREDNS_VERSION=v1.15.0
CACHE=${KUPORT_LAB_CACHE:-/var/cache/kuport-lab}
OUT="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-coredns-$COREDNS_VERSION"
K8S_CMDS=(kube-apiserver kubectl kubelet kube-controller-manager kube-scheduler kube-proxy)
ALL=("${K8S_CMDS[@]}" etcd coredns)

FLANNEL=(flanneld flannel)

complete() {
  for b in "${ALL[@]}" "${FLANNEL[@]}" kube-router; do [[ -x "$OUT/$b" ]] || return 1; done
}
if complete; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT"
flannel=$("$(dirname "$0")/build-flannel.sh")
for b in "${FLANNEL[@]}"; do ln -sfn "$flannel/$b" "$OUT/$b"; done
ln -sfn "$("$(dirname "$0")/build-kube-router.sh")/kube-router" "$OUT/kube-router"
if complete; then
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
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO

go mod tidy >&2
ver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
ver="$ver -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36"
# One go build for every missing command: it links one binary while it compiles or links
# the next, where a build per command left a core idle through each link.
missing=()
for b in "${K8S_CMDS[@]}"; do
  [[ -x "$OUT/$b" ]] || missing+=("k8s.io/kubernetes/cmd/$b")
done
[[ -x "$OUT/etcd" ]] || missing+=(./cmd/etcd)
if ((${#missing[@]})); then
  bin=$(mktemp -d "$work/bin.XXXXXX")
  go build -trimpath -ldflags "-s -w $ver" -o "$bin/" "${missing[@]}" >&2
  for f in "$bin"/*; do mv "$f" "$OUT/$(basename "$f").tmp"; done
  rmdir "$bin"
fi

# CoreDNS in a module of its own (its dependencies are not Kubernetes').
dns="$CACHE/build-coredns-$COREDNS_VERSION"
mkdir -p "$dns"
if [[ ! -x "$OUT/coredns" ]]; then
  (
    cd "$dns"
    printf 'module kuport.lab/corednsbuild\n\ngo 1.26\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" > go.mod
    cat > main.go <<'GO'
package main

import (
	_ "github.com/coredns/coredns/core/plugin"
	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
GO
    go mod tidy >&2
    go build -trimpath -ldflags "-s -w" -o "$OUT/coredns.tmp" . >&2
  )
fi
for b in "${ALL[@]}"; do
  if [[ -e "$OUT/$b.tmp" ]]; then mv "$OUT/$b.tmp" "$OUT/$b"; fi
done
echo "$OUT"
