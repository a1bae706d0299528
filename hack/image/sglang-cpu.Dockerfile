# The kind tier's CPU engine image for the engine dry run: one SGLang release's code and what its
# start-up path imports, on a Debian python3 base. Built by hack/sglang-cpu-image.sh, whose
# context is the prepared site-packages; it serves nothing (no GPU kernels).
ARG RUNTIME_IMAGE=pd-operator-python:bookworm
FROM ${RUNTIME_IMAGE}
ARG SGLANG_RELEASE
LABEL org.opencontainers.image.title="pd-sglang-cpu" \
      org.opencontainers.image.description="SGLang ${SGLANG_RELEASE}'s own code for pd-operator's engine dry run on CPU (kind tier)" \
      org.opencontainers.image.version="${SGLANG_RELEASE}"
COPY site-packages /usr/local/lib/python3.11/dist-packages
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
