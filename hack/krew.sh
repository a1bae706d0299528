#!/usr/bin/env bash
# The krew packaging of `kubectl pd` (hack/krew/pd.yaml), and its test with krew itself.
#   hack/krew.sh package OUT_DIR  the release archive kubectl-pd_<version>_linux_amd64.tar.gz and
#                                 its manifest pd.yaml (version, URL, sha256 filled in) in OUT_DIR
#   hack/krew.sh test             package, check the manifest with krew's validate-krew-manifest,
#                                 install it with `krew install --manifest --archive` into a
#                                 throwaway KREW_ROOT and run the installed `kubectl pd` (make test)
# Env: PD_KREW_HOMEPAGE and PD_KREW_BASE_URL (where releases are published); KUBECTL_PD, a built
# kubectl-pd binary to package (default: cargo build --release -p kubectl-pd).
# krew v0.4.3 (the newest the Go module proxy serves) is built once into the tool cache.
set -euo pipefail
cd "$(dirname "$0")/.."
KREW_VERSION=${KREW_VERSION:-0.4.3}
HOMEPAGE=${PD_KREW_HOMEPAGE:-https://github.com/pd-operator/pd-operator}
BASE_URL=${PD_KREW_BASE_URL:-$HOMEPAGE/releases/download}
CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
KREW_BIN="$CACHE_ROOT/tools/krew-$KREW_VERSION/bin"
# shellcheck source=hack/lib/gobuild.sh
source hack/lib/gobuild.sh

log() { printf '[krew %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

build_krew() {
  if [ -x "$KREW_BIN/krew" ] && [ -x "$KREW_BIN/validate-krew-manifest" ]; then return; fi
  log "building krew v$KREW_VERSION and validate-krew-manifest from the Go module proxy"
  go_env
  mkdir -p "$KREW_BIN"
  go_install "sigs.k8s.io/krew/cmd/krew@v$KREW_VERSION" "$KREW_BIN" "$KREW_BIN/../krew.log"
  go_install "sigs.k8s.io/krew/cmd/validate-krew-manifest@v$KREW_VERSION" "$KREW_BIN" "$KREW_BIN/../validate.log"
}

package() {
  local out=$1 version binary stage
  version="v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
  binary=${KUBECTL_PD:-}
  if [ -z "$binary" ]; then
    cargo build --locked --quiet --release -p kubectl-pd
    binary="${CARGO_TARGET_DIR:-target}/release/kubectl-pd"
  fi
  mkdir -p "$out"
  stage=$(mktemp -d)
  cp "$binary" "$stage/kubectl-pd"
  cp hack/krew/LICENSE "$stage/LICENSE"
  local archive="kubectl-pd_${version}_linux_amd64.tar.gz"
  tar -C "$stage" -czf "$out/$archive" kubectl-pd LICENSE
  rm -rf "$stage"
  local sha
  sha=$(sha256sum "$out/$archive" | cut -d' ' -f1)
  sed -e "s|__VERSION__|$version|" -e "s|__HOMEPAGE__|$HOMEPAGE|" -e "s|__URI__|$BASE_URL/$version/$archive|" \
    -e "s|__SHA256__|$sha|" hack/krew/pd.yaml >"$out/pd.yaml"
  log "$out/$archive ($sha) and $out/pd.yaml"
  echo "$out/$archive"
}

test_install() {
  build_krew
  local work archive
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  archive=$(package "$work/dist")
  # Its own install step downloads the URL, which is not published from here: krew installs the
  # local archive below instead, and the LICENSE check is repeated there.
  "$KREW_BIN/validate-krew-manifest" -manifest "$work/dist/pd.yaml" -skip-install >"$work/validate.log" 2>&1 \
    || { cat "$work/validate.log" >&2; log "FAILED: validate-krew-manifest"; return 1; }
  # krew installs from the local archive; the index is never fetched for --manifest installs.
  KREW_ROOT="$work/root" "$KREW_BIN/krew" install --manifest="$work/dist/pd.yaml" --archive="$archive" >"$work/install.log" 2>&1 \
    || { cat "$work/install.log" >&2; log "FAILED: krew install"; return 1; }
  local installed="$work/root/bin/kubectl-pd"
  [ -x "$installed" ] || { log "FAILED: krew put no kubectl-pd in \$KREW_ROOT/bin"; return 1; }
  [ -f "$work/root/store/pd/$(basename "$archive" | sed 's/^kubectl-pd_\(v[^_]*\)_.*/\1/')/LICENSE" ] \
    || { log "FAILED: no LICENSE installed with the plugin (krew-index requires one)"; return 1; }
  "$installed" --help | grep -q '^Usage: kubectl pd <COMMAND>' || { log "FAILED: the installed plugin's --help"; return 1; }
  log "the manifest validates, krew installs the archive, and the installed kubectl pd runs"
}

case "${1:-}" in
  package) package "${2:?usage: hack/krew.sh package OUT_DIR}" ;;
  test) test_install ;;
  *) echo "usage: hack/krew.sh package OUT_DIR | test" >&2; exit 2 ;;
esac
