# pd-operator: one static-enough binary on a minimal non-root base.
#
# Online (users):   docker build -t pd-operator:0.1.0 .
# Offline (here):   docker build --build-arg BUILDER_IMAGE=<local rust image> \
#                     --build-arg RUNTIME_IMAGE=<local debian-slim image> -t pd-operator:0.1.0 .
# Both images are only named by build arguments, so a locally assembled builder works the same.
ARG BUILDER_IMAGE=docker.io/library/rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0
COPY Cargo.toml Cargo.lock ./
# Dependencies first, against placeholder sources: this layer is reused until Cargo.lock changes,
# so a source edit rebuilds only our crate. (Cargo.toml declares a benchmark and the chaos test;
# cargo refuses a manifest whose targets are missing, so the test's placeholder stays.)
RUN mkdir -p src benches tests \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs && echo 'fn main() {}' > benches/controller_scale.rs \
 && echo 'fn main() {}' > tests/chaos.rs \
 && cargo build --release --locked --bin pd-operator \
 && rm -rf src benches
COPY src ./src
COPY benches ./benches
# COPY keeps the files' own mtimes, which may predate the placeholder build: make cargo see them.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin pd-operator \
 && strip target/release/pd-operator \
 && cp target/release/pd-operator /pd-operator

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="pd-operator" \
      org.opencontainers.image.description="Kubernetes operator for SGLang prefill/decode disaggregation that rejects incompatible topologies before they reach a GPU" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /pd-operator /usr/local/bin/pd-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/pd-operator"]
CMD ["controller"]
