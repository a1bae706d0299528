#!/usr/bin/env bash
# `make demo`: validate and render the examples offline; start the local control plane
# (state in .cluster/); install the CRD and the Helm chart; run the operator on this host under
# the chart's ServiceAccount (its RBAC) with the chart's webhook registration pointed at it;
# show the Qwen `dcp: 2` mistake denied at admission and the valid examples reconciled.
# Leaves everything running. `make demo-down` stops it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PD_CLUSTER_DIR="$ROOT/.cluster"
# The examples ask for 80 GPUs; 12 kwok nodes of 8 fit them with room to scale.
export PD_GPU_NODES=${PD_GPU_NODES:-12}
OPERATOR_NS=pd-system
RELEASE=pd-operator

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

stop_operator() {
  if [ -f "$PD_CLUSTER_DIR/operator.pid" ]; then
    kill "$(cat "$PD_CLUSTER_DIR/operator.pid")" 2>/dev/null || true
    rm -f "$PD_CLUSTER_DIR/operator.pid"
  fi
}

case "${1:-up}" in
  down) stop_operator; hack/cluster.sh down; exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

cargo build --locked --quiet
PD="${CARGO_TARGET_DIR:-$ROOT/target}/debug/pd-operator"

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
kubectl wait --for=condition=Established crd/pddeployments.pd.inference.dev --timeout=60s
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# No container runs on kwok nodes: the operator runs on this host (replicaCount=0) and the
# chart's webhook registration points at it by URL.
helm install "$RELEASE" charts/pd-operator -n "$OPERATOR_NS" --create-namespace \
  --set replicaCount=0 --set "webhook.url=https://127.0.0.1:$PORT/validate" --wait

say "run the operator under the chart's ServiceAccount (its least-privilege RBAC)"
TOKEN=$(kubectl create token "$RELEASE" -n "$OPERATOR_NS" --duration 24h)
SERVER=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
cat >"$PD_CLUSTER_DIR/operator.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: pd-local, cluster: {server: "$SERVER", certificate-authority: "$PD_CLUSTER_DIR/pki/ca.crt"}}]
users: [{name: pd-operator, user: {token: "$TOKEN"}}]
contexts: [{name: pd-local, context: {cluster: pd-local, user: pd-operator}}]
current-context: pd-local
KC
KUBECONFIG="$PD_CLUSTER_DIR/operator.kubeconfig" POD_NAMESPACE="$OPERATOR_NS" nohup "$PD" controller \
  --admin-addr 127.0.0.1:0 --lease-name "$RELEASE" --webhook-config "$RELEASE" --webhook-secret "$RELEASE-webhook-tls" \
  --webhook-addr "127.0.0.1:$PORT" --webhook-ip-sans 127.0.0.1 >"$PD_CLUSTER_DIR/logs/operator.log" 2>&1 &
echo $! >"$PD_CLUSTER_DIR/operator.pid"
for _ in $(seq 1 60); do
  kubectl get validatingwebhookconfiguration "$RELEASE" -o jsonpath='{.webhooks[0].clientConfig.caBundle}' | grep -q . && break
  sleep 0.5
done

say "admission: the Qwen dcp: 2 mistake is denied with SGLang's words"
for _ in $(seq 1 20); do
  if out=$(kubectl apply -f examples/qwen-dcp2-mistake.yaml 2>&1); then
    kubectl delete -f examples/qwen-dcp2-mistake.yaml >/dev/null 2>&1; sleep 1
  else
    echo "$out"; break
  fi
done

say "the valid examples, reconciled"
for f in deepseek-v3-dcp qwen3-gqa multi-node-prefill llama-different-tp; do kubectl apply -f "examples/$f.yaml"; done
sleep 8
kubectl get pdd
kubectl get pods -o wide -l app.kubernetes.io/managed-by=pd-operator | head -20

say "the cluster and the operator keep running; to use them:"
echo "$EXPORT"
echo "export PATH=$BIN:\$PATH"
echo "(operator log: $PD_CLUSTER_DIR/logs/operator.log; make demo-down stops everything)"
