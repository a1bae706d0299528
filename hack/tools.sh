#!/usr/bin/env bash
# Builds the pinned test tooling (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok and kwokctl, helm) from the Go module proxy into a cache outside the clone, keyed by version.
# Prints the bin directory as its last line. A second run with the same pins is instant.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
HELM_VERSION=${HELM_VERSION:-3.22.0}

CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
TOOLS_DIR="$CACHE_ROOT/tools/$KEY"
BIN="$TOOLS_DIR/bin"
WORK="$TOOLS_DIR/src"
# shellcheck source=hack/lib/gobuild.sh
source "$(dirname "$0")/lib/gobuild.sh"
go_env
mkdir -p "$BIN" "$WORK"

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

have() { for b in "$@"; do [ -x "$BIN/$b" ] || return 1; done; }

build_etcd() {
  have etcd && { log "etcd v$ETCD_VERSION cached"; return; }
  log "building etcd v$ETCD_VERSION"
  go_build_etcd "$ETCD_VERSION" "$BIN" "$WORK"
}

build_kwok() {
  have kwok kwokctl && [ -d "$TOOLS_DIR/kwok-stages" ] && { log "kwok and kwokctl v$KWOK_VERSION cached"; return; }
  log "building kwok and kwokctl v$KWOK_VERSION"
  go_install "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" "$BIN" "$WORK/kwok.log"
  # kwok's own cluster tool: hack/cluster.sh brings the control plane up with it (binary runtime).
  go_install "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK_VERSION" "$BIN" "$WORK/kwokctl.log"
  # The stage definitions ship inside the module; keep the ones the cluster script uses.
  local src="$GOMODCACHE/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  rm -rf "$TOOLS_DIR/kwok-stages"; mkdir -p "$TOOLS_DIR/kwok-stages"
  cp -r "$src/node" "$src/pod" "$TOOLS_DIR/kwok-stages/"
}

build_helm() {
  # The marker records that helm carries its Kubernetes version (below); older caches rebuild.
  have helm && [ -f "$TOOLS_DIR/helm-kube-version" ] && { log "helm v$HELM_VERSION cached"; return; }
  log "building helm v$HELM_VERSION"
  # Like helm's own Makefile: the Kubernetes version its client-go is from becomes the default
  # of `helm template` and `helm lint` (otherwise v1.20, and charts needing newer fail).
  local gomod minor
  gomod=$(go mod download -json "helm.sh/helm/v3@v$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  minor=$(sed -n 's|^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*|\1|p' "$gomod" | head -n 1)
  [ -n "$minor" ] || { log "no k8s.io/client-go version in $gomod"; exit 1; }
  local kv="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  kv+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  go_install "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" "$BIN" "$WORK/helm.log" \
    "-X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION $kv"
  echo "1.$minor" >"$TOOLS_DIR/helm-kube-version"
}

build_kubernetes() {
  have kube-apiserver kube-controller-manager kube-scheduler kubectl && { log "kubernetes v$K8S_VERSION cached"; return; }
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl v$K8S_VERSION (slow when cold)"
  go_build_kubernetes "$K8S_VERSION" "$BIN" "$WORK" kube-apiserver kube-controller-manager kube-scheduler kubectl
}

start=$(date +%s)
build_etcd
build_kwok
build_helm
build_kubernetes
log "all tools ready in $(( $(date +%s) - start ))s: $BIN"
echo "$BIN"
