#!/usr/bin/env bash
# Builds the PD router image (SGLang's model gateway, smg) from hack/image/gateway.Dockerfile with
# no registry: both bases are Debian bookworm's python3 from debootstrap, assembled locally and
# cached like hack/image.sh's; smg and its dependencies come from PyPI during the build. The tag is
# src/api/lib.rs's DEFAULT_ROUTER_IMAGE, so a built tag is the cache: kept until the smg version moves.
# Prints the image reference.
#   hack/gateway-image.sh      (needs a Docker engine: eval "$(hack/docker.sh up)")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=hack/lib/smg.sh
source "$ROOT/hack/lib/smg.sh"
log() { echo "[gateway-image $(date +%H:%M:%S)] $*" >&2; }
# shellcheck source=hack/lib/rootfs.sh
source "$ROOT/hack/lib/rootfs.sh"

if image_exists "$SMG_IMAGE" && [ "${PD_REBUILD:-0}" != 1 ]; then
  echo "$SMG_IMAGE"; exit 0
fi
start=$(date +%s)
python_bases
log "docker build $SMG_IMAGE (smg $SMG_VERSION from PyPI; BUILDER_IMAGE=$PY_BUILDER RUNTIME_IMAGE=$PY_RUNTIME)"
DOCKER_BUILDKIT=0 docker build --network host -q -f hack/image/gateway.Dockerfile --build-arg "BUILDER_IMAGE=$PY_BUILDER" \
  --build-arg "RUNTIME_IMAGE=$PY_RUNTIME" --build-arg "SMG_VERSION=$SMG_VERSION" -t "$SMG_IMAGE" hack/image >&2
log "built in $(( $(date +%s) - start ))s"
echo "$SMG_IMAGE"
