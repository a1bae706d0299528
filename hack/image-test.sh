#!/usr/bin/env bash
# Builds the operator image from ./Dockerfile offline (hack/image.sh) on a Docker engine started
# here if none runs (hack/docker.sh), then runs it: the binary's version, and the image's sidecar
# (`handshake run --once`) against the image's prefill stand-in, container to container.
# Fails loudly when Docker cannot start: this step is never skipped.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source hack/lib/docker.sh
ensure_docker image-test
cleanup() {
  docker rm -f pd-image-test-prefill >/dev/null 2>&1 || true
  release_docker
}
trap cleanup EXIT
start=$(date +%s)
IMAGE=$(hack/image.sh)
echo "[image-test] built $IMAGE in $(( $(date +%s) - start ))s: $(docker image inspect "$IMAGE" --format '{{.Size}}') bytes, user $(docker image inspect "$IMAGE" --format '{{.Config.User}}')"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
got=$(docker run --rm "$IMAGE" --version)
[ "$got" = "pd-operator $VERSION" ] || { echo "[image-test] FAIL: --version printed '$got'"; exit 1; }
docker network inspect pd-image-test >/dev/null 2>&1 || docker network create pd-image-test >/dev/null
docker run -d --name pd-image-test-prefill --network pd-image-test "$IMAGE" \
  sim prefill --tp-size 4 --page-size 64 --host 0.0.0.0 --port 30000 --disaggregation-bootstrap-port 8998 >/dev/null
# The stand-in advertises its container IP as rank_ip (SGLANG_HOST_IP is unset): the sidecar must
# look up and dial every rank across the Docker network.
decode='{"attn_tp_size": 2, "page_size": 64, "kv_cache_dtype": "auto", "kv_pool": "mla"}'
report=$(docker run --rm -i --network pd-image-test "$IMAGE" \
  handshake run --once --timeout 30s --decode /dev/stdin --prefill pd-image-test-prefill:8998 <<<"$decode" || true)
echo "[image-test] sidecar report: ${report:0:200}..."
case "$report" in
  '{"ok":true'*) echo "[image-test] passed: the image's sidecar completed the handshake against the image's prefill stand-in" ;;
  *) echo "[image-test] FAIL"; docker logs pd-image-test-prefill 2>&1 | tail -20; exit 1 ;;
esac
