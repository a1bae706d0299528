# Debian root file systems from debootstrap, shared by hack/image.sh and hack/kind-node.sh.
# Source this file; callers define log().

# debian_rootfs DIR SUITE PACKAGES: a minbase root file system with extra packages, built once per
# DIR (callers put the package list in the name) and reused while DIR/.complete exists.
debian_rootfs() {
  local dir=$1 suite=$2 include=$3
  if [ ! -f "$dir/.complete" ]; then
    command -v debootstrap >/dev/null || { apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2; }
    rm -rf "$dir"; mkdir -p "$dir"
    log "debootstrap $suite ($include)"
    debootstrap --variant=minbase --include="$include" "$suite" "$dir" http://deb.debian.org/debian >&2
    touch "$dir/.complete"
  fi
  echo "$dir"
}
