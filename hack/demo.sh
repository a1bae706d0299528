#!/usr/bin/env bash
# `make demo`: validate and render the examples offline, then start the local control plane
# (state in .cluster/), install the CRD and apply the valid examples. Leaves it running.
# `make demo-down` stops it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PD_CLUSTER_DIR="$ROOT/.cluster"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

case "${1:-up}" in
  down) hack/cluster.sh down; exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

cargo build --locked --quiet
PD=target/debug/pd-operator
[ -n "${CARGO_TARGET_DIR:-}" ] && PD="$CARGO_TARGET_DIR/debug/pd-operator"

say "pd-operator validate: the seed's mistake (Qwen2.5, a GQA model, with decode dcp: 2)"
"$PD" validate -f examples/qwen-dcp2-mistake.yaml || echo "(exit $?: rejected, as it should be)"
say "pd-operator validate: every other example"
"$PD" validate -f examples/deepseek-v3-dcp.yaml -f examples/qwen3-gqa.yaml -f examples/multi-node-prefill.yaml \
  -f examples/llama-different-tp.yaml -f examples/sim-demo.yaml
say "pd-operator render: the two-node DeepSeek-R1 prefill leader's engine argv"
"$PD" render -f examples/multi-node-prefill.yaml | awk '/name: r1-prefill-0-0$/{p=1} p&&/- args:/{a=1} a{print} a&&/command:/{exit}' | head -60

say "local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)"
[ -f "$PD_CLUSTER_DIR/kubeconfig" ] && hack/cluster.sh down
EXPORT=$(hack/cluster.sh up | tail -n 1)
eval "$EXPORT"
export PATH="$(cat "$PD_CLUSTER_DIR/bin"):$PATH"
kubectl apply --server-side -f crds/
kubectl wait --for=condition=Established crd/pddeployments.pd.inference.dev --timeout=60s
kubectl get nodes
for f in deepseek-v3-dcp qwen3-gqa multi-node-prefill sim-demo; do kubectl apply -f "examples/$f.yaml"; done
kubectl get pdd
say "the cluster keeps running; to use it:"
echo "$EXPORT"
echo "export PATH=$(cat "$PD_CLUSTER_DIR/bin"):\$PATH"
echo "(make demo-down stops it)"
