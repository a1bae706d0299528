# Sourced by the tiers that need a Docker engine (image-test, kind-e2e); expects ROOT.
#   ensure_docker TAG   uses the running engine, else starts one with hack/docker.sh; exits
#                       loudly if none can start: these tiers are never skipped
#   release_docker      stops the engine again if ensure_docker started it
PD_DOCKER_STARTED_HERE=false

ensure_docker() {
  docker info >/dev/null 2>&1 && return 0
  local env
  env=$("$ROOT/hack/docker.sh" up) || { echo "[$1] FAILED: no Docker engine and none could be started (see above); this tier cannot run" >&2; exit 1; }
  eval "$env"
  PD_DOCKER_STARTED_HERE=true
}

release_docker() {
  if $PD_DOCKER_STARTED_HERE; then "$ROOT/hack/docker.sh" down; fi
}
