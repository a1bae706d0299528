# Cached Python venvs for the test tiers, outside the clone and keyed by what they hold.
# Source it, then: cached_venv NAME 'python check' PIP_ARGS... ; prints the venv's python.
# The venv is (re)built when it is missing or the check fails; pip's output goes to stderr.

venv_root() { echo "${PD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator}/tools"; }

# cached_venv NAME CHECK [PIP_ARGS...]... with PIP_ARGS groups separated by `--` (one pip run each).
cached_venv() {
  local name=$1 check=$2; shift 2
  local python=${PYTHON:-python3.11}
  command -v "$python" >/dev/null || python=python3
  local venv; venv="$(venv_root)/$name"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv" >&2
    local group=()
    for arg in "$@" --; do
      if [ "$arg" = -- ]; then
        [ ${#group[@]} -eq 0 ] || "$venv/bin/pip" install --quiet --disable-pip-version-check "${group[@]}" >&2
        group=()
      else
        group+=("$arg")
      fi
    done
    "$venv/bin/python" -c "$check" >&2
  fi
  echo "$venv/bin/python"
}
