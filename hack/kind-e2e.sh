#!/usr/bin/env bash
# The kind tier (`make e2e-kind`): real kubelet, containerd and kube-proxy, our image from our
# Dockerfile, the chart installed with helm, the webhook reached through its Service, the
# handshake sidecar talking to running prefill pods, and requests through the smg router image to
# sim engines moving KV along the rank map, all of it scraped by a Prometheus that evaluates the
# chart's dashboard and alerts (hack/kind-monitoring.sh). Everything is built here offline and cached
# (hack/kind-node.sh, hack/image.sh, hack/gateway-image.sh); the cluster is deleted at the end, and a dockerd started here
# is stopped. Fails loudly when Docker cannot start: this tier is never skipped.
#   PD_KIND_KEEP=1 hack/kind-e2e.sh    # leave the cluster, and a failed test's namespace, running
#   PD_KIND_TESTS=rollout hack/kind-e2e.sh   # only the tests whose names contain "rollout"
#   PD_KIND_SUITE=bench-planner hack/kind-e2e.sh   # the planner benchmark instead (make bench-planner)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CLUSTER=${PD_KIND_CLUSTER:-pd-e2e}
STATE=${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind-e2e
OPERATOR_NS=pd-system
# Fake GPUs advertised on the node (extended resources on node status): the sim engines request
# nvidia.com/gpu like the real ones, and there is no device plugin here.
GPUS=${PD_KIND_GPUS:-64}
log() { echo "[kind-e2e $(date +%H:%M:%S)] $*" >&2; }
start=$(date +%s)

source hack/lib/docker.sh
# shellcheck source=lib/wait.sh
source hack/lib/wait.sh
ensure_docker kind-e2e
mkdir -p "$STATE"
KUBECONFIG_FILE="$STATE/kubeconfig"

node_out=$(hack/kind-node.sh)
KIND=$(sed -n 's/^KIND=//p' <<<"$node_out")
NODE_IMAGE=$(sed -n 's/^NODE_IMAGE=//p' <<<"$node_out")
TOOLS_BIN=$(hack/tools.sh 2>/dev/null | tail -1)
kubectl() { "$TOOLS_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
helm() { "$TOOLS_BIN/helm" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
log "tools ready after $(( $(date +%s) - start ))s"

IMAGE=$(hack/image.sh)
log "operator image $IMAGE ready after $(( $(date +%s) - start ))s"
SIM_IMAGE=$(hack/image.sh --sim)
log "stand-in image $SIM_IMAGE ready after $(( $(date +%s) - start ))s"
GATEWAY_IMAGE=$(hack/gateway-image.sh)
log "gateway image $GATEWAY_IMAGE ready after $(( $(date +%s) - start ))s"
MODEL_IMAGE=$(hack/model-image.sh)
# The engine dry run's image: SGLang 0.5.22's own code on CPU, under a tag naming its release and
# one that does not (about 4.7 GB; 80 s the first time, from the parity tier's cached venv).
mapfile -t SGLANG_CPU_IMAGES < <(hack/sglang-cpu-image.sh 0.5.22)
log "SGLang CPU images ${SGLANG_CPU_IMAGES[*]} ready after $(( $(date +%s) - start ))s"
# The next release for the upgrade phase: the same binary in an image of its own (another image
# ID and reference), as `helm upgrade` to a new operator image would bring.
NEXT_IMAGE="${IMAGE}-next"
printf 'FROM %s\nLABEL org.opencontainers.image.description="pd-operator, the next release (kind upgrade phase)"\n' "$IMAGE" \
  | DOCKER_BUILDKIT=0 docker build -q -t "$NEXT_IMAGE" - >/dev/null

cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "FAILED (exit $rc): node logs in $STATE/logs"
    rm -rf "$STATE/logs"; "$KIND" export logs "$STATE/logs" --name "$CLUSTER" >/dev/null 2>&1 || true
    docker exec "$CLUSTER-control-plane" journalctl -u kubelet --no-pager 2>/dev/null | tail -n 15 >&2 || true
  fi
  if [ "${PD_KIND_KEEP:-0}" = 1 ]; then
    log "cluster $CLUSTER kept: export KUBECONFIG=$KUBECONFIG_FILE"
  else
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    release_docker
  fi
  exit "$rc"
}
trap cleanup EXIT

"$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
log "creating kind cluster $CLUSTER from $NODE_IMAGE"
t=$(date +%s)
"$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config hack/kind/cluster.yaml \
  --kubeconfig "$KUBECONFIG_FILE" --wait 5m >&2
log "cluster up in $(( $(date +%s) - t ))s"
"$KIND" load docker-image "$IMAGE" "$NEXT_IMAGE" "$SIM_IMAGE" "$GATEWAY_IMAGE" "$MODEL_IMAGE" --name "$CLUSTER" >&2
# `kind load` writes the image as a tar to TMPDIR and the node unpacks it: about 14 GB at the peak.
free_gb=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 { print int($4 / 1048576) }')
[ "$free_gb" -ge 15 ] || { log "FAILED: $free_gb GB free under ${TMPDIR:-/tmp}; loading the 4.7 GB SGLang CPU image needs about 15 (hack/prune-cargo-target.sh, docker image prune)"; exit 1; }
t=$(date +%s)
"$KIND" load docker-image "${SGLANG_CPU_IMAGES[@]}" --name "$CLUSTER" >&2
log "SGLang CPU images loaded into the node in $(( $(date +%s) - t ))s"

# NetworkPolicy is enforced (kube-router's firewall only; docs/kind.md "NetworkPolicy"), and in
# place before anything else is installed; tests/e2e_kind.rs shows it enforces (deny, allow, removal).
install_netpol() {
  local t image; t=$(date +%s)
  image=$(hack/netpol-image.sh)
  "$KIND" load docker-image "$image" --name "$CLUSTER" >&2
  sed "s#image: pd-kube-router:.*#image: $image#" hack/kind/netpol.yaml | kubectl apply -f - >/dev/null
  kubectl -n kube-system rollout status ds/kube-router --timeout=180s >/dev/null
  log "NetworkPolicy enforcer $image ready in $(( $(date +%s) - t ))s"
}
install_netpol
PROBE_IMAGE=$(hack/probe-image.sh)
"$KIND" load docker-image "$PROBE_IMAGE" --name "$CLUSTER" >&2

node=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
kubectl patch node "$node" --subresource=status --type=json \
  -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$GPUS\"}]" >/dev/null
kubectl wait --for=jsonpath="{.status.allocatable.nvidia\.com/gpu}=$GPUS" "node/$node" --timeout=60s >/dev/null

log "installing the CRD and the chart (image $IMAGE)"
kubectl apply --server-side -f crds/ >/dev/null
wait_crds_established 60 crds/
helm upgrade --install pd-operator charts/pd-operator --namespace "$OPERATOR_NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set simImage.repository="${SIM_IMAGE%:*}" --set simImage.tag="${SIM_IMAGE##*:}" \
  --set 'egress.hubEndpoints={https://huggingface.co,http://*.svc:8080}' \
  --wait --timeout 5m >/dev/null
if [ "${PD_KIND_SUITE:-e2e}" = bench-planner ]; then
  log "running tests/bench_planner.rs against the cluster (PD_BENCH_RUNS=${PD_BENCH_RUNS:-both})"
  t=$(date +%s)
  PD_E2E_KUBECONFIG="$KUBECONFIG_FILE" PD_TOOLS_BIN="$TOOLS_BIN" PD_KIND_SIM_IMAGE="$SIM_IMAGE" \
    cargo test --locked --test bench_planner >&2
  log "benchmark took $(( $(date +%s) - t ))s; total $(( $(date +%s) - start ))s"
  exit 0
fi
# Prometheus and kube-state-metrics from the Go module proxy, the chart's rules loaded (issue #34).
hack/kind-monitoring.sh "$KIND" "$CLUSTER" "$TOOLS_BIN/kubectl" "$KUBECONFIG_FILE"

log "running tests/e2e_kind.rs, tests/e2e_kind_prometheus.rs and tests/e2e_kind_dry_run.rs against the cluster"
t=$(date +%s)
# The tests that take operator replicas away run alone, after the others, in this order (the
# upgrade replaces the operator the others use).
ALONE=(the_webhook_judges_every_admission_while_an_operator_replica_goes_away
  operator_upgrade_under_load_restarts_no_engine_and_moves_every_sidecar)
kind_tests() {
  PD_E2E_KEEP_FAILED=${PD_KIND_KEEP:-} PD_E2E_KUBECONFIG="$KUBECONFIG_FILE" PD_TOOLS_BIN="$TOOLS_BIN" PD_KIND_OPERATOR_NAMESPACE="$OPERATOR_NS" PD_KIND_PROBE_IMAGE="$PROBE_IMAGE" \
    PD_KIND_NODE="$CLUSTER-control-plane" \
    PD_KIND_OPERATOR_IMAGE="$IMAGE" PD_KIND_NEXT_OPERATOR_IMAGE="$NEXT_IMAGE" PD_KIND_SIM_IMAGE="$SIM_IMAGE" PD_KIND_GATEWAY_IMAGE="$GATEWAY_IMAGE" \
    PD_KIND_MODEL_IMAGE="$MODEL_IMAGE" PD_KIND_SGLANG_CPU_IMAGE="${SGLANG_CPU_IMAGES[0]}" PD_KIND_SGLANG_CPU_CUSTOM_IMAGE="${SGLANG_CPU_IMAGES[1]}" \
    cargo test --locked --test e2e_kind --test e2e_kind_prometheus --test e2e_kind_dry_run -- --ignored --nocapture "$@" 2>&1 | tee -a "$STATE/test.log" >&2
  return "${PIPESTATUS[0]}"
}
: > "$STATE/test.log"
set +e
kind_tests --test-threads 4 "${ALONE[@]/#/--skip=}" ${PD_KIND_TESTS:-}
rc=$?
for test in "${ALONE[@]}"; do
  if [ "$rc" = 0 ] && { [ -z "${PD_KIND_TESTS:-}" ] || [[ "$test" == *"$PD_KIND_TESTS"* ]]; }; then
    log "alone: $test"
    kind_tests --exact "$test"
    rc=$?
  fi
done
set -e
[ "$(grep -c '^test result: ok' "$STATE/test.log")" -ge 1 ] && ! grep -q '^test result: FAILED' "$STATE/test.log" || rc=1
log "tests took $(( $(date +%s) - t ))s; kind tier total $(( $(date +%s) - start ))s"
exit "$rc"
