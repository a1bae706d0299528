#!/usr/bin/env bash
# A Python venv with the pinned SGLang wheel (no dependencies: no torch, no GPU code) and aiohttp,
# for the interop tests. Cached outside the clone, keyed by version; prints the venv's python.
set -euo pipefail
SGLANG_VERSION=0.5.23
AIOHTTP_VERSION=3.14.5
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV="${PD_CACHE_DIR:-$HOME/.cache/pd-operator}/tools/sglang-${SGLANG_VERSION}_aiohttp-${AIOHTTP_VERSION}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import aiohttp, importlib.util as u; assert u.find_spec("sglang")' 2>/dev/null; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "aiohttp==${AIOHTTP_VERSION}" >&2
  # --no-deps: SGLang's dependencies (torch, CUDA kernels) are what the tests must not need.
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "sglang==${SGLANG_VERSION}" >&2
fi
echo "$VENV/bin/python"
