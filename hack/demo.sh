#!/usr/bin/env bash
# `make demo`: validate and render the examples offline; start the local control plane
# (state in .cluster/); install the CRD and the Helm chart; run the operator on this host under
# the chart's ServiceAccount (its RBAC) with the chart's webhook registration pointed at it;
# show the Qwen `dcp: 2` mistake denied at admission and the valid examples reconciled; end with a
# chat completion through SGLang's gateway (smg) in front of sim engines. Leaves everything running. `make demo-down` stops it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=lib/wait.sh
. "$ROOT/hack/lib/wait.sh"
export PD_CLUSTER_DIR="$ROOT/.cluster"
# The examples ask for 80 GPUs; 12 kwok nodes of 8 fit them with room to scale.
export PD_GPU_NODES=${PD_GPU_NODES:-12}
OPERATOR_NS=pd-system
RELEASE=pd-operator

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

stop_operator() {
  for f in operator.pid sim-prefill.pid sidecar.pid serve-prefill.pid serve-decode.pid smg.pid; do
    if [ -f "$PD_CLUSTER_DIR/$f" ]; then
      kill "$(cat "$PD_CLUSTER_DIR/$f")" 2>/dev/null || true
      rm -f "$PD_CLUSTER_DIR/$f"
    fi
  done
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The sim example's prefill stand-in on this host (kwok runs no containers); extra flags inject faults.
start_sim_prefill() {
  if [ -f "$PD_CLUSTER_DIR/sim-prefill.pid" ]; then kill "$(cat "$PD_CLUSTER_DIR/sim-prefill.pid")" 2>/dev/null || true; sleep 0.5; fi
  nohup "$SIM" prefill --tp-size 2 --page-size 64 --host 127.0.0.1 --port "$(free_port)" \
    --disaggregation-bootstrap-port "$SIM_BOOTSTRAP" "$@" >>"$PD_CLUSTER_DIR/logs/sim-prefill.log" 2>&1 &
  echo $! >"$PD_CLUSTER_DIR/sim-prefill.pid"
}

# start_bg NAME CMD...: a host process of the demo, logged and stopped by `make demo-down`.
start_bg() {
  local name=$1; shift
  nohup "$@" >"$PD_CLUSTER_DIR/logs/$name.log" 2>&1 &
  echo $! >"$PD_CLUSTER_DIR/$name.pid"
}

# The engine argv the operator rendered for a pod, one argument a line.
pod_args() {
  kubectl get pod "$1" -o json | python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin)["spec"]["containers"][0]["args"]))'
}

# Requests end to end: the sim example's prefill and decode with the argv the operator rendered for
# their pods (host and ports moved to this host's loopback; kwok runs no containers), behind smg in
# PD mode, which the router Deployment runs (there it finds the pods by Kubernetes discovery).
serve_completion() {
  local py ph pb dh gw args
  py=$(hack/smg-venv.sh | tail -n 1)
  ph=$(free_port); pb=$(free_port); dh=$(free_port); gw=$(free_port)
  mapfile -t args < <(pod_args sim-dsv3-prefill-0-0)
  start_bg serve-prefill "$SIM" engine "${args[@]}" --host 127.0.0.1 --port "$ph" --disaggregation-bootstrap-port "$pb"
  mapfile -t args < <(pod_args sim-dsv3-decode-0-0)
  start_bg serve-decode "$SIM" engine "${args[@]}" --host 127.0.0.1 --port "$dh"
  start_bg smg "$py" -m smg.launch_router --pd-disaggregation --prefill "http://127.0.0.1:$ph" "$pb" \
    --decode "http://127.0.0.1:$dh" --host 127.0.0.1 --port "$gw" --prometheus-port "$(free_port)"
  local body='{"model": "deepseek-ai/DeepSeek-V3", "messages": [{"role": "user", "content": "What does the decode read from the prefill?"}], "max_tokens": 12}'
  echo "$ curl -s http://127.0.0.1:$gw/v1/chat/completions -d '$body'"
  for _ in $(seq 1 120); do
    if out=$(curl -sf -m 10 "http://127.0.0.1:$gw/v1/chat/completions" -H 'Content-Type: application/json' -d "$body"); then
      echo "$out" | python3 -m json.tool
      echo "KV pulled by each decode rank (decode /get_server_info kv_transfers):"
      curl -s "http://127.0.0.1:$dh/get_server_info" | python3 -c 'import json, sys
for r in json.load(sys.stdin)["kv_transfers"]: print("  decode rank %s <- prefill rank %s: %s pulls, %s bytes" % (r["decode_engine_rank"], r["prefill_tp_rank"], r["pulls"], r["bytes"]))'
      return 0
    fi
    sleep 0.5
  done
  echo "no completion through smg after 60 s; logs: $PD_CLUSTER_DIR/logs/{smg,serve-prefill,serve-decode}.log" >&2
  return 1
}

handshake_condition() {
  kubectl get pdd sim-dsv3 -o jsonpath='{range .status.conditions[?(@.type=="HandshakeReady")]}{.status} {.reason}: {.message}{end}'
}

case "${1:-up}" in
  down) stop_operator; hack/cluster.sh down; exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

cargo build --locked --quiet -p pd-operator -p pd-sim -p kubectl-pd
PD="${CARGO_TARGET_DIR:-$ROOT/target}/debug/pd-operator"
SIM="${CARGO_TARGET_DIR:-$ROOT/target}/debug/pd-sim"
# `kubectl pd` is the plugin kubectl finds on PATH.
PATH="${CARGO_TARGET_DIR:-$ROOT/target}/debug:$PATH"

say "pd-operator validate: the seed's mistake (Qwen2.5, a GQA model, with decode dcp: 2)"
"$PD" validate -f examples/qwen-dcp2-mistake.yaml || echo "(exit $?: rejected, as it should be)"
say "pd-operator validate: every other example"
"$PD" validate -f examples/deepseek-v3-dcp.yaml -f examples/qwen3-gqa.yaml -f examples/multi-node-prefill.yaml \
  -f examples/llama-different-tp.yaml -f examples/sim-demo.yaml
say "pd-operator render: the two-node DeepSeek-R1 prefill leader's engine argv"
"$PD" render -f examples/multi-node-prefill.yaml | awk '/name: r1-prefill-0-0$/{p=1} p' | sed -n '/- args:/,/command:/p' | tr -d "'" | paste -sd' ' | cut -c1-600

say "local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)"
if [ -f "$PD_CLUSTER_DIR/kubeconfig" ]; then stop_operator; hack/cluster.sh down; fi
EXPORT=$(hack/cluster.sh up | tail -n 1)
eval "$EXPORT"
BIN=$(cat "$PD_CLUSTER_DIR/bin")
export PATH="$BIN:$PATH"
kubectl get nodes

say "install: CRD (kubectl apply --server-side) and the Helm chart"
kubectl apply --server-side -f crds/
wait_crds_established 60 crds/
PORT=$(free_port)
# No container runs on kwok nodes: the operator runs on this host (replicaCount=0) and the
# chart's webhook registration points at it by URL.
helm install "$RELEASE" charts/pd-operator -n "$OPERATOR_NS" --create-namespace \
  --set replicaCount=0 --set "webhook.url=https://127.0.0.1:$PORT/validate" --wait

say "run the operator under the chart's ServiceAccount (its least-privilege RBAC)"
TOKEN=$(kubectl create token "$RELEASE" -n "$OPERATOR_NS" --duration 24h)
SERVER=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
CA=$(kubectl config view -o jsonpath='{.clusters[0].cluster.certificate-authority}')
cat >"$PD_CLUSTER_DIR/operator.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: pd-local, cluster: {server: "$SERVER", certificate-authority: "$CA"}}]
users: [{name: pd-operator, user: {token: "$TOKEN"}}]
contexts: [{name: pd-local, context: {cluster: pd-local, user: pd-operator}}]
current-context: pd-local
KC
KUBECONFIG="$PD_CLUSTER_DIR/operator.kubeconfig" POD_NAMESPACE="$OPERATOR_NS" nohup "$PD" controller \
  --admin-addr 127.0.0.1:0 --lease-name "$RELEASE" --webhook-config "$RELEASE" --webhook-secret "$RELEASE-webhook-tls" \
  --webhook-addr "127.0.0.1:$PORT" --webhook-ip-sans 127.0.0.1 >"$PD_CLUSTER_DIR/logs/operator.log" 2>&1 &
echo $! >"$PD_CLUSTER_DIR/operator.pid"
ca_bundle_set() { kubectl get validatingwebhookconfiguration "$RELEASE" -o jsonpath='{.webhooks[0].clientConfig.caBundle}' | grep -q .; }
wait_for "the operator to put its CA into the webhook registration" 30 ca_bundle_set

say "admission: the Qwen dcp: 2 mistake is denied with SGLang's words"
denied=false
for _ in $(seq 1 20); do
  if out=$(kubectl apply -f examples/qwen-dcp2-mistake.yaml 2>&1); then
    kubectl delete -f examples/qwen-dcp2-mistake.yaml >/dev/null 2>&1; sleep 1
  else
    echo "$out"; denied=true; break
  fi
done
$denied || { echo "FAILED: examples/qwen-dcp2-mistake.yaml was admitted 20 times: the webhook is not judging" >&2; exit 1; }

say "the valid examples, reconciled"
for f in deepseek-v3-dcp qwen3-gqa multi-node-prefill llama-different-tp; do kubectl apply -f "examples/$f.yaml"; done
sleep 8
kubectl get pdd
kubectl get pods -o wide -l app.kubernetes.io/managed-by=pd-operator | head -20

say "runtime: the handshake sidecar of a sim decode pod, against a prefill stand-in with the wrong page size"
kubectl apply -f examples/sim-demo.yaml
pod_running() { [ "$(kubectl get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; }
wait_for "pod sim-dsv3-decode-0-0 to run" 30 pod_running sim-dsv3-decode-0-0
kubectl get configmap sim-dsv3-handshake -o jsonpath='{.data.decode\.json}' >"$PD_CLUSTER_DIR/sim-decode.json"
SIM_BOOTSTRAP=$(free_port)
start_sim_prefill --sim-page-size 32
# The sidecar runs here as it would in the pod: under the decode pods' own ServiceAccount token.
SA_TOKEN=$(kubectl create token sim-dsv3-decode --duration 24h)
sed "s/token: \"[^\"]*\"/token: \"$SA_TOKEN\"/" "$PD_CLUSTER_DIR/operator.kubeconfig" >"$PD_CLUSTER_DIR/sidecar.kubeconfig"
KUBECONFIG="$PD_CLUSTER_DIR/sidecar.kubeconfig" nohup "$PD" handshake run --decode "$PD_CLUSTER_DIR/sim-decode.json" \
  --prefill "127.0.0.1:$SIM_BOOTSTRAP" --pod default/sim-dsv3-decode-0-0 >"$PD_CLUSTER_DIR/logs/sidecar.log" 2>&1 &
echo $! >"$PD_CLUSTER_DIR/sidecar.pid"
handshake_is() { handshake_condition | grep -q "$1"; }
wait_for "HandshakeReady=False PageSizeMismatch" 30 handshake_is '^False PageSizeMismatch'
echo "HandshakeReady: $(handshake_condition)"
kubectl get pod sim-dsv3-decode-0-0 -o jsonpath='decode pod Ready={.status.conditions[?(@.type=="Ready")].status}{"\n"}'
echo "$ kubectl pd explain sim-dsv3"
kubectl pd explain sim-dsv3
say "the prefill stand-in restarts with the matching page size; the sidecar re-checks"
start_sim_prefill
wait_for "HandshakeReady=True" 30 handshake_is '^True'
echo "HandshakeReady: $(handshake_condition)"
echo "$ kubectl pd status sim-dsv3"
kubectl pd status sim-dsv3
echo "$ kubectl pd rankmap sim-dsv3"
kubectl pd rankmap sim-dsv3

say "requests: a chat completion through SGLang's gateway (smg) to the sim prefill and decode"
serve_completion

say "the cluster and the operator keep running; to use them:"
echo "$EXPORT"
echo "export PATH=$BIN:${CARGO_TARGET_DIR:-$ROOT/target}/debug:\$PATH   # kubectl, helm and the kubectl pd plugin"
echo "(operator log: $PD_CLUSTER_DIR/logs/operator.log; make demo-down stops everything)"
