#!/usr/bin/env bash
# Builds the operator and stand-in images from ./Dockerfile offline (hack/image.sh) on a Docker
# engine started here if none runs (hack/docker.sh), then runs them: the binary's version, that
# the operator image holds no stand-in, and the operator image's sidecar (`handshake run --once`)
# against the stand-in image's prefill, container to container. Then the router image
# (hack/gateway-image.sh): smg in PD mode, read-only and non-root as the router pod runs, answers
# a chat completion from the stand-in image's prefill and decode.
# Fails loudly when Docker cannot start: this step is never skipped.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source hack/lib/docker.sh
ensure_docker image-test
cleanup() {
  docker rm -f pd-image-test-prefill pd-image-test-decode pd-image-test-gateway >/dev/null 2>&1 || true
  release_docker
}
trap cleanup EXIT
start=$(date +%s)
IMAGE=$(hack/image.sh)
echo "[image-test] built $IMAGE in $(( $(date +%s) - start ))s: $(docker image inspect "$IMAGE" --format '{{.Size}}') bytes, user $(docker image inspect "$IMAGE" --format '{{.Config.User}}')"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
got=$(docker run --rm "$IMAGE" --version)
[ "$got" = "pd-operator $VERSION" ] || { echo "[image-test] FAIL: --version printed '$got'"; exit 1; }
SIM=$(hack/image.sh --sim)
got=$(docker run --rm "$SIM" --version)
[ "$got" = "pd-sim $VERSION" ] || { echo "[image-test] FAIL: the stand-in's --version printed '$got'"; exit 1; }
echo "[image-test] built $SIM: $(docker image inspect "$SIM" --format '{{.Size}}') bytes, user $(docker image inspect "$SIM" --format '{{.Config.User}}')"
# The operator image ships the operator only: no stand-in binary, no `sim` subcommand.
files=$(docker create "$IMAGE"); trap 'docker rm -f "$files" >/dev/null 2>&1; cleanup' EXIT
if docker export "$files" | tar -t | grep -q 'pd-sim'; then echo "[image-test] FAIL: the operator image contains pd-sim"; exit 1; fi
if docker run --rm "$IMAGE" sim engine >/dev/null 2>&1; then echo "[image-test] FAIL: the operator image runs 'sim'"; exit 1; fi
echo "[image-test] passed: the operator image holds no stand-in"
docker network inspect pd-image-test >/dev/null 2>&1 || docker network create pd-image-test >/dev/null
docker run -d --name pd-image-test-prefill --network pd-image-test "$SIM" \
  prefill --tp-size 4 --page-size 64 --host 0.0.0.0 --port 30000 --disaggregation-bootstrap-port 8998 >/dev/null
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

GATEWAY=$(hack/gateway-image.sh)
echo "[image-test] router image $GATEWAY: $(docker image inspect "$GATEWAY" --format '{{.Size}}') bytes, user $(docker image inspect "$GATEWAY" --format '{{.Config.User}}')"
docker run -d --name pd-image-test-decode --network pd-image-test "$SIM" \
  decode --tp-size 2 --page-size 64 --host 0.0.0.0 --port 30000 >/dev/null
docker run -d --name pd-image-test-gateway --network pd-image-test --read-only --user 65532:65532 "$GATEWAY" \
  --pd-disaggregation --prefill http://pd-image-test-prefill:30000 8998 --decode http://pd-image-test-decode:30000 \
  --host 0.0.0.0 --port 8000 >/dev/null
answer=$(docker run --rm --network pd-image-test --entrypoint python3 "$GATEWAY" -c '
import json, time, urllib.request
body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
for _ in range(120):
    try:
        req = urllib.request.Request("http://pd-image-test-gateway:8000/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        print(urllib.request.urlopen(req, timeout=10).read().decode()); break
    except Exception as e:
        last = e; time.sleep(0.5)
else:
    print("no answer:", last)' || true)
echo "[image-test] router answer: ${answer:0:200}"
case "$answer" in
  *'"object":"chat.completion"'*) echo "[image-test] passed: the router image routed a chat completion through the sim prefill and decode" ;;
  *) echo "[image-test] FAIL"; docker logs pd-image-test-gateway 2>&1 | tail -20; exit 1 ;;
esac
