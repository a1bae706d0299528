#!/usr/bin/env bash
# Builds the tiny client image the kind tier's network tests run (a static busybox from Debian's
# busybox-static: sh, nc, httpd, grep, sleep; its wget segfaults in this static build), once,
# and prints its reference. Needs a Docker engine: eval "$(hack/docker.sh up)".
set -euo pipefail
PROBE_IMAGE=pd-netpol-probe:busybox-1.35.0-2
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/netpol
if ! docker image inspect "$PROBE_IMAGE" >/dev/null 2>&1; then
  d="$CACHE/probe"; rm -rf "$d"; mkdir -p "$d/stage/bin" "$d/stage/www"
  (cd "$d" && apt-get download busybox-static >/dev/null 2>&1) || { echo "apt-get download busybox-static failed" >&2; exit 1; }
  dpkg-deb -x "$d"/busybox-static_*.deb "$d/x"
  cp "$d/x/bin/busybox" "$d/stage/bin/"
  for a in sh httpd nc grep sleep; do ln -s busybox "$d/stage/bin/$a"; done
  echo ok >"$d/stage/www/index.html"
  tar -C "$d/stage" -c . | docker import --change 'ENV PATH=/bin' - "$PROBE_IMAGE" >/dev/null
fi
echo "$PROBE_IMAGE"
