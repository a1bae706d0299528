#!/usr/bin/env bash
# The engine tier's Python (docs/engine-on-cpu.md): real SGLang 0.5.23 serving on a CPU-only host.
# A venv layered on the parity oracle's (hack/sglang-oracle-venv.sh: SGLang, torch, transformers;
# reused read-only through a .pth file, so the 6 GB of torch are not copied) plus the serving
# modules in hack/sglang-engine-requirements.txt (FastAPI/uvicorn, xgrammar, Mooncake's non-CUDA
# transfer engine, ...). Mooncake's wheel needs Debian's libibverbs1, libnl-3-200 and
# libnl-route-3-200 even for TCP; they are installed with apt-get when missing. About 200 MB and
# under a minute the first time; cached outside the clone, keyed by the oracle's key and the lock
# file. Prints the venv's python as its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCK="$HERE/sglang-engine-requirements.txt"
ORACLE_PY=$("$HERE/sglang-oracle-venv.sh" | tail -n 1)
ORACLE="$(dirname "$(dirname "$ORACLE_PY")")"
lock_hash=$(grep -v '^#' "$LOCK" | sha256sum | cut -c1-8)
KEY="$(basename "$ORACLE" | sed 's/^sglang-oracle-//')_engine-${lock_hash}"
VENV="$(dirname "$ORACLE")/sglang-engine-${KEY}"
STAMP="$VENV/.pd-operator-complete"
need_libs() {
  local missing=()
  for p in libibverbs1 libnl-3-200 libnl-route-3-200; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || { echo "need Debian packages: ${missing[*]}" >&2; exit 1; }
  echo "installing ${missing[*]} for Mooncake's transfer engine" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2
}
need_libs
if [ ! -f "$STAMP" ]; then
  rm -rf "$VENV"
  start=$(date +%s)
  PYTHON="$(readlink -f "$ORACLE_PY")"
  "$PYTHON" -m venv "$VENV" >&2
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  oracle_site=$("$ORACLE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$oracle_site" >"$site/pd-oracle.pth"
  # The oracle's own versions as constraints: pip sees them (through the .pth) as installed and
  # leaves them alone; --no-deps because the lock already names every module needed.
  constraints=$(mktemp); trap 'rm -f "$constraints"' EXIT
  "$ORACLE_PY" -m pip freeze --disable-pip-version-check >"$constraints"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
    -c "$constraints" -r "$LOCK" >&2
  "$VENV/bin/python" -c 'import fastapi, uvicorn, uvloop, xgrammar; from mooncake.engine import TransferEngine' >&2
  echo "sglang engine venv installed in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1)" >&2
  touch "$STAMP"
fi
echo "$VENV/bin/python"
