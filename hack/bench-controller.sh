#!/usr/bin/env bash
# Controller scale benchmark on a local control plane with enough kwok nodes for 500 x 8 pods.
#   hack/bench-controller.sh            # N = 10, 100, 500
#   PD_BENCH_N=10,100 hack/bench-controller.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cargo build --release --locked --quiet
export PD_CLUSTER_DIR=${PD_CLUSTER_DIR:-/tmp/pd-bench-cluster}
export PD_GPU_NODES=${PD_GPU_NODES:-40}
trap 'hack/cluster.sh down >/dev/null 2>&1 || true' EXIT
eval "$(hack/cluster.sh up | tail -n 1)"
export PATH="$(cat "$PD_CLUSTER_DIR/bin"):$PATH"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established crd/pddeployments.pd.inference.dev --timeout=60s >/dev/null
PD_BENCH_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/pd-operator" cargo bench --locked --bench controller_scale
