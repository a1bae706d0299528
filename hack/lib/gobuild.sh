# Go builds of pinned upstream tools from the module proxy, shared by hack/tools.sh (test control
# plane) and hack/kind-node.sh (kind node image). Source this file; it defines functions only.
# Callers set CACHE_ROOT; build logs go next to the sources, and a failure prints the log's tail.

GO_LINE=1.26.0

go_env() {
  export GOMODCACHE="$CACHE_ROOT/go/mod"
  export GOCACHE="$CACHE_ROOT/go/build"
  export GOFLAGS="-modcacherw -buildvcs=false"
  export CGO_ENABLED=0
  export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  command -v go >/dev/null || { echo "go is not installed: it is needed to build the test tools" >&2; exit 1; }
}

go_fail() { echo "FAILED to build $1 (see $2)" >&2; tail -n 30 "$2" >&2 || true; exit 1; }

# go_build_etcd VERSION OUT_DIR WORK_DIR: etcd's server module carries local replaces, so it is
# built from a wrapper module that requires the tagged release.
go_build_etcd() {
  local version=$1 out=$2 d="$3/etcd-$1" lg="$3/etcd-$1.log"
  rm -rf "$d"; mkdir -p "$d" "$out"
  ( cd "$d" && go mod init local.test/etcdbin && go mod edit -go=$GO_LINE \
      && go mod edit -require="go.etcd.io/etcd/server/v3@v$version" \
      && printf 'package tools\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' > tools.go \
      && go mod tidy \
      && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3 ) >"$lg" 2>&1 \
    || go_fail "etcd v$version" "$lg"
}

# go_build_kubernetes VERSION OUT_DIR WORK_DIR CMD...: k8s.io/kubernetes points its staging modules
# at paths its module zip lacks, so a wrapper module replaces each with its tagged v0.X.Y release.
# The version ldflags matter: kubeadm derives its supported versions from them.
go_build_kubernetes() {
  local version=$1 out=$2 d="$3/k8s-$1" lg="$3/k8s-$1.log"; shift 3
  local staging="v0.${version#1.}" minor
  minor=$(echo "$version" | cut -d. -f2)
  mkdir -p "$d" "$out"
  (
    set -e
    cd "$d"
    if [ ! -f go.mod ]; then
      go mod init local.test/k8sbin && go mod edit -go=$GO_LINE
      gomod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
      go mod edit -require="k8s.io/kubernetes@v$version"
      for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
        go mod edit -replace="$m=$m@$staging"
      done
    fi
    printf 'package tools\n\nimport (\n' > tools.go
    for c in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c" >> tools.go; done
    printf ')\n' >> tools.go
    go mod tidy
    local ldf="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldf="$ldf -X $p.gitVersion=v$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ldf="$ldf -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
    done
    local pkgs=()
    for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    go build -trimpath -ldflags "$ldf" -o "$out/" "${pkgs[@]}"
  ) >"$lg" 2>&1 || go_fail "kubernetes v$version ($*)" "$lg"
}

# go_install MODULE@VERSION OUT_DIR LOG [LDFLAGS]: modules without replace directives.
go_install() {
  mkdir -p "$2"
  GOBIN="$2" go install -trimpath -ldflags "-s -w ${4:-}" "$1" >"$3" 2>&1 || go_fail "$1" "$3"
}
