#!/usr/bin/env bash
# Installs the kind tier's Prometheus and kube-state-metrics (hack/kind/prometheus.yaml) into a
# running kind cluster: builds or reuses their images (hack/monitoring-images.sh), loads them into
# the node, puts the chart's rule file in the ConfigMap `prometheus-rules`, and waits for both.
#   hack/kind-monitoring.sh KIND CLUSTER KUBECTL KUBECONFIG
#
# Time compressed for the tier: the rule file is the chart's (charts/pd-operator/rules/) with one
# line changed, PDDecodeHandshakeFailing's `for: 5m` to `for: $PD_KIND_HANDSHAKE_ALERT_FOR` (30s),
# so tests/e2e_kind_prometheus.rs can see it fire and clear in a minute or two. The expression is
# unchanged; the test checks that this is the only difference.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIND=$1 CLUSTER=$2 KUBECTL=$3 KUBECONFIG_FILE=$4
NS=monitoring
FOR=${PD_KIND_HANDSHAKE_ALERT_FOR:-30s}
RULES="$ROOT/charts/pd-operator/rules/pd-operator.rules.yaml"
kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
log() { echo "[kind-monitoring $(date +%H:%M:%S)] $*" >&2; }
t=$(date +%s)

images=$("$ROOT/hack/monitoring-images.sh")
PROMETHEUS_IMAGE=$(sed -n 's/^PROMETHEUS_IMAGE=//p' <<<"$images")
KSM_IMAGE=$(sed -n 's/^KSM_IMAGE=//p' <<<"$images")
log "images $PROMETHEUS_IMAGE $KSM_IMAGE ready after $(( $(date +%s) - t ))s"
"$KIND" load docker-image "$PROMETHEUS_IMAGE" "$KSM_IMAGE" --name "$CLUSTER" >&2

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The alert's `for:` is the first `for:` line after its `- alert:` line.
rules=$(awk -v want="$FOR" '
  /^  - alert: PDDecodeHandshakeFailing$/ { hit = 1 }
  hit && /^    for: / { sub(/for: .*/, "for: " want); hit = 0; done = 1 }
  { print }
  END { if (!done) exit 1 }' "$RULES") || { log "no PDDecodeHandshakeFailing for: line in $RULES"; exit 1; }
kubectl -n "$NS" create configmap prometheus-rules --from-literal=pd-operator.rules.yaml="$rules" \
  --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
sed -e "s#image: pd-prometheus:.*#image: $PROMETHEUS_IMAGE#" -e "s#image: pd-kube-state-metrics:.*#image: $KSM_IMAGE#" \
  "$ROOT/hack/kind/prometheus.yaml" | kubectl apply -f - >/dev/null
kubectl -n "$NS" rollout status deployment/kube-state-metrics --timeout=180s >/dev/null
kubectl -n "$NS" rollout status deployment/prometheus --timeout=180s >/dev/null
log "Prometheus and kube-state-metrics ready in $(( $(date +%s) - t ))s (handshake alert for: $FOR)"
