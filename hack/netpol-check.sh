#!/usr/bin/env bash
# Shows that a kind cluster of this tier enforces NetworkPolicy (hack/kind/netpol.yaml running):
# in a scratch namespace, a busybox httpd `server` (with a 1 s readiness probe that fails on the
# first miss) and two clients, `friend` (role=client) and `stranger` (no label).
#   1. no policy:                         both clients reach the server
#   2. default-deny ingress on the server: neither does
#   3. plus an allow from role=client:    friend does, stranger does not
#   4. policies deleted:                  both do again
# and the server stays Ready throughout (kubelet's probes come from the node, which kube-router
# lets through). Prints how long each change took to take effect. The namespace is deleted at the end.
#   hack/netpol-check.sh KIND_BINARY CLUSTER KUBECTL_BINARY KUBECONFIG
set -euo pipefail
KIND=$1 CLUSTER=$2 KUBECTL=$3 KCFG=$4
NS=netpol-check
log() { echo "[netpol-check $(date +%H:%M:%S)] $*" >&2; }
k() { "$KUBECTL" --kubeconfig "$KCFG" "$@"; }

PROBE_IMAGE=$("$(dirname "$0")/probe-image.sh")
"$KIND" load docker-image "$PROBE_IMAGE" --name "$CLUSTER" >/dev/null 2>&1

k delete namespace "$NS" --ignore-not-found --wait >/dev/null
k create namespace "$NS" >/dev/null
trap 'k delete namespace "$NS" --wait=false >/dev/null 2>&1 || true' EXIT
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: httpd
    image: $PROBE_IMAGE
    imagePullPolicy: Never
    command: [httpd, -f, -p, "8080", -h, /www]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1, failureThreshold: 1, timeoutSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: friend, labels: {role: client}}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: $PROBE_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: stranger}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: $PROBE_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"]}]
EOF
k -n "$NS" wait --for=condition=Ready pod/server pod/friend pod/stranger --timeout=120s >/dev/null
IP=$(k -n "$NS" get pod server -o jsonpath='{.status.podIP}')
log "server at $IP:8080"

# An HTTP answer from the server, not just an open port.
reach() { k -n "$NS" exec "$1" -- sh -c "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 1 $IP 8080 | grep -q '^ok'" >/dev/null 2>&1; }
# expect FRIEND STRANGER (yes/no): polls up to 30 s until both outcomes hold in two rounds in a row
# (a single refused connection could be a fluke); reports when they first held.
expect() {
  local want_f=$1 want_s=$2 t0 f s held=""
  t0=$(date +%s%N)
  for _ in $(seq 1 30); do
    if reach friend; then f=yes; else f=no; fi
    if reach stranger; then s=yes; else s=no; fi
    if [ "$f" = "$want_f" ] && [ "$s" = "$want_s" ]; then
      if [ -n "$held" ]; then log "  friend=$f stranger=$s after $held ms"; return 0; fi
      held=$(( ($(date +%s%N) - t0) / 1000000 ))
    else
      held=""
    fi
    sleep 1
  done
  log "FAILED: wanted friend=$want_f stranger=$want_s, got friend=$f stranger=$s"; exit 1
}
# Failed readiness probes of the server so far (the Unhealthy events' counts).
probe_failures() {
  k -n "$NS" get events --field-selector involvedObject.name=server,reason=Unhealthy -o jsonpath='{range .items[*]}{.count}{"\n"}{end}' \
    | awk '{n += $1} END {print n + 0}'
}
ready_unbroken() {
  local failed ready
  ready=$(k -n "$NS" get pod server -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
  failed=$(( $(probe_failures) - BASELINE ))
  log "  server Ready=$ready, readiness probe failures since the first policy: $failed"
  if [ "$ready" != True ] || [ "$failed" != 0 ]; then log "FAILED: the server's readiness probe failed under the policy"; exit 1; fi
}

log "1. no policy"
expect yes yes
# A probe may fail while httpd starts; count from here.
BASELINE=$(probe_failures)
log "2. default-deny ingress on app=server"
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-deny-ingress}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
EOF
expect no no
sleep 5; ready_unbroken
log "3. allow from role=client"
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-allow-clients}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 8080, protocol: TCP}]
EOF
expect yes no
sleep 5; ready_unbroken
log "4. policies deleted"
k -n "$NS" delete networkpolicy --all >/dev/null
expect yes yes
ready_unbroken
log "NetworkPolicy is enforced"
