#!/usr/bin/env bash
# Builds (or finds cached) every image the Docker tiers use: the kind node image and kind CLI, the
# operator and stand-in images from the Dockerfile, the smg router, the NetworkPolicy enforcer,
# the probe, Prometheus and kube-state-metrics. Each script caches by version or content, so on a
# warm machine this takes seconds. `.ci/run` starts it niced in the background while the
# Docker-free tiers run, so that on a cold machine the builds use the CPU those tiers leave idle;
# `make image-test` and `make e2e-kind` then find everything built. It stops the Docker engine
# again if it started one (the engine would otherwise run, niced, under the kind cluster).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source hack/lib/docker.sh
ensure_docker docker-images
trap release_docker EXIT
log() { echo "[docker-images $(date +%H:%M:%S)] $*" >&2; }
start=$(date +%s)
for step in kind-node.sh image.sh "image.sh --sim" gateway-image.sh netpol-image.sh probe-image.sh monitoring-images.sh; do
  t=$(date +%s)
  # shellcheck disable=SC2086 # the step's arguments are words
  hack/$step >/dev/null
  log "hack/$step: $(( $(date +%s) - t ))s"
done
log "every image ready in $(( $(date +%s) - start ))s"
