#!/usr/bin/env bash
# `make test`: the alert rules' promtool tests, unit and property tests, then the suites against a
# real control plane started here (or the cluster PD_E2E_KUBECONFIG points at). The cluster is
# stopped even on failure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

BIN=$(hack/tools.sh | tail -n 1)
export PD_TOOLS_BIN="$BIN"
export PATH="$BIN:$PATH"

# The alert rules' unit tests run first, with a real promtool pinned like the tools above
# (tests/observability.rs checks that every alert has cases that fire and cases that stay silent).
PROM_BIN=$(hack/prometheus.sh | tail -n 1)
export PD_PROMETHEUS_BIN="$PROM_BIN"
echo "[test] promtool test rules charts/pd-operator/rules/tests"
"$PROM_BIN/promtool" test rules charts/pd-operator/rules/tests/*.yaml

# The interop tests load SGLang's bootstrap server from the pinned wheel.
export PD_SGLANG_PYTHON=${PD_SGLANG_PYTHON:-$(hack/sglang-venv.sh)}

# Tests run in parallel on one cluster and together ask for far more than 32 GPUs.
export PD_GPU_NODES=${PD_GPU_NODES:-16}

if [ -z "${PD_E2E_KUBECONFIG:-}" ]; then
  export PD_CLUSTER_DIR
  PD_CLUSTER_DIR=$(mktemp -d /tmp/pd-test-cluster.XXXXXX)
  trap 'hack/cluster.sh down >/dev/null 2>&1 || true' EXIT
  hack/cluster.sh up >/dev/null
  export PD_E2E_KUBECONFIG="$PD_CLUSTER_DIR/kubeconfig"
fi
echo "[test] running cargo test against $PD_E2E_KUBECONFIG"
# Every crate's unit tests and the integration tests; benchmarks are run by hack/bench-*.sh. Cargo
# builds only the package-under-test's own binaries for its tests: the suites also run pd-sim.
LOG=$(mktemp)
set +e
cargo build --locked --workspace --bins \
  && KUBECTL_PD="${CARGO_TARGET_DIR:-target}/debug/kubectl-pd" hack/krew.sh test \
  && cargo test --locked --workspace --no-fail-fast -- --test-threads="${PD_TEST_THREADS:-4}" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e
# One closing line over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$LOG"
rm -f "$LOG"
exit "$status"
