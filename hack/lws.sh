#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (sigs.k8s.io/lws, pinned) from the Go module proxy into the
# tools cache, keyed by version, for the side-by-side controller benchmark. Also keeps the module's
# CRD and webhook manifests next to the binary. Prints the directory as its last line; a second
# run with the same pin is instant.
#
# `go install sigs.k8s.io/lws/cmd@v0.7.0` does not work here: it looks up the module's deprecation
# through the proxy's version list, which the proxy refuses (403). A wrapper module requiring the
# tagged release builds the same package with lws's own dependency versions (no replaces in its go.mod).
set -euo pipefail

LWS_VERSION=${LWS_VERSION:-0.7.0}
CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
DIR="$CACHE_ROOT/tools/lws-$LWS_VERSION"
# shellcheck source=hack/lib/gobuild.sh
source "$(dirname "$0")/lib/gobuild.sh"

log() { printf '[lws %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$DIR/bin/lws-controller" ] && [ -f "$DIR/crd.yaml" ] && [ -f "$DIR/webhooks.yaml" ]; then
  log "lws v$LWS_VERSION cached"
  echo "$DIR"
  exit 0
fi
go_env
mkdir -p "$DIR/bin" "$DIR/src"
log "building lws v$LWS_VERSION"
lg="$DIR/src/build.log"
(
  set -e
  cd "$DIR/src"
  rm -f go.mod go.sum
  go mod init local.test/lwsbin && go mod edit -go="$GO_LINE" -require="sigs.k8s.io/lws@v$LWS_VERSION"
  printf 'package tools\n\nimport _ "sigs.k8s.io/lws/cmd"\n' > tools.go
  go mod tidy
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=v$LWS_VERSION" \
    -o "$DIR/bin/lws-controller" sigs.k8s.io/lws/cmd
) >"$lg" 2>&1 || go_fail "lws v$LWS_VERSION" "$lg"
mod="$GOMODCACHE/sigs.k8s.io/lws@v$LWS_VERSION"
cp "$mod/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$DIR/crd.yaml"
cp "$mod/config/webhook/manifests.yaml" "$DIR/webhooks.yaml"
log "lws v$LWS_VERSION ready: $DIR"
echo "$DIR"
