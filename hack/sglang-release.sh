#!/usr/bin/env bash
# Another SGLang release's code for the parity oracle: the release's wheel (--no-deps) unpacked
# into a directory that goes first on PYTHONPATH in front of the oracle venv (which holds 0.5.23
# and the torch/transformers those releases' start-up resolution runs with), plus einops, which
# 0.5.21 and 0.5.22 import on that path. Cached outside the clone, keyed by the versions; prints
# the directory.   hack/sglang-release.sh 0.5.21
set -euo pipefail
SGLANG=${1:?usage: hack/sglang-release.sh VERSION}
EINOPS=0.8.2
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
DIR="${PD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}/tools/sglang-release-${SGLANG}_einops-${EINOPS}"
STAMP="$DIR/.pd-operator-complete"
if [ ! -f "$STAMP" ]; then
  rm -rf "$DIR" && mkdir -p "$DIR"
  pip=("$PYTHON" -m pip --disable-pip-version-check --no-input --quiet)
  "${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.11 -d "$DIR/wheel" "sglang==${SGLANG}" >&2
  "$PYTHON" -m zipfile -e "$DIR"/wheel/sglang-*.whl "$DIR" >&2
  "${pip[@]}" install --no-deps --target "$DIR" "einops==${EINOPS}" >&2
  rm -rf "$DIR/wheel"
  grep -q "__version__ = version = '${SGLANG}'" "$DIR/sglang/_version.py" || { echo "sglang ${SGLANG}: unexpected _version.py" >&2; exit 1; }
  touch "$STAMP"
fi
# 0.5.19 and 0.5.20 import xgrammar on the server-argument path (function_call/inkling_detector.py),
# which the oracle venv does not hold: that release's pin of it, --no-deps, beside its code.
XSTAMP="$DIR/.pd-operator-xgrammar"
if [ ! -f "$XSTAMP" ]; then
  if grep -qs '^from xgrammar' "$DIR/sglang/srt/function_call/inkling_detector.py"; then
    xgrammar=$(grep -m1 '^Requires-Dist: xgrammar==' "$DIR"/sglang-*.dist-info/METADATA | cut -d= -f3)
    "${PYTHON}" -m pip --disable-pip-version-check --no-input --quiet install --no-deps --target "$DIR" "xgrammar==${xgrammar}" >&2
  fi
  touch "$XSTAMP"
fi
# 0.5.19 registers a config name (qwen3_asr) the oracle venv's newer transformers already holds:
# it runs with its own transformers and tokenizers pins, --no-deps, beside its code.
TSTAMP="$DIR/.pd-operator-transformers"
if [ ! -f "$TSTAMP" ]; then
  if [ "$SGLANG" = 0.5.19 ]; then
    pins=()
    for dep in transformers tokenizers; do
      pins+=("$dep==$(grep -m1 "^Requires-Dist: $dep==" "$DIR"/sglang-*.dist-info/METADATA | cut -d= -f3)")
    done
    "${PYTHON}" -m pip --disable-pip-version-check --no-input --quiet install --no-deps --only-binary=:all: --python-version 3.11 \
      --target "$DIR" "${pins[@]}" >&2
  fi
  touch "$TSTAMP"
fi
echo "$DIR"
