#!/usr/bin/env bash
# Builds, with nothing pulled, everything a kind cluster needs on this machine, cached by version
# outside the clone: the kind CLI, the Kubernetes node binaries and control-plane images (same pins
# as hack/tools.sh), etcd and CoreDNS at the versions kubeadm asks for, pause, crictl, the CNI
# plugins, containerd, and the node image itself (Debian bookworm + Debian's runc, our containerd,
# kind's own boot files). Needs a Docker engine (eval "$(hack/docker.sh up)").
# Prints two lines: KIND=<kind binary> and NODE_IMAGE=<local tag>.
#
# What differs from `kind build node-image`, and why (details in docs/kind.md):
# - the images are imported into the node's containerd by hand: kind's builder fetches every image
#   it did not build from a registry, and none is reachable here;
# - kindnetd is not built: the Go module proxy serves no version of sigs.k8s.io/kind/images/kindnetd,
#   so the node carries the CNI config kindnetd would write for a one-node cluster (ptp, host-local,
#   portmap) and clusters are created with disableDefaultCNI;
# - no local-path-provisioner (its pinned v0.0.34 is not served): kind then installs its legacy
#   host-path StorageClass, which needs no image;
# - containerd is built here from the module proxy, static (CGO_ENABLED=0), without the btrfs, zfs
#   and devmapper snapshotters (kind leaves them out too); runc is still Debian's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

KIND_VERSION=${KIND_VERSION:-0.33.0}
K8S_VERSION=${K8S_VERSION:-1.37.2}
CRICTL_VERSION=${CRICTL_VERSION:-1.36.0}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-1.9.1}
# containerd >= 2.1 mounts OCI images as pod volumes (volumes[].image). 2.4 is what containerd
# recommends for Kubernetes 1.37 (RELEASES.md: 2.4.0+, 2.3.0+); kind v0.33 itself ships 2.3.4.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.4.2}
SUITE=bookworm

CACHE_ROOT=${PD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}
KEY="kind-${KIND_VERSION}_k8s-${K8S_VERSION}_crictl-${CRICTL_VERSION}_cni-${CNI_PLUGINS_VERSION}_containerd-${CONTAINERD_VERSION}"
DIR="$CACHE_ROOT/kind/$KEY"
BIN="$DIR/bin"
WORK="$DIR/src"
# shellcheck source=hack/lib/gobuild.sh
source "$ROOT/hack/lib/gobuild.sh"
# shellcheck source=hack/lib/rootfs.sh
source "$ROOT/hack/lib/rootfs.sh"
go_env
mkdir -p "$BIN" "$WORK"
log() { printf '[kind-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
have() { for b in "$@"; do [ -x "$BIN/$b" ] || return 1; done; }

build_binaries() {
  have kind || { log "building kind v$KIND_VERSION"; go_install "sigs.k8s.io/kind@v$KIND_VERSION" "$BIN" "$WORK/kind.log"; }
  local k8s=(kubelet kubeadm kubectl kube-proxy kube-apiserver kube-controller-manager kube-scheduler)
  have "${k8s[@]}" || { log "building ${k8s[*]} v$K8S_VERSION (slow when cold)"; go_build_kubernetes "$K8S_VERSION" "$BIN" "$WORK" "${k8s[@]}"; }
  have crictl || { log "building crictl v$CRICTL_VERSION"; go_install "sigs.k8s.io/cri-tools/cmd/crictl@v$CRICTL_VERSION" "$BIN" "$WORK/crictl.log"; }
  have containerd ctr containerd-shim-runc-v2 || build_containerd
  local p
  for p in ipam/host-local main/loopback main/ptp meta/portmap; do
    have "cni/${p#*/}" || { log "building CNI plugin ${p#*/} v$CNI_PLUGINS_VERSION"
      go_install "github.com/containernetworking/plugins/plugins/$p@v$CNI_PLUGINS_VERSION" "$BIN/cni" "$WORK/cni-${p#*/}.log"; }
  done
  # etcd and CoreDNS at exactly the versions this kubeadm lists for its own release.
  local images etcd_tag coredns_tag
  images=$("$BIN/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" 2>/dev/null)
  etcd_tag=$(sed -n 's#^registry.k8s.io/etcd:##p' <<<"$images")
  coredns_tag=$(sed -n 's#^registry.k8s.io/coredns/coredns:##p' <<<"$images")
  [ -n "$etcd_tag" ] && [ -n "$coredns_tag" ] || { log "kubeadm listed no etcd/CoreDNS image: $images"; exit 1; }
  ETCD_TAG=$etcd_tag COREDNS_TAG=$coredns_tag
  have "etcd-${etcd_tag%-*}/etcd" || { log "building etcd ${etcd_tag%-*}"; go_build_etcd "${etcd_tag%-*}" "$BIN/etcd-${etcd_tag%-*}" "$WORK"; }
  have "coredns-$coredns_tag/coredns" || { log "building CoreDNS $coredns_tag"
    go_install "github.com/coredns/coredns@$coredns_tag" "$BIN/coredns-$coredns_tag" "$WORK/coredns.log"; }
}

# build_containerd: containerd, ctr and the runc shim, static, with the tags of containerd's own
# static release (osusergo netgo static_build) and kind's (no btrfs, zfs, devmapper snapshotters);
# the shim without gRPC, as containerd's Makefile builds it. go install, since the module has no
# replace directives; the version string as the Makefile sets it.
build_containerd() {
  local m=github.com/containerd/containerd/v2 v="v$CONTAINERD_VERSION"
  local tags=no_btrfs,no_zfs,no_devmapper,urfave_cli_no_docs,osusergo,netgo,static_build
  log "building containerd, ctr and containerd-shim-runc-v2 $v"
  GOFLAGS="$GOFLAGS -tags=$tags" go_install "$m/cmd/containerd@$v" "$BIN" "$WORK/containerd.log" "-X $m/version.Version=$v"
  GOFLAGS="$GOFLAGS -tags=$tags" go_install "$m/cmd/ctr@$v" "$BIN" "$WORK/ctr.log" "-X $m/version.Version=$v"
  GOFLAGS="$GOFLAGS -tags=$tags,no_grpc" go_install "$m/cmd/containerd-shim-runc-v2@$v" "$BIN" "$WORK/containerd-shim.log" "-X $m/version.Version=$v"
}

# runc from Debian (1.1.5); containerd is ours (build_containerd), so Debian's is not installed.
NODE_PACKAGES=systemd,systemd-sysv,dbus,runc,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps
PROXY_PACKAGES=iptables,conntrack
PATH_ENV='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
docker_have() { docker image inspect "$1" >/dev/null 2>&1; }

# stage_image TAG STAGE_DIR [CHANGE...]: one-layer image from a directory tree.
stage_image() {
  local tag=$1 stage=$2; shift 2
  local changes=(--change "$PATH_ENV") c
  for c in "$@"; do changes+=(--change "$c"); done
  tar -C "$stage" --exclude=./.complete -c . | docker import "${changes[@]}" - "$tag" >/dev/null
}

# new_stage NAME [ROOTFS]: a staging tree, either a copy of a Debian rootfs or the few files a
# static binary needs (users, nsswitch, /tmp, CA certificates), like distroless/static.
new_stage() {
  local stage="$WORK/stage-$1"
  rm -rf "$stage"; mkdir -p "$stage"
  if [ -n "${2:-}" ]; then
    cp -a "$2/." "$stage/"
  else
    mkdir -p "$stage/etc/ssl/certs" "$stage/tmp" "$stage/usr/local/bin"
    chmod 1777 "$stage/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$stage/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$stage/etc/group"
    echo 'hosts: files dns' >"$stage/etc/nsswitch.conf"
    cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
  fi
  echo "$stage"
}

# The images kubeadm and the node pull at boot, under exactly the names they ask for.
build_component_images() {
  local name stage
  for name in kube-apiserver kube-controller-manager kube-scheduler; do
    stage=$(new_stage "$name"); cp "$BIN/$name" "$stage/usr/local/bin/"
    stage_image "registry.k8s.io/$name:v$K8S_VERSION" "$stage"
  done
  local proxy_rootfs
  proxy_rootfs=$(debian_rootfs "$DIR/rootfs-$SUITE-kube-proxy" "$SUITE" "$PROXY_PACKAGES")
  stage=$(new_stage kube-proxy "$proxy_rootfs"); cp "$BIN/kube-proxy" "$stage/usr/local/bin/"
  rm -rf "$stage/var/cache/apt/archives/"*.deb "$stage/var/lib/apt/lists/"*
  stage_image "registry.k8s.io/kube-proxy:v$K8S_VERSION" "$stage"
  stage=$(new_stage etcd); cp "$BIN/etcd-${ETCD_TAG%-*}/etcd" "$stage/usr/local/bin/"
  stage_image "registry.k8s.io/etcd:$ETCD_TAG" "$stage"
  stage=$(new_stage coredns); cp "$BIN/coredns-$COREDNS_TAG/coredns" "$stage/coredns"
  stage_image "registry.k8s.io/coredns/coredns:$COREDNS_TAG" "$stage" 'ENTRYPOINT ["/coredns"]'
  # pause: the C program from the Kubernetes tree at the pinned release, linked statically.
  local pause_src="$GOMODCACHE/k8s.io/kubernetes@v$K8S_VERSION/build/pause"
  local pause_tag; pause_tag=$(sed -n 's/^TAG ?= *//p' "$pause_src/Makefile")
  stage="$WORK/stage-pause"; rm -rf "$stage"; mkdir -p "$stage"
  gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-k8s-v$K8S_VERSION" -o "$stage/pause" "$pause_src/linux/pause.c" \
    || { log "building pause needs gcc and a static libc (Debian: gcc libc6-dev)"; exit 1; }
  stage_image "registry.k8s.io/pause:$pause_tag" "$stage" 'ENTRYPOINT ["/pause"]' 'USER 65535:65535'
  COMPONENT_IMAGES=("registry.k8s.io/kube-apiserver:v$K8S_VERSION" "registry.k8s.io/kube-controller-manager:v$K8S_VERSION"
    "registry.k8s.io/kube-scheduler:v$K8S_VERSION" "registry.k8s.io/kube-proxy:v$K8S_VERSION"
    "registry.k8s.io/etcd:$ETCD_TAG" "registry.k8s.io/coredns/coredns:$COREDNS_TAG" "registry.k8s.io/pause:$pause_tag")
  local sandbox; sandbox=$(sed -n 's/^ *sandbox = "\(.*\)"/\1/p' "$ROOT/hack/kind/containerd.toml")
  [ "$sandbox" = "registry.k8s.io/pause:$pause_tag" ] || { log "hack/kind/containerd.toml names $sandbox, the tree builds pause:$pause_tag"; exit 1; }
}

# The node: kind's boot files over a Debian rootfs (node.Dockerfile), then every component image
# imported into its containerd and pinned, as `kind build node-image` does but without a registry.
build_node_image() {
  local rootfs_tag="pd-kind-rootfs:$SUITE-$(echo "$NODE_PACKAGES" | sha256sum | cut -c1-10)"
  if ! docker_have "$rootfs_tag"; then
    local rootfs; rootfs=$(debian_rootfs "$DIR/rootfs-$SUITE-node" "$SUITE" "$NODE_PACKAGES")
    log "importing the node rootfs as $rootfs_tag"
    tar -C "$rootfs" --exclude=./.complete -c . | docker import - "$rootfs_tag" >/dev/null
  fi
  local ctx="$WORK/node-context" kind_files="$GOMODCACHE/sigs.k8s.io/kind@v$KIND_VERSION/images/base/files"
  rm -rf "$ctx"; mkdir -p "$ctx/bin/cni"
  cp -r "$kind_files" "$ctx/files"; chmod -R u+w "$ctx/files"
  rm -rf "$ctx/files/LICENSES" "$ctx/files/etc/systemd/system/containerd-fuse-overlayfs.service"
  cp "$ROOT/hack/kind/containerd.toml" "$ctx/files/etc/containerd/config.toml"
  cp "$ROOT/hack/kind/10-pd-ptp.conflist" "$ctx/"
  ln "$BIN/kubelet" "$BIN/kubeadm" "$BIN/kubectl" "$BIN/crictl" "$BIN/containerd" "$BIN/ctr" "$BIN/containerd-shim-runc-v2" "$ctx/bin/"
  ln "$BIN/cni/"* "$ctx/bin/cni/"
  log "building the node base from hack/kind/node.Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -f "$ROOT/hack/kind/node.Dockerfile" --build-arg "ROOTFS_IMAGE=$rootfs_tag" \
    --build-arg "K8S_VERSION=$K8S_VERSION" -t "$NODE_IMAGE-base" "$ctx" >/dev/null

  build_component_images
  log "importing ${#COMPONENT_IMAGES[@]} images into the node's containerd"
  docker save -o "$WORK/images.tar" "${COMPONENT_IMAGES[@]}"
  local cid; cid=$(docker run -d --entrypoint sleep --security-opt seccomp=unconfined "$NODE_IMAGE-base" infinity)
  docker cp "$WORK/images.tar" "$cid:/kind/images.tar"
  # shellcheck disable=SC2016 # expanded inside the node
  docker exec "$cid" bash -c '
    set -e
    containerd >/tmp/containerd.log 2>&1 &
    for _ in $(seq 1 100); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
    ctr -n k8s.io images import --all-platforms --no-unpack --label=io.cri-containerd.pinned=pinned /kind/images.tar >/dev/null
    pinned=$(ctr -n k8s.io images ls -q "labels.\"io.cri-containerd.pinned\"==pinned")
    for ref in "$@"; do grep -qx "$ref" <<<"$pinned" || { echo "$ref missing or not pinned" >&2; exit 1; }; done
    ctr -n k8s.io images ls -q | sort
    kill %1; wait || true
    rm -rf /kind/images.tar /tmp/containerd.log' node-import "${COMPONENT_IMAGES[@]}" | sed 's/^/[kind-node]   /' >&2
  docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
    --change 'ENV HTTP_PROXY="" HTTPS_PROXY="" NO_PROXY=""' "$cid" "$NODE_IMAGE" >/dev/null
  docker rm -f "$cid" >/dev/null
  rm -f "$WORK/images.tar"
}

start=$(date +%s)
build_binaries
docker info >/dev/null 2>&1 || { log "no Docker engine: run eval \"\$(hack/docker.sh up)\" first"; exit 1; }
# The node image's tag names the recipe, so editing any of it builds a new one.
recipe=$(cat "$0" "$ROOT/hack/kind/node.Dockerfile" "$ROOT/hack/kind/containerd.toml" "$ROOT/hack/kind/10-pd-ptp.conflist" \
  <(echo "$KEY $ETCD_TAG $COREDNS_TAG") | sha256sum | cut -c1-10)
NODE_IMAGE="pd-kind-node:v$K8S_VERSION-$recipe"
if docker_have "$NODE_IMAGE"; then
  log "node image $NODE_IMAGE cached"
else
  build_node_image
fi
log "ready in $(( $(date +%s) - start ))s"
echo "KIND=$BIN/kind"
echo "NODE_IMAGE=$NODE_IMAGE"
