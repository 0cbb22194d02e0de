#!/usr/bin/env bash
# A Debian 13 (trixie) root filesystem with Python 3.13 and the real `harbor` package, for
# the tests that hold Sandhive's output to Harbor's own code (tests/support/harbor.py): Harbor
# needs Python >= 3.12 and these hosts have Debian 12's 3.11. Run under `chroot`, it shares
# the host's network, so it reaches a server on 127.0.0.1.
#
# Idempotent: does nothing when ROOT already has this HARBOR_VERSION. Built in ROOT.new and
# moved into place at the end, so an interrupted build is never taken for a ready one.
#
# Usage: deploy/harbor-root.sh   (ROOT: $SANDHIVE_HARBOR_ROOT, default /var/lib/sandhive/harbor-root)
set -euo pipefail

root="${SANDHIVE_HARBOR_ROOT:-/var/lib/sandhive/harbor-root}"
version="0.26.0"
check="import importlib.metadata as m; assert m.version('harbor') == '$version'"

if [[ -x "$root/opt/harbor/bin/python" ]] && chroot "$root" /opt/harbor/bin/python -c "$check" 2>/dev/null; then
    echo "harbor $version root already in $root"
    exit 0
fi
mirror="${MIRROR:-}"
if [[ -z "$mirror" ]]; then
    mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}' || true)
fi
[[ -n "$mirror" ]] || { echo "cannot find a Debian mirror; set MIRROR=http://..." >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }

new="$root.new"
rm -rf "$new" && mkdir -p "$(dirname "$root")"
echo "debootstrap trixie from $mirror into $new"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates trixie "$new" "$mirror" >/dev/null
# pip inside verifies TLS with the host's bundle (the host may add its own authorities) and
# resolves names as the host does.
cp /etc/ssl/certs/ca-certificates.crt "$new/etc/ssl/certs/ca-certificates.crt"
cp -L /etc/resolv.conf "$new/etc/resolv.conf"
chroot "$new" python3 -m venv /opt/harbor
env -u PIP_FIND_LINKS chroot "$new" /opt/harbor/bin/pip install -q --disable-pip-version-check "harbor==$version"
chroot "$new" /opt/harbor/bin/python -c "$check"
rm -rf "$root" && mv "$new" "$root"
echo "harbor $version root ready in $root"
