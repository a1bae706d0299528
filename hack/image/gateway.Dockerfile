# The PD router image: SGLang's model gateway (PyPI `smg`) in a venv on a Python base, non-root.
#
# Online (users):   docker build -f hack/image/gateway.Dockerfile -t pd-operator-gateway:smg-1.13.0 hack/image
# Offline (here):   hack/gateway-image.sh (Debian bookworm's python3 as both bases, built locally)
# The wheel and its dependencies come from PyPI during the build; the bases are only named by
# build arguments, and both must keep python3 at the same path (the venv links to it).
ARG BUILDER_IMAGE=docker.io/library/python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=docker.io/library/python:3.11-slim-bookworm

FROM ${BUILDER_IMAGE} AS build
ARG SMG_VERSION=1.13.0
# The system CA bundle (a local builder base may add a proxy's CA to it) instead of pip's own.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/smg \
 && /opt/smg/bin/pip install --quiet "smg==${SMG_VERSION}" \
 && /opt/smg/bin/pip uninstall --quiet --yes pip setuptools \
 && /opt/smg/bin/python3 -c 'import smg.launch_router'

FROM ${RUNTIME_IMAGE}
ARG SMG_VERSION=1.13.0
LABEL org.opencontainers.image.title="pd-operator-gateway" \
      org.opencontainers.image.description="SGLang's model gateway (smg) as pd-operator's PD router" \
      org.opencontainers.image.version="smg-${SMG_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/smg /opt/smg
ENV PATH=/opt/smg/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["python3", "-m", "smg.launch_router"]
