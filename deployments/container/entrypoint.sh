#!/bin/sh
# /usr/local/bin/rbln-device-plugin in the image. As the container's first process it starts
# the daemon under tini, which forwards signals and reaps orphaned children (rbln-smi may fork
# helpers that outlive it); started any other way it runs the daemon directly.
set -eu
daemon=/opt/rbln-device-plugin/bin/rbln-device-plugin
if [ "$$" -eq 1 ]; then
    exec /usr/bin/tini -- "$daemon" "$@"
fi
exec "$daemon" "$@"
