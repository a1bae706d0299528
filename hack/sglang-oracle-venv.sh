#!/usr/bin/env bash
# The parity oracle's Python: SGLang 0.5.23 (--no-deps) with the real PyPI torch and the modules
# its start-up path imports, so tests/parity/oracle.py can run SGLang's own argument resolution
# on a CPU-only host (docs/parity.md). About 6 GB and a few minutes the first time; cached
# outside the clone, keyed by the versions and the lock file, so a second run is instant.
# Prints the venv's python as its last line.
set -euo pipefail
SGLANG=0.5.23
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCK="$HERE/sglang-oracle-requirements.txt"
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || { echo "need $PYTHON (SGLang's wheel is cp311)" >&2; exit 1; }
torch=$(grep -m1 '^torch==' "$LOCK" | cut -d= -f3)
transformers=$(grep -m1 '^transformers==' "$LOCK" | cut -d= -f3)
lock_hash=$(grep -v '^#' "$LOCK" | sha256sum | cut -c1-8)
KEY="sglang-${SGLANG}_torch-${torch}_transformers-${transformers}_${lock_hash}"
VENV="${PD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}/tools/sglang-oracle-${KEY}"
STAMP="$VENV/.pd-operator-complete"
if [ ! -f "$STAMP" ]; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  start=$(date +%s)
  "$PYTHON" -m venv "$VENV" >&2
  pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input)
  # torch needs its nvidia-* wheels only so libtorch_cuda.so loads; nothing runs on a GPU.
  "${pip[@]}" -r "$LOCK" >&2
  # --no-deps: SGLang's full dependency set (sgl_kernel, flashinfer, CUDA kernels) is what a
  # CPU-only host cannot load; start-up resolution needs none of it.
  "${pip[@]}" --no-deps "sglang==${SGLANG}" >&2
  "$VENV/bin/python" -c 'import torch, transformers, sglang.srt.server_args' >&2
  echo "sglang oracle venv installed in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1)" >&2
  touch "$STAMP"
fi
echo "$VENV/bin/python"
