#!/usr/bin/env bash
# A Debian 13 (trixie) root filesystem with Python 3.13 and the real `harbor` package, for
# the tests that hold Sandhive's output to Harbor's own code (tests/support/harbor.py): Harbor
# needs Python >= 3.12 and these hosts have Debian 12's 3.11. Run under `chroot`, it shares
# the host's network, so it reaches a server on 127.0.0.1.
#
# It also holds this checkout's Python client (clients/python), for Sandhive's Harbor
# environment (`sandhive_client.harbor_env`, docs/harbor.md, tests/harbor): re-installed on
# every run, so it always matches the checkout, and offline (no dependencies: Harbor brings
# httpx and pydantic; its build backend from the setuptools wheel Debian's python3-venv ships).
#
# Idempotent: builds the root only when ROOT lacks this HARBOR_VERSION. Built in ROOT.new and
# moved into place at the end, so an interrupted build is never taken for a ready one.
#
# Usage: deploy/harbor-root.sh   (ROOT: $SANDHIVE_HARBOR_ROOT, default /var/lib/sandhive/harbor-root)
set -euo pipefail

root="${SANDHIVE_HARBOR_ROOT:-/var/lib/sandhive/harbor-root}"
version="0.26.0"
check="import importlib.metadata as m; assert m.version('harbor') == '$version'"
checkout="$(cd "$(dirname "$0")/.." && pwd)"

install_client() {  # $1: a root with /opt/harbor
    rm -rf "$1/opt/sandhive-client"
    mkdir -p "$1/opt/sandhive-client"
    cp -r "$checkout/clients/python/pyproject.toml" "$checkout/clients/python/README.md" \
        "$checkout/clients/python/src" "$1/opt/sandhive-client/"
    rm -rf "$1/opt/sandhive-client/src/"*.egg-info
    env -u PIP_FIND_LINKS -u PIP_INDEX_URL chroot "$1" /opt/harbor/bin/pip install -q \
        --disable-pip-version-check --no-deps --force-reinstall --no-index \
        --find-links /usr/share/python-wheels /opt/sandhive-client
    chroot "$1" /opt/harbor/bin/python -c "import sandhive_client.harbor_env"
}

if [[ -x "$root/opt/harbor/bin/python" ]] && chroot "$root" /opt/harbor/bin/python -c "$check" 2>/dev/null; then
    install_client "$root"
    echo "harbor $version root already in $root; sandhive-client installed from $checkout"
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
install_client "$new"
rm -rf "$root" && mv "$new" "$root"
echo "harbor $version root ready in $root, with sandhive-client from $checkout"
