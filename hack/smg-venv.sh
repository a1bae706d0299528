#!/usr/bin/env bash
# A Python venv with the pinned SGLang model gateway (PyPI `smg`, formerly sglang-router) and its
# dependencies, for the process-level serving test and the serving benchmark. Cached outside the
# clone, keyed by version; prints the venv's python last (everything else goes to stderr).
set -euo pipefail
# shellcheck source=hack/lib/venv.sh
source "$(dirname "$0")/lib/venv.sh"
# shellcheck source=hack/lib/smg.sh
source "$(dirname "$0")/lib/smg.sh"
cached_venv "smg-${SMG_VERSION}" 'import smg.launch_router' "smg==${SMG_VERSION}"
