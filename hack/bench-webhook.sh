#!/usr/bin/env bash
# Webhook latency/throughput benchmark: POST /validate over TLS with the operator pinned to one
# core and the load generator (oha, built from crates.io into the tool cache) on the other, at
# fixed request rates. Needs a running cluster (make demo, or PD_E2E_KUBECONFIG).
#   hack/bench-webhook.sh [rates...]     default: 100 500 2000
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RATES=${*:-100 500 2000}
DURATION=${PD_BENCH_SECONDS:-20}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator
OHA_VERSION=1.16.0
OHA="$CACHE/tools/oha-$OHA_VERSION/bin/oha"
if [ ! -x "$OHA" ]; then
  echo "[bench] building oha $OHA_VERSION (once)" >&2
  cargo install oha --version "$OHA_VERSION" --locked --root "$CACHE/tools/oha-$OHA_VERSION" >/dev/null
fi
: "${KUBECONFIG:=${PD_E2E_KUBECONFIG:-$ROOT/.cluster/kubeconfig}}"
export KUBECONFIG
cargo build --release --locked --quiet
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/pd-operator"
NS=pd-bench-webhook
kubectl create namespace "$NS" >/dev/null 2>&1 || true
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ADMIN=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 1 "$BIN" controller --namespace "$NS" --leader-election-namespace "$NS" --webhook-config none \
  --webhook-addr "127.0.0.1:$PORT" --webhook-ip-sans 127.0.0.1 --admin-addr "127.0.0.1:$ADMIN" \
  >/tmp/pd-bench-webhook.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
# shellcheck source=lib/wait.sh
. "$ROOT/hack/lib/wait.sh"
wait_for "the operator's /readyz (log: /tmp/pd-bench-webhook.log)" 60 curl -sf "127.0.0.1:$ADMIN/readyz"
BODY=$(mktemp)
python3 - "$ROOT/examples/qwen-dcp2-mistake.yaml" >"$BODY" <<'PY'
import json, sys
# The full rule path: the Qwen dcp: 2 example, denied with every finding.
obj = {"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "qwen-pd", "namespace": "pd-bench-webhook"},
       "spec": {"model": {"path": "Qwen/Qwen2.5-72B-Instruct"}, "prefill": {"replicas": 1, "parallelism": {"tp": 4}},
                "decode": {"replicas": 1, "parallelism": {"tp": 4, "dcp": 2}}, "kvTransfer": {"backend": "mooncake", "pageSize": 64, "kvCacheDtype": "auto"}}}
print(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
  "uid": "bench", "kind": {"group": "pd.inference.dev", "version": "v1alpha1", "kind": "PDDeployment"},
  "resource": {"group": "pd.inference.dev", "version": "v1alpha1", "resource": "pddeployments"},
  "name": "qwen-pd", "namespace": "pd-bench-webhook", "operation": "CREATE", "userInfo": {}, "object": obj}}))
PY
echo "| rate (req/s) | achieved (req/s) | p50 (ms) | p99 (ms) | max (ms) | success |"
echo "|---|---|---|---|---|---|"
for rate in $RATES; do
  out=$(taskset -c 0 "$OHA" --no-tui --output-format json -z "${DURATION}s" -q "$rate" -c 32 --insecure \
        -m POST -T application/json -D "$BODY" "https://127.0.0.1:$PORT/validate")
  python3 - "$rate" <<PY
import json, sys
d = json.loads('''$out''')
s, p = d["summary"], d["latencyPercentiles"]
print(f"| {sys.argv[1]} | {s['requestsPerSec']:.0f} | {p['p50']*1000:.2f} | {p['p99']*1000:.2f} | {s['slowest']*1000:.2f} | {s['successRate']*100:.1f}% |")
PY
done
echo "(operator CPU seconds: $(awk '{print ($14+$15)/100}' /proc/$PID/stat), peak RSS: $(awk '/VmHWM/{print $2/1024 " MiB"}' /proc/$PID/status))"
