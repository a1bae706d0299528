#!/usr/bin/env bash
# Controller scale benchmark on a local control plane with enough kwok nodes for 500 x 8 pods.
#   hack/bench-controller.sh            # N = 10, 100, 500
#   PD_BENCH_N=10,100 hack/bench-controller.sh
#   PD_BENCH_PARTS=controller,lws PD_BENCH_N=100,500 hack/bench-controller.sh
#   PD_BENCH_BIN=/tmp/pd-operator-before PD_BENCH_PARTS=controller hack/bench-controller.sh
# Parts (default all): controller, floor (pods only), floor-all (every rendered object), lws (the
# same work as LeaderWorkerSets, one per role, under the LWS controller built by hack/lws.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=lib/wait.sh
. hack/lib/wait.sh
cargo build --release --locked --quiet
export PD_CLUSTER_DIR=${PD_CLUSTER_DIR:-/tmp/pd-bench-cluster}
export PD_GPU_NODES=${PD_GPU_NODES:-40}
export PD_BENCH_PARTS=${PD_BENCH_PARTS:-controller,floor,floor-all,lws}
trap 'hack/cluster.sh down >/dev/null 2>&1 || true' EXIT
eval "$(hack/cluster.sh up | tail -n 1)"
export PATH="$(cat "$PD_CLUSTER_DIR/bin"):$PATH"
kubectl apply --server-side -f crds/ >/dev/null
wait_crds_established 60 crds/

# LeaderWorkerSet: its CRD, and its webhooks served by the controller itself as a host process
# (the bench starts it per run): a CA and a serving cert for 127.0.0.1, the module's webhook
# manifests pointed at that URL, the pod webhooks scoped as lws's Helm chart scopes them.
if [[ ",$PD_BENCH_PARTS," == *,lws,* ]]; then
  LWS_DIR=$(hack/lws.sh | tail -n 1)
  W="$PD_CLUSTER_DIR/lws"
  mkdir -p "$W/certs"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=lws-bench-ca \
    -keyout "$W/ca.key" -out "$W/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$W/certs/tls.key" -out "$W/tls.csr" 2>/dev/null
  openssl x509 -req -in "$W/tls.csr" -CA "$W/ca.crt" -CAkey "$W/ca.key" -CAcreateserial -days 30 \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') -out "$W/certs/tls.crt" 2>/dev/null
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  WH_PORT=$(free_port); HEALTH_PORT=$(free_port)
  # client QPS: kube-rs (pd-operator and this bench's client) has no client-side limit; client-go's
  # limiter is set far above anything the run reaches (lws's default is 500/500).
  cat >"$W/config.yaml" <<CFG
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $WH_PORT, certDir: $W/certs}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$HEALTH_PORT"}
clientConnection: {qps: 100000, burst: 100000}
CFG
  python3 - "$LWS_DIR/webhooks.yaml" "$W/ca.crt" "$WH_PORT" >"$W/webhooks.yaml" <<'PY'
import base64, sys, yaml
src, ca, port = sys.argv[1:]
bundle = base64.b64encode(open(ca, "rb").read()).decode()
docs = [d for d in yaml.safe_load_all(open(src)) if d]
for d in docs:
    d["metadata"]["name"] = "lws-" + d["metadata"]["name"]
    for w in d["webhooks"]:
        path = w["clientConfig"]["service"]["path"]
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
        w["timeoutSeconds"] = 10
        if path.endswith("-v1-pod"):
            w["objectSelector"] = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
print(yaml.safe_dump_all(docs))
PY
  kubectl apply --server-side -f "$LWS_DIR/crd.yaml" >/dev/null
  kubectl apply --server-side -f "$W/webhooks.yaml" >/dev/null
  wait_crds_established 60 "$LWS_DIR/crd.yaml"
  export PD_LWS_BIN="$LWS_DIR/bin/lws-controller" PD_LWS_CONFIG="$W/config.yaml" PD_LWS_HEALTH_PORT=$HEALTH_PORT
fi
# PD_BENCH_BIN runs another build of the operator (a saved binary, for an A/B of two commits).
PD_BENCH_BIN="${PD_BENCH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/pd-operator}" cargo bench --locked --bench controller_scale
