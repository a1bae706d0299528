#!/usr/bin/env bash
# `make chaos`: control-plane and operator faults (tests/chaos.rs) on a local control plane of
# their own, since the cases kill kube-apiserver and etcd. The cluster is stopped even on failure.
# Ends with the plain closing line "N passed, N failed"; each case's time to recover is printed
# as a "[chaos]" line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

BIN=$(hack/tools.sh | tail -n 1)
export PD_TOOLS_BIN="$BIN" PATH="$BIN:$PATH"
export PD_CLUSTER_DIR PD_CHAOS_CLUSTER_DIR
PD_CLUSTER_DIR=$(mktemp -d /tmp/pd-chaos-cluster.XXXXXX)
PD_CHAOS_CLUSTER_DIR=$PD_CLUSTER_DIR
trap 'hack/cluster.sh down >/dev/null 2>&1 || true' EXIT
PD_GPU_NODES=${PD_GPU_NODES:-8} hack/cluster.sh up >/dev/null
export PD_E2E_KUBECONFIG="$PD_CLUSTER_DIR/kubeconfig"
echo "[chaos] running tests/chaos.rs against $PD_E2E_KUBECONFIG"
LOG=$(mktemp)
set +e
# One case at a time: each one kills parts of the shared control plane.
cargo test --locked --test chaos -- --test-threads=1 --nocapture 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e
echo "[chaos] times to recover:"
grep -o '\[chaos\] [a-z]*: .* in [0-9.]*s$' "$LOG" | sed 's/^\[chaos\] /  /' || true
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$LOG"
rm -f "$LOG"
exit "$status"
