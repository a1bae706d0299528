#!/usr/bin/env bash
# Builds the pinned Prometheus, `promtool` and `prometheus`, from the Go module proxy into a cache
# outside the clone, keyed by version (like hack/tools.sh; a separate key, so pinning Prometheus
# does not rebuild the Kubernetes tooling). Prints the bin directory as its last line; a second
# run with the same pin is instant. `promtool test rules` runs the chart's alert tests
# (hack/test.sh); `prometheus` is for tiers that scrape real pods.
#
# The Go module github.com/prometheus/prometheus tags Prometheus v3.X.Y as v0.3XX.Y
# (3.16.0 -> v0.316.0). The web UI's compiled assets are not in the module, so `prometheus`
# serves its HTTP API and /metrics but no UI pages (builds without the `builtinassets` tag).
# Service discovery: static, file and Kubernetes only (Prometheus' own `remove_all_sd` build tag
# drops the cloud SDs, whose SDKs are most of the module graph and of the compile time).
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-3.16.0}
TAGS=remove_all_sd,enable_kubernetes_sd

CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
TOOLS_DIR="$CACHE_ROOT/tools/prometheus-${PROMETHEUS_VERSION}"
BIN="$TOOLS_DIR/bin"
# shellcheck source=hack/lib/gobuild.sh
source "$(dirname "$0")/lib/gobuild.sh"

log() { printf '[prometheus %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# module_version 3.16.0 -> v0.316.0
module_version() {
  local major minor patch
  IFS=. read -r major minor patch <<<"$1"
  if [ "$major" != 3 ] || ! [[ "$minor" =~ ^[0-9]+$ && "$patch" =~ ^[0-9]+$ ]]; then
    log "PROMETHEUS_VERSION must be 3.X.Y (the module scheme v0.3XX.Y is only known for 3.x), got '$1'"
    exit 1
  fi
  printf 'v0.3%02d.%s\n' "$minor" "$patch"
}

# The tags file records what the cached binaries were built with; other tags rebuild them.
if [ -x "$BIN/promtool" ] && [ -x "$BIN/prometheus" ] && [ "$(cat "$TOOLS_DIR/build-tags" 2>/dev/null)" = "$TAGS" ]; then
  log "prometheus v$PROMETHEUS_VERSION cached"
  echo "$BIN"
  exit 0
fi

MOD=$(module_version "$PROMETHEUS_VERSION")
go_env
mkdir -p "$BIN"
LOG_FILE="$TOOLS_DIR/build.log"
log "building promtool and prometheus v$PROMETHEUS_VERSION (module $MOD; several minutes when cold)"
start=$(date +%s)
v=github.com/prometheus/common/version
ldflags="-X $v.Version=$PROMETHEUS_VERSION -X $v.Revision=$MOD -X $v.Branch=HEAD"
ldflags+=" -X $v.BuildUser=pd-operator -X $v.BuildDate=20260101-00:00:00"
# Both binaries in one `go install`: one module resolution, the shared packages compiled once.
GOBIN="$BIN" go install -trimpath -tags "$TAGS" -ldflags "-s -w $ldflags" \
  "github.com/prometheus/prometheus/cmd/promtool@$MOD" \
  "github.com/prometheus/prometheus/cmd/prometheus@$MOD" >"$LOG_FILE" 2>&1 \
  || go_fail "prometheus $MOD" "$LOG_FILE"
# The pin must be what runs: a binary reporting another version is a broken cache, not a pass.
for b in promtool prometheus; do
  "$BIN/$b" --version 2>&1 | grep -q "version $PROMETHEUS_VERSION " || {
    log "$BIN/$b does not report version $PROMETHEUS_VERSION:"; "$BIN/$b" --version >&2 || true
    rm -f "$BIN/promtool" "$BIN/prometheus"; exit 1
  }
done
secs=$(( $(date +%s) - start ))
echo "$secs" >"$TOOLS_DIR/build-seconds"
echo "$TAGS" >"$TOOLS_DIR/build-tags"
log "built in ${secs}s: $BIN"
echo "$BIN"
