#!/usr/bin/env bash
# Build the sandbox base image from Debian packages, with no container registry.
#
# For air-gapped hosts (and these CI machines): debootstrap a minimal Debian
# into a temporary folder and `docker import` it. Dockerfile.sandbox is then
# built with --build-arg BASE_IMAGE=<this tag>. Idempotent: does nothing when
# the tag already exists, unless FORCE=1.
#
# Usage: deploy/build-base-image.sh [TAG] [SUITE]
#   TAG    default sandhive-base:bookworm
#   SUITE  default bookworm
#   MIRROR default: the first URIs: line of the host's apt sources
set -euo pipefail

tag="${1:-sandhive-base:bookworm}"
suite="${2:-bookworm}"

if [[ "${FORCE:-0}" != "1" ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base image $tag already present"
    exit 0
fi

mirror="${MIRROR:-}"
if [[ -z "$mirror" ]]; then
    mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}' || true)
fi
if [[ -z "$mirror" ]]; then
    mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}' || true)
fi
if [[ -z "$mirror" ]]; then
    echo "cannot find a Debian mirror; set MIRROR=http://..." >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }

rootfs=$(mktemp -d /var/tmp/sandhive-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $suite from $mirror into $rootfs"
debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
    "$suite" "$rootfs" "$mirror" >/dev/null
# apt inside the image should read the same mirror the host uses.
echo "deb $mirror $suite main" > "$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import - "$tag" >/dev/null
echo "built $tag"
