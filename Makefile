# The two commands README promises: `make demo` and `make test`.
SHELL := /bin/bash

.PHONY: e2e-engine demo demo-down test rules-test chaos parity parity-sample dry-run-shim image-test gateway-image e2e-kind tools build lint crd bench-serving bench-planner

demo:            ## local control plane with the CRD and the examples, left running
	hack/demo.sh up

demo-down:       ## stop what `make demo` started
	hack/demo.sh down

test:            ## unit, property and real-control-plane tests
	hack/test.sh

rules-test:      ## the alert rules' promtool unit tests alone (make test runs them first)
	"$$(hack/prometheus.sh | tail -n 1)/promtool" test rules charts/pd-operator/rules/tests/*.yaml

chaos:           ## control-plane and operator faults on a local control plane of their own
	hack/chaos.sh

image-test:      ## build the image from the Dockerfile offline (local bases) and run it
	hack/image-test.sh

gateway-image:   ## the PD router image (SGLang's smg gateway on Debian's python3), built offline
	hack/gateway-image.sh

e2e-kind:        ## kind cluster from an offline-built node image; chart, webhook and handshake on real pods
	hack/kind-e2e.sh

e2e-engine:      ## real SGLang 0.5.23 prefill+decode on CPU from rendered argv, KV over Mooncake TCP; the seed refused (CI runs it)
	hack/e2e-engine.sh

bench-serving:   ## gateway -> sim prefill -> KV transfer -> sim decode on loopback: TTFT/ITL/req/s, KV GB/s
	hack/bench-serving.sh

bench-planner:   ## kind: the planner vs a fixed 3 x 1:1 under a shifting open-loop load (SLO windows, GPU-seconds)
	PD_KIND_SUITE=bench-planner hack/kind-e2e.sh

parity:          ## validate vs each SGLang release's own start-up (0.5.21-0.5.23): examples, rule specs, 5,000 generated specs each
	hack/parity.sh

dry-run-shim:    ## the engine dry run's shim on each release's wheel, 0.5.19-0.5.23 (parity runs it too)
	hack/dry-run-shim.sh

parity-sample:   ## the same on examples, rule specs and a fixed-seed sample (CI)
	hack/parity.sh --sample

tools:           ## build the pinned Kubernetes test tooling and Prometheus (promtool) into the cache
	hack/tools.sh
	hack/prometheus.sh

build:
	cargo build --locked --release -p pd-operator -p pd-sim -p kubectl-pd

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

crd:             ## regenerate crds/ and the chart's copy from the Rust types
	cargo run --quiet -- crd > crds/pddeployment.yaml
	cp crds/pddeployment.yaml charts/pd-operator/crds/pddeployment.yaml
