#!/usr/bin/env bash
# A real Kubernetes control plane as plain processes on loopback: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake GPU nodes). No Docker, no images.
#
#   hack/cluster.sh up     start (state in $PD_CLUSTER_DIR, default .cluster/); last line: export KUBECONFIG=...
#   hack/cluster.sh down   stop exactly the processes `up` started and remove the state dir
#   hack/cluster.sh env    print the export line of a running cluster
#   hack/cluster.sh kill NAME     SIGKILL one component (etcd, kube-apiserver, ...), as a crash would
#   hack/cluster.sh restart NAME  start a killed component again with the flags `up` gave it
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${PD_CLUSTER_DIR:-$ROOT/.cluster}
GPU_NODES=${PD_GPU_NODES:-4}
GPUS_PER_NODE=${PD_GPUS_PER_NODE:-8}
# Kubernetes' own gang scheduling (KEP-4671): Workload and PodGroup in scheduling.k8s.io/v1beta1 are
# beta but off by default in 1.37; topology constraints on a PodGroup are alpha.
WORKLOAD_GATES=GenericWorkload=true,TopologyAwareWorkloadScheduling=true

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# shellcheck source=lib/wait.sh
. "$ROOT/hack/lib/wait.sh"

start() { # name, command...
  local name=$1; shift
  mkdir -p "$STATE/cmds"
  printf '%q ' "$@" >"$STATE/cmds/$name"
  "$@" >>"$STATE/logs/$name.log" 2>&1 &
  echo $! >"$STATE/pids/$name"
}

check_alive() {
  local name=$1 pid
  pid=$(cat "$STATE/pids/$name")
  kill -0 "$pid" 2>/dev/null || { tail -n 40 "$STATE/logs/$name.log" >&2; die "$name exited (log: $STATE/logs/$name.log)"; }
}

pki() {
  local p="$STATE/pki"; mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=pd-test-ca \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=pd-admin" \
    -keyout "$p/admin.key" -out "$p/admin.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$p/admin.ext"
  openssl x509 -req -in "$p/admin.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 3650 -extfile "$p/admin.ext" -out "$p/admin.crt" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
}

kubeconfig() { # server
  cat >"$STATE/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: pd-local, cluster: {server: "$1", certificate-authority: "$STATE/pki/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$STATE/pki/admin.crt", client-key: "$STATE/pki/admin.key"}}]
contexts: [{name: pd-local, context: {cluster: pd-local, user: admin}}]
current-context: pd-local
KC
}

gpu_nodes() {
  local i
  for i in $(seq 0 $((GPU_NODES - 1))); do
    cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-gpu-$i
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/os: linux, kubernetes.io/arch: amd64, kubernetes.io/hostname: kwok-gpu-$i, nvidia.com/gpu.present: "true"}
status:
  capacity: {cpu: "128", memory: 1Ti, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
  allocatable: {cpu: "128", memory: 1Ti, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
NODE
  done
}

nodes_ready() {
  local out
  out=$("$BIN/kubectl" get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints}{"\n"}{end}') || return 1
  [ "$(echo "$out" | grep -c ' True ')" -ge "$GPU_NODES" ] && ! echo "$out" | grep -q not-ready
}

up() {
  if [ -f "$STATE/kubeconfig" ] && [ -d "$STATE/pids" ]; then
    die "a cluster already runs from $STATE (run '$0 down' first, or set PD_CLUSTER_DIR)"
  fi
  BIN=$("$ROOT/hack/tools.sh" | tail -n 1)
  export PATH="$BIN:$PATH"
  local stages
  stages="$(dirname "$BIN")/kwok-stages"
  rm -rf "$STATE"; mkdir -p "$STATE/logs" "$STATE/pids" "$STATE/etcd"
  echo "$BIN" >"$STATE/bin"
  log "state in $STATE"
  pki
  local ep pp ap kp sp wp
  ep=$(free_port); pp=$(free_port); ap=$(free_port); kp=$(free_port); sp=$(free_port); wp=$(free_port)
  kubeconfig "https://127.0.0.1:$ap"
  export KUBECONFIG="$STATE/kubeconfig"

  start etcd etcd --name=node0 --data-dir="$STATE/etcd" --unsafe-no-fsync=true --auto-compaction-retention=1 \
    --listen-client-urls="http://127.0.0.1:$ep" --advertise-client-urls="http://127.0.0.1:$ep" \
    --listen-peer-urls="http://127.0.0.1:$pp" --initial-advertise-peer-urls="http://127.0.0.1:$pp" \
    --initial-cluster="node0=http://127.0.0.1:$pp" --listen-metrics-urls=""
  wait_for "etcd" 30 curl -sf "http://127.0.0.1:$ep/health" || { check_alive etcd; die "etcd not healthy"; }
  log "etcd up on :$ep"

  # The aggregation layer (proxy client and request-header flags) serves the HPA test's own
  # external metrics API; aggregator routing dials endpoint IPs, since nothing proxies ClusterIPs.
  start kube-apiserver kube-apiserver --etcd-servers="http://127.0.0.1:$ep" --bind-address=127.0.0.1 --secure-port="$ap" \
    --advertise-address=127.0.0.1 --endpoint-reconciler-type=none --allow-privileged=true \
    --tls-cert-file="$STATE/pki/admin.crt" --tls-private-key-file="$STATE/pki/admin.key" --client-ca-file="$STATE/pki/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$STATE/pki/sa.key" --service-account-signing-key-file="$STATE/pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=RBAC --enable-priority-and-fairness=false \
    --proxy-client-cert-file="$STATE/pki/admin.crt" --proxy-client-key-file="$STATE/pki/admin.key" \
    --requestheader-client-ca-file="$STATE/pki/ca.crt" --requestheader-allowed-names=pd-admin \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- --enable-aggregator-routing=true \
    --feature-gates="$WORKLOAD_GATES" --runtime-config=scheduling.k8s.io/v1beta1=true
  wait_for "kube-apiserver /readyz" 90 kubectl get --raw /readyz || { check_alive kube-apiserver; die "kube-apiserver not ready"; }
  log "kube-apiserver up on :$ap"

  start kube-controller-manager kube-controller-manager --kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 --secure-port="$kp" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics --leader-elect=false \
    --use-service-account-credentials=true --service-account-private-key-file="$STATE/pki/sa.key" \
    --root-ca-file="$STATE/pki/ca.crt" --cluster-signing-cert-file="$STATE/pki/ca.crt" --cluster-signing-key-file="$STATE/pki/ca.key" \
    --node-monitor-period=5s --node-monitor-grace-period=40s --concurrent-gc-syncs=5 \
    --horizontal-pod-autoscaler-sync-period=5s --feature-gates="$WORKLOAD_GATES"
  start kube-scheduler kube-scheduler --kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 --secure-port="$sp" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics --leader-elect=false --feature-gates="$WORKLOAD_GATES"
  wait_for "kube-controller-manager" 60 curl -skf "https://127.0.0.1:$kp/healthz" || { check_alive kube-controller-manager; die "kube-controller-manager not healthy"; }
  wait_for "kube-scheduler" 60 curl -skf "https://127.0.0.1:$sp/healthz" || { check_alive kube-scheduler; die "kube-scheduler not healthy"; }
  log "controller-manager :$kp and scheduler :$sp up"

  {
    printf 'apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n  cidr: 10.244.0.0/16\n  nodeLeaseDurationSeconds: 40\n  nodeLeaseParallelism: 4\n  podPlayStageParallelism: 4\n  nodePlayStageParallelism: 4\n  podsOnNodeSyncParallelism: 4\n'
    for f in "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
             "$ROOT/hack/kwok/pod-stages.yaml" "$stages/pod/fast/pod-complete.yaml" "$stages/pod/fast/pod-delete.yaml"; do
      [ -f "$f" ] || die "kwok stage file missing: $f"
      printf -- '---\n'; cat "$f"; printf '\n'
    done
  } >"$STATE/kwok.yaml"
  start kwok kwok --kubeconfig="$KUBECONFIG" --config="$STATE/kwok.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40 --server-address="127.0.0.1:$wp" --node-port="$wp"
  sleep 1; check_alive kwok
  gpu_nodes | kubectl apply -f - >/dev/null
  wait_for "$GPU_NODES Ready kwok GPU nodes without the not-ready taint" 120 nodes_ready || { check_alive kwok; die "nodes not ready"; }
  wait_for "the default ServiceAccount" 60 kubectl get serviceaccount default -n default
  log "$GPU_NODES kwok GPU nodes Ready ($GPUS_PER_NODE x nvidia.com/gpu each)"
  echo "export KUBECONFIG=$STATE/kubeconfig"
}

down() {
  [ -d "$STATE/pids" ] || { log "no cluster state in $STATE"; rm -rf "$STATE"; return 0; }
  local name pid
  for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [ -f "$STATE/pids/$name" ] || continue
    pid=$(cat "$STATE/pids/$name")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$STATE"
  log "stopped and removed $STATE"
}

component() { # name: checks that `up` started it
  [ -n "${1:-}" ] && [ -f "$STATE/cmds/$1" ] || die "no component '${1:-}' in $STATE (one of: $(ls "$STATE/cmds" 2>/dev/null | tr '\n' ' '))"
}

kill_component() {
  component "$1"
  local pid; pid=$(cat "$STATE/pids/$1")
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  log "$1 (pid $pid) killed"
}

restart_component() {
  component "$1"
  local pid; pid=$(cat "$STATE/pids/$1")
  kill -0 "$pid" 2>/dev/null && die "$1 still runs (pid $pid); kill it first"
  BIN=$(cat "$STATE/bin"); export PATH="$BIN:$PATH" KUBECONFIG="$STATE/kubeconfig"
  eval "start $1 $(cat "$STATE/cmds/$1")"
  case "$1" in
    etcd) wait_for "etcd" 30 etcdctl_health ;;
    kube-apiserver) wait_for "kube-apiserver /readyz" 90 kubectl get --raw /readyz ;;
    *) sleep 1 ;;
  esac || { check_alive "$1"; die "$1 did not come back"; }
  check_alive "$1"
  log "$1 restarted (pid $(cat "$STATE/pids/$1"))"
}

etcdctl_health() { curl -sf "$(grep -o 'http://127.0.0.1:[0-9]*' "$STATE/cmds/etcd" | head -n 1)/health"; }

case "${1:-}" in
  up) up ;;
  kill) kill_component "${2:-}" ;;
  restart) restart_component "${2:-}" ;;
  down) down ;;
  env) [ -f "$STATE/kubeconfig" ] && echo "export KUBECONFIG=$STATE/kubeconfig" || die "no cluster in $STATE" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
