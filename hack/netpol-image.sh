#!/usr/bin/env bash
# Builds, with nothing pulled, the image of the NetworkPolicy enforcer of the kind tier:
# kube-router's network policy controller (firewall only: no routing, no service proxy), its
# binary built from the Go module proxy, on a Debian bookworm rootfs carrying iptables and ipset.
# Cached by kube-router version under ~/.cache/pd-operator/netpol; the image tag names the version
# and a label names the recipe, so editing this script rebuilds under the same tag. Prints the
# image reference. Needs a Docker engine (eval "$(hack/docker.sh up)").
#
# Why kube-router and not kube-network-policies (sigs.k8s.io): the latter only queues packets with
# the native nftables `queue` expression, and this machine's kernel has CONFIG_NFT_QUEUE unset
# (`nft add rule ... queue num 98 bypass` fails with ENOENT). kube-router enforces with iptables
# and ipset (xt_set, conntrack, NFLOG, REJECT), which this kernel has. See docs/kind.md.
#
# iptables backend: the image runs Kubernetes' iptables-wrapper (the copy kube-router ships in its
# module, build/image-assets/iptables-wrapper-installer.sh, as its own image does): on first use it
# picks iptables-nft or iptables-legacy by where kubelet's KUBE-IPTABLES-HINT/KUBE-KUBELET-CANARY
# chains are, else by rule count, so the rules land in the backend the node and kube-proxy use.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-2.1.0}
SUITE=bookworm
PACKAGES=iptables,ipset
MODULE=github.com/cloudnativelabs/kube-router/v2

CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
DIR="$CACHE_ROOT/netpol/kube-router-$KUBE_ROUTER_VERSION"
BIN="$DIR/bin"
WORK="$DIR/src"
TAG=pd-kube-router:v$KUBE_ROUTER_VERSION
# shellcheck source=hack/lib/gobuild.sh
source "$ROOT/hack/lib/gobuild.sh"
# shellcheck source=hack/lib/rootfs.sh
source "$ROOT/hack/lib/rootfs.sh"
go_env
mkdir -p "$BIN" "$WORK"
log() { printf '[netpol-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

start=$(date +%s)
docker info >/dev/null 2>&1 || { log "no Docker engine: run eval \"\$(hack/docker.sh up)\" first"; exit 1; }
recipe=$( (cat "$0"; echo "$KUBE_ROUTER_VERSION $SUITE $PACKAGES") | sha256sum | cut -c1-10)
if [ "$(docker image inspect -f '{{index .Config.Labels "pd.recipe"}}' "$TAG" 2>/dev/null)" = "$recipe" ]; then
  log "$TAG cached"
  echo "$TAG"; exit 0
fi

if [ ! -x "$BIN/kube-router" ]; then
  log "building kube-router v$KUBE_ROUTER_VERSION (CGO_ENABLED=0)"
  # The version variables kube-router's Makefile sets, so `kube-router --version` names the release.
  go_install "$MODULE/cmd/kube-router@v$KUBE_ROUTER_VERSION" "$BIN" "$WORK/kube-router.log" \
    "-X $MODULE/pkg/version.Version=v$KUBE_ROUTER_VERSION -X $MODULE/pkg/version.BuildDate=module-proxy"
fi
assets="$GOMODCACHE/$MODULE@v$KUBE_ROUTER_VERSION/build/image-assets"

rootfs=$(debian_rootfs "$DIR/rootfs-$SUITE-$(echo "$PACKAGES" | tr , -)" "$SUITE" "$PACKAGES")
stage="$WORK/stage"
rm -rf "$stage"; mkdir -p "$stage"
cp -a "$rootfs/." "$stage/"
rm -rf "$stage/.complete" "$stage/var/cache/apt/archives/"*.deb "$stage/var/lib/apt/lists/"* \
  "$stage/usr/share/doc" "$stage/usr/share/man" "$stage/usr/share/locale"
install -m 0755 "$BIN/kube-router" "$stage/usr/local/bin/kube-router"
install -m 0755 "$assets/iptables-wrapper-installer.sh" "$stage/iptables-wrapper-installer.sh"
# With its sanity check (both backends present, iptables >= 1.8.4); it deletes itself. bookworm's
# update-alternatives lives in /usr/bin, where the installer does not look, so it links
# /usr/sbin/ip{,6}tables{,-save,-restore} to the wrapper directly, and the wrapper relinks them to
# xtables-<mode>-multi on first use.
chroot "$stage" /bin/sh /iptables-wrapper-installer.sh
for b in iptables iptables-save iptables-restore ip6tables; do
  [ "$(readlink "$stage/usr/sbin/$b")" = /usr/sbin/iptables-wrapper ] \
    || { log "iptables-wrapper did not take over /usr/sbin/$b"; exit 1; }
done
echo 'hosts: files dns' >"$stage/etc/nsswitch.conf"

log "importing $TAG"
tar -C "$stage" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENTRYPOINT ["/usr/local/bin/kube-router"]' \
  --change "LABEL pd.recipe=$recipe" \
  --change "LABEL org.opencontainers.image.version=v$KUBE_ROUTER_VERSION" - "$TAG" >/dev/null
rm -rf "$stage"
log "$TAG ready in $(( $(date +%s) - start ))s"
echo "$TAG"
