#!/usr/bin/env bash
# Installs the Debian packages the real-node tests (make e2e, make test) and the image's
# init check (tini, test_deploy_image.py) need, when run as root on a Debian-like machine
# with apt-get. Idempotent: nothing happens when they are
# present. Otherwise it says what is missing and exits 0: the tests then skip with that
# reason instead of failing.
set -euo pipefail
packages=(runc buildah debootstrap umoci busybox-static containernetworking-plugins gcc tini
          libc6-dev openssl iproute2 util-linux)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "real-node tests: missing Debian packages ${missing[*]} (needs root and apt-get);" \
         "they will be skipped" >&2
    exit 0
fi
echo "real-node tests: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
