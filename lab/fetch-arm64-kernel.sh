#!/usr/bin/env bash
# Fetches the arm64 kernel lab/armvm boots (Debian's cloud kernel: virtio, nftables and vxlan
# as modules, no firmware) as a Debian package, pinned, and unpacks it into a cache outside
# the repository by version, as lab/build-wireguard.sh caches its build. Adds arm64 to dpkg's
# foreign architectures to download it; installs nothing. Prints the unpacked directory on
# stdout; build/release's arm64 test boots it (KUPORT_ARM64_KERNEL).
#
# Usage: lab/fetch-arm64-kernel.sh            (cache: ${KUPORT_LAB_CACHE:-/var/cache/kuport-lab})
set -euo pipefail

# Debian's security archive keeps earlier builds for a while after a newer one; when this one
# is gone, move both to the newest `apt-cache policy linux-image-cloud-arm64:arm64` names.
KERNEL_PACKAGE=linux-image-6.1.0-57-cloud-arm64
KERNEL_VERSION=6.1.192-3
CACHE=${KUPORT_LAB_CACHE:-/var/cache/kuport-lab}
OUT="$CACHE/arm64-kernel-$KERNEL_VERSION"

if [[ ! -d "$OUT/boot" ]]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  fetch() { (cd "$tmp" && apt-get download -qq "$KERNEL_PACKAGE:arm64=$KERNEL_VERSION") >&2; }
  fetch 2>/dev/null || { apt-get update -qq >&2 && fetch; }
  mkdir -p "$tmp/x"
  dpkg-deb -x "$tmp"/*.deb "$tmp/x"
  mkdir -p "$CACHE"
  rm -rf "$OUT.part" && mkdir -p "$OUT.part/lib"
  mv "$tmp/x/boot" "$OUT.part/boot"
  mv "$tmp/x/lib/modules" "$OUT.part/lib/modules"
  mv "$OUT.part" "$OUT"
fi
echo "$OUT"
