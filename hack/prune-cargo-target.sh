#!/usr/bin/env bash
# Keeps the shared cargo target directory (outside the clone, `.ci/run`'s CARGO_TARGET_DIR) from
# filling the disk. Cargo names a workspace crate's artifacts by its source path, so every clean
# clone (every CI run) builds this workspace's crates, tests and incremental state anew beside the
# earlier clones' (about 5 GB a run), while the dependencies' artifacts are shared. When the
# filesystem has less than PD_MIN_FREE_GB (default 30: the kind tier's engine image needs about 15
# of it at its peak), this removes the workspace's own artifacts and the incremental state;
# dependencies stay, and the next build rebuilds only this workspace (a few minutes).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
MIN_FREE_GB=${PD_MIN_FREE_GB:-30}
[ -d "$TARGET/debug" ] || exit 0
free_gb() { df -Pk "$TARGET" | awk 'NR == 2 { print int($4 / 1048576) }'; }
before=$(free_gb)
[ "$before" -lt "$MIN_FREE_GB" ] || exit 0
names=$(cd "$ROOT" && cargo metadata --no-deps --format-version 1 --locked \
  | python3 -c 'import json, sys; print(" ".join(sorted({t["name"].replace("-", "_") for p in json.load(sys.stdin)["packages"] for t in p["targets"]})))')
for name in $names; do
  rm -rf "$TARGET"/debug/deps/"$name"-* "$TARGET"/debug/deps/lib"$name"-*
done
rm -rf "$TARGET/debug/incremental"
echo "[prune-cargo-target] $before GB free was under $MIN_FREE_GB: removed this workspace's artifacts and incremental state; $(free_gb) GB free now" >&2
