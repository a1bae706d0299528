#!/usr/bin/env bash
# Builds, with nothing pulled, the two monitoring images of the kind tier (hack/kind/prometheus.yaml):
#   - Prometheus, the binary hack/prometheus.sh builds from the Go module proxy (pinned there);
#   - kube-state-metrics, built here from the Go module proxy (k8s.io/kube-state-metrics/v2,
#     pinned below: the newest release the proxy serves, on client-go v0.36, which a 1.37
#     apiserver serves within the supported skew).
# Both are static Go binaries (CGO_ENABLED=0) in an image of their own: the binary, an /etc/passwd
# naming `nobody`, and /tmp; `docker import`ed, like hack/probe-image.sh. Binaries are cached by
# version under ~/.cache/pd-operator/tools; an image's tag names its version and a label names
# the recipe, so editing this script rebuilds under the same tag. Test tooling only: nothing of the
# product is built with Go. Prints PROMETHEUS_IMAGE=... and KSM_IMAGE=... lines.
# Needs a Docker engine (eval "$(hack/docker.sh up)").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

KSM_VERSION=${KSM_VERSION:-2.20.0}
KSM_MODULE=k8s.io/kube-state-metrics/v2
CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
KSM_DIR="$CACHE_ROOT/tools/kube-state-metrics-$KSM_VERSION"
# shellcheck source=hack/lib/gobuild.sh
source "$ROOT/hack/lib/gobuild.sh"
log() { printf '[monitoring-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
docker info >/dev/null 2>&1 || { log "no Docker engine: run eval \"\$(hack/docker.sh up)\" first"; exit 1; }

# kube_state_metrics_bin: the cached binary, built when missing (several minutes cold).
kube_state_metrics_bin() {
  if [ ! -x "$KSM_DIR/bin/kube-state-metrics" ]; then
    local t; t=$(date +%s)
    log "building kube-state-metrics v$KSM_VERSION from the Go module proxy"
    go_env
    # From a wrapper module that requires the release (`go install module@version` asks the proxy
    # for the module's version list, which it refuses here): the same build list as the release's,
    # whose go.sum covers the packages main imports beyond pkg/app (internal/, not importable here).
    local d="$KSM_DIR/src" lg="$KSM_DIR/build.log" v=github.com/prometheus/common/version
    rm -rf "$d"; mkdir -p "$d" "$KSM_DIR/bin"
    ( cd "$d" && go mod init local.test/ksmbin && go mod edit -go=$GO_LINE \
        && go mod edit -require="$KSM_MODULE@v$KSM_VERSION" \
        && printf 'package tools\n\nimport _ "%s/pkg/app"\n' "$KSM_MODULE" >tools.go \
        && go mod tidy \
        && cat "$GOMODCACHE/$KSM_MODULE@v$KSM_VERSION/go.sum" >>go.sum \
        && go build -trimpath -o "$KSM_DIR/bin/kube-state-metrics" -ldflags "-s -w -X $v.Version=v$KSM_VERSION \
             -X $v.Revision=module-proxy -X $v.Branch=HEAD -X $v.BuildUser=pd-operator" "$KSM_MODULE" ) >"$lg" 2>&1 \
      || go_fail "kube-state-metrics v$KSM_VERSION" "$lg"
    "$KSM_DIR/bin/kube-state-metrics" version 2>&1 | grep -q "v$KSM_VERSION" \
      || { log "the built kube-state-metrics does not report v$KSM_VERSION"; rm -f "$KSM_DIR/bin/kube-state-metrics"; exit 1; }
    echo "$(( $(date +%s) - t ))" >"$KSM_DIR/build-seconds"
    log "kube-state-metrics built in $(( $(date +%s) - t ))s"
  fi
  echo "$KSM_DIR/bin/kube-state-metrics"
}

# static_image TAG BINARY ENTRYPOINT_JSON: the binary at /bin/<name>, run as nobody.
static_image() {
  local tag=$1 bin=$2 entry=$3 recipe stage
  recipe=$( (cat "$0"; sha256sum "$bin") | sha256sum | cut -c1-10)
  if [ "$(docker image inspect -f '{{index .Config.Labels "pd.recipe"}}' "$tag" 2>/dev/null)" = "$recipe" ]; then
    log "$tag cached"; return
  fi
  stage=$(mktemp -d "$CACHE_ROOT/tools/monitoring-stage.XXXXXX")
  mkdir -p "$stage/bin" "$stage/etc" "$stage/tmp"
  chmod 1777 "$stage/tmp"
  install -m 0755 "$bin" "$stage/bin/"
  printf 'root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$stage/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$stage/etc/group"
  tar -C "$stage" -c . | docker import --change "ENTRYPOINT $entry" --change 'USER 65534:65534' \
    --change "LABEL pd.recipe=$recipe" - "$tag" >/dev/null
  rm -rf "$stage"
  log "$tag imported"
}

start=$(date +%s)
PROM_BIN=$("$ROOT/hack/prometheus.sh" | tail -1)
PROM_VERSION=$("$PROM_BIN/prometheus" --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\) .*/\1/p')
PROMETHEUS_IMAGE=pd-prometheus:v$PROM_VERSION
KSM_IMAGE=pd-kube-state-metrics:v$KSM_VERSION
static_image "$PROMETHEUS_IMAGE" "$PROM_BIN/prometheus" '["/bin/prometheus"]'
KSM_BIN=$(kube_state_metrics_bin)
static_image "$KSM_IMAGE" "$KSM_BIN" '["/bin/kube-state-metrics"]'
log "ready in $(( $(date +%s) - start ))s"
echo "PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE"
echo "KSM_IMAGE=$KSM_IMAGE"
