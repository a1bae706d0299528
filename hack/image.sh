#!/usr/bin/env bash
# Builds the operator image from ./Dockerfile with nothing pulled: the builder base (Debian
# bookworm from debootstrap plus this machine's Rust toolchain) and the runtime base (glibc,
# libgcc and CA certificates only, like distroless/cc) are assembled locally, cached by version,
# and passed as the Dockerfile's BUILDER_IMAGE / RUNTIME_IMAGE. Prints the image reference.
#   hack/image.sh [TAG]          the operator (the Dockerfile's last stage)
#   hack/image.sh --sim [TAG]    the stand-in, pd-sim (stage `sim`; shares the build stage's cache)
# (needs a Docker engine: eval "$(hack/docker.sh up)")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
STAGE=operator NAME=pd-operator
if [ "${1:-}" = "--sim" ]; then STAGE=sim NAME=pd-sim; shift; fi
TAG=${1:-$NAME:$VERSION}
SUITE=bookworm
RUST_VERSION=$(rustc --version | awk '{print $2}')
BUILDER=pd-operator-builder:rust-$RUST_VERSION-$SUITE-2
RUNTIME=pd-operator-runtime:cc-$SUITE
WORK=${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/image
log() { echo "[image $(date +%H:%M:%S)] $*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

# shellcheck source=hack/lib/rootfs.sh
source "$ROOT/hack/lib/rootfs.sh"
rootfs() { debian_rootfs "$WORK/rootfs-$SUITE-$1" "$SUITE" "$2"; }

if ! have "$BUILDER"; then
  dir=$(rootfs builder gcc,libc6-dev,ca-certificates,git)
  log "builder image $BUILDER (Rust $RUST_VERSION from $(rustc --print sysroot))"
  rm -rf "$dir/usr/local/rust"; mkdir -p "$dir/usr/local/rust"
  # rustc and cargo with the std of the host target only; docs and sources are not needed.
  sysroot=$(rustc --print sysroot)
  cp -a "$sysroot/bin" "$sysroot/lib" "$dir/usr/local/rust/"
  rm -rf "$dir/usr/local/rust/lib/rustlib/"*/analysis "$dir/usr/local/rust/lib/rustlib/src"
  # This machine reaches crates.io through a TLS-inspecting proxy whose CA only the host trusts.
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
  tar -C "$dir" --exclude=./.complete -c . | docker import \
    --change 'ENV PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' --change 'WORKDIR /src' - "$BUILDER" >/dev/null
fi

if ! have "$RUNTIME"; then
  dir=$(rootfs runtime ca-certificates)
  log "runtime image $RUNTIME (libc6, libgcc-s1, CA certificates)"
  # bookworm is merged-/usr: take every file at its /usr path and recreate the /lib links.
  files=$(chroot "$dir" dpkg -L libc6 libgcc-s1 | sed -e 's|^/lib/|/usr/lib/|' -e 's|^/lib64/|/usr/lib64/|' | sort -u |
    while read -r f; do if [ -f "$dir$f" ] && [ ! -d "$dir$f" ]; then echo ".$f"; fi; done)
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$WORK/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$WORK/group"
  stage="$WORK/runtime-stage"; rm -rf "$stage"; mkdir -p "$stage/etc/ssl/certs" "$stage/tmp" "$stage/home/nonroot"
  # shellcheck disable=SC2086 # one path per word
  (cd "$dir" && tar -c $files) | tar -C "$stage" -x
  ln -s usr/lib "$stage/lib"; ln -s usr/lib64 "$stage/lib64"
  cp "$dir/etc/ssl/certs/ca-certificates.crt" "$stage/etc/ssl/certs/"
  cp "$WORK/passwd" "$WORK/group" "$stage/etc/"
  chmod 1777 "$stage/tmp"; chown 65532:65532 "$stage/home/nonroot"
  tar -C "$stage" -c . | docker import --change 'USER 65532:65532' - "$RUNTIME" >/dev/null
fi

log "docker build $TAG (BUILDER_IMAGE=$BUILDER RUNTIME_IMAGE=$RUNTIME)"
# Crates come from crates.io during the build; the host network is what reaches it here.
DOCKER_BUILDKIT=0 docker build --network host -q --target "$STAGE" --build-arg "BUILDER_IMAGE=$BUILDER" --build-arg "RUNTIME_IMAGE=$RUNTIME" \
  --build-arg "VERSION=$VERSION" -t "$TAG" . >&2
echo "$TAG"
