#!/usr/bin/env bash
# The engine dry run's shim (src/core/dryrun/shim.py, docs/dry-run.md) on every supported SGLang
# release's PyPI wheel: 0.5.23 in the oracle venv, the others unpacked first on PYTHONPATH
# (hack/sglang-release.sh), each on processes SGLang accepts and ones it refuses
# (tests/parity/dry_run_shim.py). hack/parity.sh runs it first; DRY_RUN_RELEASES picks releases.
set -euo pipefail
cd "$(dirname "$0")/.."
REFERENCE=0.5.23
python=$(hack/sglang-oracle-venv.sh | tail -n1)
failed=()
for release in ${DRY_RUN_RELEASES:-0.5.19 0.5.20 0.5.21 0.5.22 0.5.23}; do
  args=(--python "$python" --expect-version "$release")
  [ "$release" = "$REFERENCE" ] || args+=(--release-dir "$(hack/sglang-release.sh "$release")")
  "$python" tests/parity/dry_run_shim.py "${args[@]}" || failed+=("$release")
done
[ ${#failed[@]} -eq 0 ] || { echo "[dry-run shim] failed on SGLang ${failed[*]} (above)" >&2; exit 1; }
