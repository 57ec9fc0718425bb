#!/bin/sh
# bench/lab.sh NAME [flags]: builds and runs the lab benchmark bench/NAME (bench/control.sh and
# bench/fanout.sh call it): lab/build-binaries.sh (etcd, kube-apiserver, kube-proxy), make
# build (the kuport binaries the lab runs), then bench/NAME with their locations and flags.
set -eu
cd "$(dirname "$0")/.."
name=$1
shift
k8s=$(lab/build-binaries.sh)
make --no-print-directory build
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/$name" "./bench/$name"
"$out/$name" --k8s-bin "$k8s" --bin "$PWD/bin" "$@"
