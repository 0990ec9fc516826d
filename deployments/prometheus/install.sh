#!/usr/bin/env bash
# Debian's prometheus package (the server and promtool) for the tests that run a real
# Prometheus (tests/test_prometheus*.py). Called by `make test`; installs only when
# missing, as root with apt-get; otherwise says why and those tests skip with the reason.
set -uo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "prometheus/promtool missing and not root: the real-Prometheus tests will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "prometheus/promtool missing and no apt-get: the real-Prometheus tests will skip"
    exit 0
fi
echo "Installing Debian's prometheus package for the metrics tests (apt-get)"
export DEBIAN_FRONTEND=noninteractive
# A service manager must not start the packaged server: the tests start their own.
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
fi
ok=0
apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null && ok=1
[ -n "$policy" ] && rm -f "$policy"
if [ "$ok" != 1 ]; then
    echo "apt-get install prometheus failed: the real-Prometheus tests will skip"
fi
exit 0
