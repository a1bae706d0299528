#!/usr/bin/env bash
# Builds the pinned test tooling (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok, helm) from the Go module proxy into a cache outside the clone, keyed by version.
# Prints the bin directory as its last line. A second run with the same pins is instant.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
HELM_VERSION=${HELM_VERSION:-3.22.0}
GO_LINE=1.26.0

CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
TOOLS_DIR="$CACHE_ROOT/tools/$KEY"
BIN="$TOOLS_DIR/bin"
WORK="$TOOLS_DIR/src"
export GOMODCACHE="$CACHE_ROOT/go/mod"
export GOCACHE="$CACHE_ROOT/go/build"
export GOFLAGS="-modcacherw -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
mkdir -p "$BIN" "$WORK"

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { log "FAILED to build $1 (see $2)"; tail -n 30 "$2" >&2 || true; exit 1; }

command -v go >/dev/null || { log "go is not installed: it is needed to build the test tools"; exit 1; }

have() { for b in "$@"; do [ -x "$BIN/$b" ] || return 1; done; }

build_etcd() {
  have etcd && { log "etcd v$ETCD_VERSION cached"; return; }
  log "building etcd v$ETCD_VERSION"
  local d="$WORK/etcd" lg="$WORK/etcd.log"
  rm -rf "$d"; mkdir -p "$d"
  ( cd "$d" && go mod init local.test/etcdbin && go mod edit -go=$GO_LINE \
      && go mod edit -require=go.etcd.io/etcd/server/v3@v$ETCD_VERSION \
      && printf 'package tools\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' > tools.go \
      && go mod tidy \
      && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3 ) >"$lg" 2>&1 \
    || fail "etcd v$ETCD_VERSION" "$lg"
}

build_kwok() {
  have kwok && [ -d "$TOOLS_DIR/kwok-stages" ] && { log "kwok v$KWOK_VERSION cached"; return; }
  log "building kwok v$KWOK_VERSION"
  local lg="$WORK/kwok.log"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" >"$lg" 2>&1 \
    || fail "kwok v$KWOK_VERSION" "$lg"
  # The stage definitions ship inside the module; keep the ones the cluster script uses.
  local src="$GOMODCACHE/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  rm -rf "$TOOLS_DIR/kwok-stages"; mkdir -p "$TOOLS_DIR/kwok-stages"
  cp -r "$src/node" "$src/pod" "$TOOLS_DIR/kwok-stages/"
}

build_helm() {
  have helm && { log "helm v$HELM_VERSION cached"; return; }
  log "building helm v$HELM_VERSION"
  local lg="$WORK/helm.log"
  GOBIN="$BIN" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" >"$lg" 2>&1 || fail "helm v$HELM_VERSION" "$lg"
}

build_kubernetes() {
  have kube-apiserver kube-controller-manager kube-scheduler kubectl && { log "kubernetes v$K8S_VERSION cached"; return; }
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl v$K8S_VERSION (slow when cold)"
  local d="$WORK/k8s" lg="$WORK/k8s.log" staging="v0.${K8S_VERSION#1.}"
  local minor; minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  rm -rf "$d"; mkdir -p "$d"
  {
    cd "$d"
    go mod init local.test/k8sbin && go mod edit -go=$GO_LINE
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
    # k8s.io/kubernetes points its staging modules at local paths its zip lacks: use the tags.
    for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace="$m=$m@$staging"
    done
    printf 'package tools\n\nimport (\n' > tools.go
    for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
      printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c" >> tools.go
    done
    printf ')\n' >> tools.go
    go mod tidy
    local ldf="-s -w" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ldf="$ldf -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
    done
    go build -trimpath -ldflags "$ldf" -o "$BIN/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  } >"$lg" 2>&1 || fail "kubernetes v$K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl)" "$lg"
}

start=$(date +%s)
build_etcd
build_kwok
build_helm
build_kubernetes
log "all tools ready in $(( $(date +%s) - start ))s: $BIN"
echo "$BIN"
