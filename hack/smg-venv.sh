#!/usr/bin/env bash
# A Python venv with the pinned SGLang model gateway (PyPI `smg`, formerly sglang-router) and its
# dependencies, for the process-level serving test and the serving benchmark. Cached outside the
# clone, keyed by version; prints the venv's python last (everything else goes to stderr).
set -euo pipefail
SMG_VERSION=1.13.0
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV="${PD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}/tools/smg-${SMG_VERSION}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import smg.launch_router' 2>/dev/null; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "smg==${SMG_VERSION}" >&2
  "$VENV/bin/python" -c 'import smg.launch_router' >&2
fi
echo "$VENV/bin/python"
