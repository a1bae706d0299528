# pd-operator, and its GPU-free stand-in pd-sim, each one binary on a minimal non-root base.
#
# Online (users):   docker build -t pd-operator:0.1.0 .   (the last stage: the operator)
#                   docker build --target sim -t pd-sim:0.1.0 .
# Offline (here):   docker build --build-arg BUILDER_IMAGE=<local rust image> \
#                     --build-arg RUNTIME_IMAGE=<local debian-slim image> -t pd-operator:0.1.0 .
# Both images are only named by build arguments, so a locally assembled builder works the same.
ARG BUILDER_IMAGE=docker.io/library/rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0
COPY Cargo.toml Cargo.lock ./
COPY src/api/Cargo.toml src/api/
COPY src/core/Cargo.toml src/core/
COPY src/runtime/Cargo.toml src/runtime/
COPY src/sim/Cargo.toml src/sim/
COPY src/testing/Cargo.toml src/testing/
COPY src/kubectl/Cargo.toml src/kubectl/
# Dependencies first, against placeholder sources: this layer is reused until a manifest or
# Cargo.lock changes, so a source edit rebuilds only the workspace's crates. (Cargo refuses a
# manifest whose declared targets are missing, so every target gets a placeholder.)
RUN mkdir -p src/operator src/core/benches benches tests \
 && for f in src/api/lib.rs src/core/lib.rs src/runtime/lib.rs src/sim/lib.rs src/testing/lib.rs src/kubectl/lib.rs src/operator/lib.rs; do touch "$f"; done \
 && for f in src/operator/main.rs src/sim/main.rs src/kubectl/main.rs src/testing/parity_cases.rs benches/controller_scale.rs src/core/benches/planner_scrape.rs tests/chaos.rs tests/bench_planner.rs; do echo 'fn main() {}' > "$f"; done \
 && cargo build --release --locked -p pd-operator -p pd-sim \
 && find src benches -name '*.rs' -delete
COPY src ./src
COPY benches ./benches
# COPY keeps the files' own mtimes, which may predate the placeholder build: make cargo see them.
RUN find src benches -name '*.rs' -exec touch {} + \
 && cargo build --release --locked -p pd-operator -p pd-sim \
 && strip target/release/pd-operator target/release/pd-sim \
 && cp target/release/pd-operator target/release/pd-sim /

# The stand-in: `engine.type: sim` pods run it (the operator's --sim-image).
FROM ${RUNTIME_IMAGE} AS sim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="pd-sim" \
      org.opencontainers.image.description="GPU-free stand-in for SGLang prefill and decode engines, for demos and tests of pd-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /pd-sim /usr/local/bin/pd-sim
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/pd-sim"]

FROM ${RUNTIME_IMAGE} AS operator
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="pd-operator" \
      org.opencontainers.image.description="Kubernetes operator for SGLang prefill/decode disaggregation that rejects incompatible topologies before they reach a GPU" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /pd-operator /usr/local/bin/pd-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/pd-operator"]
CMD ["controller"]
