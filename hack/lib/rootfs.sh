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

# The Python image bases of hack/gateway-image.sh and hack/sglang-cpu-image.sh: PY_RUNTIME is
# Debian PY_SUITE's python3 with a nonroot user 65532; PY_BUILDER adds this host's CA bundle (which reaches PyPI).
PY_SUITE=bookworm
PY_BUILDER=pd-operator-python-builder:$PY_SUITE
PY_RUNTIME=pd-operator-python:$PY_SUITE

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# python_bases: builds PY_BUILDER and PY_RUNTIME once. Callers define log().
python_bases() {
  local work=${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/image suite=$PY_SUITE builder=$PY_BUILDER runtime=$PY_RUNTIME dir stage
  image_exists "$builder" && image_exists "$runtime" && return 0
  dir=$(debian_rootfs "$work/rootfs-$suite-python" "$suite" python3,python3-venv,ca-certificates)
  if ! image_exists "$runtime"; then
    log "runtime base $runtime (Debian $suite python3, user 65532)"
    grep -q '^nonroot:' "$dir/etc/passwd" || echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >>"$dir/etc/passwd"
    grep -q '^nonroot:' "$dir/etc/group" || echo 'nonroot:x:65532:' >>"$dir/etc/group"
    mkdir -p "$dir/home/nonroot"; chown 65532:65532 "$dir/home/nonroot"
    tar -C "$dir" --exclude=./.complete --exclude=./var/cache/apt/archives -c . \
      | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
          --change 'ENV LANG=C.UTF-8' - "$runtime" >/dev/null
  fi
  if ! image_exists "$builder"; then
    log "builder base $builder (the runtime base plus this host's CA bundle, which reaches PyPI)"
    stage="$work/python-builder-stage"; rm -rf "$stage"; mkdir -p "$stage/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
    printf 'FROM %s\nCOPY etc /etc\n' "$runtime" >"$stage/Dockerfile"
    DOCKER_BUILDKIT=0 docker build -q -t "$builder" "$stage" >/dev/null
  fi
}
