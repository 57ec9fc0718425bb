#!/bin/sh
# bench/lab.sh NAME [flags]: builds and runs the lab benchmark bench/NAME (bench/control.sh and
# bench/fanout.sh call it): lab/build-binaries.sh (etcd, kube-apiserver, kube-proxy),
# lab/build-wireguard.sh (the lab mesh's wireguard-go), make build (the kuport binaries the
# lab runs), then bench/NAME with their locations and flags.
set -eu
cd "$(dirname "$0")/.."
name=$1
shift
k8s=$(lab/build-binaries.sh)
KUPORT_WIREGUARD=$(lab/build-wireguard.sh)
export KUPORT_WIREGUARD
make --no-print-directory build
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/$name" "./bench/$name"
"$out/$name" --k8s-bin "$k8s" --bin "$PWD/bin" "$@"
