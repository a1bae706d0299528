#!/usr/bin/env bash
# A real Kubernetes control plane as plain processes on loopback: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake GPU nodes), brought up by kwok's own
# cluster tool, kwokctl, with its binary runtime and the pinned binaries hack/tools.sh builds.
# No Docker, no images. What kwokctl does not set by itself is passed as its --extra-args below.
#
#   hack/cluster.sh up     start (state in $PD_CLUSTER_DIR, default .cluster/); last line: export KUBECONFIG=...
#   hack/cluster.sh down   stop the cluster (kwokctl delete cluster) and remove the state dir
#   hack/cluster.sh env    print the export line of a running cluster
#   hack/cluster.sh kill NAME     SIGKILL one component (etcd, kube-apiserver, ...), as a crash would
#   hack/cluster.sh restart NAME  start a killed component again (kwokctl start cluster starts
#                                 the components that do not run, with the flags they had)
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

# shellcheck source=lib/wait.sh
. "$ROOT/hack/lib/wait.sh"

CLUSTER=pd
kwokctl() { KWOK_WORKDIR="$STATE/kwok" "$BIN/kwokctl" --name "$CLUSTER" "$@"; }
pidfile() { echo "$STATE/kwok/clusters/$CLUSTER/pids/$1.pid"; }
logfile() { echo "$STATE/kwok/clusters/$CLUSTER/logs/$1.log"; }

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
  capacity: {cpu: "128", memory: 1Ti, ephemeral-storage: 1Ti, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
  allocatable: {cpu: "128", memory: 1Ti, ephemeral-storage: 1Ti, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
NODE
  done
}

nodes_ready() {
  local out
  out=$("$BIN/kubectl" get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints}{"\n"}{end}') || return 1
  [ "$(echo "$out" | grep -c ' True ')" -ge "$GPU_NODES" ] && ! echo "$out" | grep -q not-ready
}

# The kwok controller's configuration: its options and stages (kwok's fast node and pod stages, and
# ours, which leave readiness gates to their owner and model the containers kwok does not run).
kwok_config() {
  local stages=$1 f
  printf 'apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n  cidr: 10.244.0.0/16\n  nodeLeaseDurationSeconds: 40\n  nodeLeaseParallelism: 4\n  podPlayStageParallelism: 4\n  nodePlayStageParallelism: 4\n  podsOnNodeSyncParallelism: 4\n'
  for f in "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
           "$ROOT/hack/kwok/pod-stages.yaml" "$stages/pod/fast/pod-complete.yaml" "$stages/pod/fast/pod-delete.yaml"; do
    [ -f "$f" ] || die "kwok stage file missing: $f"
    printf -- '---\n'; cat "$f"; printf '\n'
  done
}

# Flags kwokctl does not set by itself, per component (a KwokctlConfiguration's componentsPatches:
# kwokctl 0.8.0's --extra-args panics on more than one component with several flags): the
# aggregation layer (the HPA test serves its own external metrics API; aggregator routing dials
# endpoint IPs, since nothing proxies ClusterIPs; kwokctl's admin certificate, CN kwok-admin, is
# the proxy's client certificate), the controller-manager's per-controller
# credentials, fast HPA and garbage collection, no leader election (one replica of each), loopback
# only, etcd without fsync, and the kwok controller managing only the GPU nodes made here.
kwokctl_config() {
  local pki="$STATE/kwok/clusters/$CLUSTER/pki"
  cat <<CONFIG
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - {key: requestheader-client-ca-file, value: "$pki/ca.crt"}
  - {key: requestheader-allowed-names, value: kwok-admin}
  - {key: requestheader-username-headers, value: X-Remote-User}
  - {key: requestheader-group-headers, value: X-Remote-Group}
  - {key: requestheader-extra-headers-prefix, value: X-Remote-Extra-}
  - {key: enable-aggregator-routing, value: "true"}
  - {key: enable-priority-and-fairness, value: "false"}
  - {key: service-cluster-ip-range, value: 10.96.0.0/16}
  - {key: bind-address, value: 127.0.0.1}
- name: kube-controller-manager
  extraArgs:
  - {key: use-service-account-credentials, value: "true"}
  - {key: leader-elect, value: "false"}
  - {key: horizontal-pod-autoscaler-sync-period, value: 5s}
  - {key: concurrent-gc-syncs, value: "5"}
  - {key: bind-address, value: 127.0.0.1}
- name: kube-scheduler
  extraArgs:
  - {key: leader-elect, value: "false"}
  - {key: bind-address, value: 127.0.0.1}
- name: etcd
  extraArgs:
  - {key: unsafe-no-fsync, value: "true"}
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: "false"}
  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}
CONFIG
}

up() {
  if [ -f "$STATE/kubeconfig" ] && [ -d "$STATE/kwok" ]; then
    die "a cluster already runs from $STATE (run '$0 down' first, or set PD_CLUSTER_DIR)"
  fi
  BIN=$("$ROOT/hack/tools.sh" | tail -n 1)
  export PATH="$BIN:$PATH"
  # logs/ is for the processes callers run beside the cluster (hack/demo.sh's operator and engines).
  rm -rf "$STATE"; mkdir -p "$STATE/logs"
  echo "$BIN" >"$STATE/bin"
  log "state in $STATE"
  { kwokctl_config; printf -- '---\n'; kwok_config "$(dirname "$BIN")/kwok-stages"; } >"$STATE/kwok.yaml"
  # kwokctl's defaults scale node heartbeats by 5; 1 keeps Kubernetes' own (5 s, 40 s, a 40 s lease).
  kwokctl --config "$STATE/kwok.yaml" create cluster --runtime binary --kubeconfig "$STATE/kubeconfig" --wait 90s \
    --etcd-binary "$BIN/etcd" --kube-apiserver-binary "$BIN/kube-apiserver" \
    --kube-controller-manager-binary "$BIN/kube-controller-manager" --kube-scheduler-binary "$BIN/kube-scheduler" \
    --kwok-controller-binary "$BIN/kwok" --heartbeat-factor 1 --kube-feature-gates "$WORKLOAD_GATES" \
    --kube-runtime-config scheduling.k8s.io/v1beta1=true >"$STATE/kwokctl.log" 2>&1 \
    || { tail -n 20 "$STATE/kwokctl.log" >&2; die "kwokctl create cluster failed (log: $STATE/kwokctl.log)"; }
  export KUBECONFIG="$STATE/kubeconfig"
  # kwokctl 0.8.0 exits 0 when its own wait fails: the control plane is judged here.
  wait_for "kube-apiserver /readyz" 30 kubectl get --raw /readyz \
    || { tail -n 5 "$(logfile kube-apiserver)" >&2; die "kube-apiserver not ready (log: $(logfile kube-apiserver))"; }
  log "control plane up: $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')"
  gpu_nodes | kubectl apply -f - >/dev/null
  wait_for "$GPU_NODES Ready kwok GPU nodes without the not-ready taint" 120 nodes_ready || die "nodes not ready (log: $(logfile kwok-controller))"
  wait_for "the default ServiceAccount" 60 kubectl get serviceaccount default -n default
  log "$GPU_NODES kwok GPU nodes Ready ($GPUS_PER_NODE x nvidia.com/gpu each)"
  echo "export KUBECONFIG=$STATE/kubeconfig"
}

down() {
  [ -d "$STATE/kwok" ] || { log "no cluster state in $STATE"; rm -rf "$STATE"; return 0; }
  BIN=$(cat "$STATE/bin")
  kwokctl delete cluster >/dev/null 2>&1 || log "kwokctl delete cluster failed; removing $STATE anyway"
  rm -rf "$STATE"
  log "stopped and removed $STATE"
}

component() { # name: one of the components kwokctl started
  [ -n "${1:-}" ] && [ -f "$(pidfile "$1")" ] \
    || die "no component '${1:-}' in $STATE (one of: $(ls "$STATE/kwok/clusters/$CLUSTER/pids" 2>/dev/null | sed 's/\.pid$//' | tr '\n' ' '))"
}

gone() { ! kill -0 "$1" 2>/dev/null; }

kill_component() {
  component "$1"
  local pid; pid=$(cat "$(pidfile "$1")")
  kill -9 "$pid" 2>/dev/null || true
  wait_for "$1 (pid $pid) to exit" 10 gone "$pid" || die "$1 still runs after SIGKILL"
  log "$1 (pid $pid) killed"
}

restart_component() {
  component "$1"
  local pid; pid=$(cat "$(pidfile "$1")")
  kill -0 "$pid" 2>/dev/null && die "$1 still runs (pid $pid); kill it first"
  BIN=$(cat "$STATE/bin"); export PATH="$BIN:$PATH" KUBECONFIG="$STATE/kubeconfig"
  kwokctl start cluster >>"$STATE/kwokctl.log" 2>&1 || die "kwokctl start cluster failed (log: $STATE/kwokctl.log)"
  case "$1" in
    kube-apiserver|etcd) wait_for "kube-apiserver /readyz after $1 came back" 90 kubectl get --raw /readyz ;;
    *) sleep 1 ;;
  esac || die "$1 did not come back (log: $(logfile "$1"))"
  pid=$(cat "$(pidfile "$1")")
  kill -0 "$pid" 2>/dev/null || { tail -n 40 "$(logfile "$1")" >&2; die "$1 exited after its restart"; }
  log "$1 restarted (pid $pid)"
}

case "${1:-}" in
  up) up ;;
  kill) kill_component "${2:-}" ;;
  restart) restart_component "${2:-}" ;;
  down) down ;;
  env) [ -f "$STATE/kubeconfig" ] && echo "export KUBECONFIG=$STATE/kubeconfig" || die "no cluster in $STATE" ;;
  *) echo "usage: $0 up|down|env|kill NAME|restart NAME" >&2; exit 2 ;;
esac
