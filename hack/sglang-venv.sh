#!/usr/bin/env bash
# A Python venv with the pinned SGLang wheel (no dependencies: no torch, no GPU code) and aiohttp,
# for the interop tests. Cached outside the clone, keyed by version; prints the venv's python.
set -euo pipefail
# shellcheck source=hack/lib/venv.sh
source "$(dirname "$0")/lib/venv.sh"
SGLANG_VERSION=0.5.23
AIOHTTP_VERSION=3.14.5
# --no-deps: SGLang's dependencies (torch, CUDA kernels) are what the tests must not need.
cached_venv "sglang-${SGLANG_VERSION}_aiohttp-${AIOHTTP_VERSION}" 'import aiohttp, importlib.util as u; assert u.find_spec("sglang")' \
  "aiohttp==${AIOHTTP_VERSION}" -- --no-deps "sglang==${SGLANG_VERSION}"
