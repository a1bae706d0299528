#!/usr/bin/env bash
# A Docker engine for building images here: uses a running one, else installs Debian's docker.io
# and starts dockerd with its own data root, registering a runc wrapper that drops
# CAP_SYS_RESOURCE (missing from this machine's bounding set; privileged containers such as kind
# nodes fail without it).
#   hack/docker.sh up     # prints `export DOCKER_HOST=...`
#   hack/docker.sh down   # stops the dockerd this script started
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${PD_DOCKER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/docker}
SOCK="$STATE/docker.sock"
log() { echo "[docker $(date +%H:%M:%S)] $*" >&2; }
# The containerd our dockerd runs; it can outlive dockerd by a moment, and a new dockerd cannot
# start its own on the same socket until it is gone.
our_containerd() { pgrep -f -- "--config $STATE/exec/containerd/containerd.toml" || true; }
wait_containerd_gone() {
  for _ in $(seq 1 50); do [ -z "$(our_containerd)" ] && return 0; sleep 0.2; done
  kill $(our_containerd) 2>/dev/null || true
  for _ in $(seq 1 50); do [ -z "$(our_containerd)" ] && return 0; sleep 0.2; done
  log "containerd of a previous dockerd is still running: $(our_containerd)"
}

case "${1:-up}" in
  down)
    if [ -f "$STATE/dockerd.pid" ]; then
      pid=$(cat "$STATE/dockerd.pid")  # dockerd removes the file itself when it exits
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      rm -f "$STATE/dockerd.pid"
    fi
    wait_containerd_gone
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

if [ -S "$SOCK" ] && DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1; then
  echo "export DOCKER_HOST=unix://$SOCK"; exit 0
fi
if [ -z "${DOCKER_HOST:-}" ] && docker info >/dev/null 2>&1; then
  echo "# using the running Docker engine"; exit 0
fi
[ "$(id -u)" = 0 ] || { log "starting dockerd needs root"; exit 1; }
if ! command -v dockerd >/dev/null; then
  log "installing docker.io from Debian"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io iptables >&2
fi
mkdir -p "$STATE/data" "$STATE/exec"
install -m 0755 "$ROOT/hack/image/runc-nosysresource" "$STATE/runc-nosysresource"
wait_containerd_gone
log "starting dockerd (data root $STATE/data)"
dockerd --host "unix://$SOCK" --data-root "$STATE/data" --exec-root "$STATE/exec" --pidfile "$STATE/dockerd.pid" \
  --add-runtime "nosysresource=$STATE/runc-nosysresource" --default-runtime nosysresource \
  >"$STATE/dockerd.log" 2>&1 &
for _ in $(seq 1 120); do
  DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1 && { echo "export DOCKER_HOST=unix://$SOCK"; exit 0; }
  sleep 0.5
done
log "dockerd did not come up; last log lines:"; tail -20 "$STATE/dockerd.log" >&2; exit 1
