#!/usr/bin/env bash
# Engine parity (docs/parity.md): `pd-operator validate` against each supported SGLang release's
# own start-up resolution on the examples, the specs the rule tests validate, and fixed-seed
# generated specs. 0.5.23 runs in the oracle venv; 0.5.21 and 0.5.22 run the same venv with their
# own unpacked wheel first on PYTHONPATH (hack/sglang-release.sh), and the operator judges and
# renders every spec that names no release as that release (`parity-cases --engine-version`).
#   hack/parity.sh            the full run (5,000 generated specs per release), `make parity`
#   hack/parity.sh --sample   examples + rule-test specs + a fixed-seed sample per release, for CI
# Both first run the engine dry run's shim on 0.5.19-0.5.23 (hack/dry-run-shim.sh).
# Env: PARITY_RELEASES="0.5.21 0.5.22 0.5.23" picks releases; PARITY_GENERATED=N and
# PARITY_SEED=S override the generated corpus; PARITY_GENERATED_STATE=N the generated specs of
# hybrid-state models (default 1000, --sample 40 on the reference and 20 on older releases); PARITY_TABLE_ARGS=N the number of specs whose
# extraArgs are drawn from each release's option table (default 1000, --sample 60; a false
# admission there that tests/parity/startup-gaps.txt lists is a known gap, not a failure);
# PARITY_JOBS=N oracle workers per accelerator profile (default 2); PARITY_JSON=prefix keeps the
# per-case report (prefix-<release>.json).
# The full run keeps SGLang's results in PARITY_ORACLE_CACHE (default under ~/.cache/pd-operator),
# keyed by the oracle's code, its venv, the release's code and each process's inputs, so a rerun
# sends only cases whose argv changed to SGLang; PARITY_ORACLE_CACHE= (empty) runs every case.
# --sample uses it too (CI): a case whose inputs are unchanged since an earlier run is judged by
# SGLang's answer from that run; every new or changed case goes to SGLang.
set -euo pipefail
cd "$(dirname "$0")/.."
REFERENCE=0.5.23
releases=${PARITY_RELEASES:-0.5.21 0.5.22 0.5.23}
generated=${PARITY_GENERATED:-5000}
table_args=${PARITY_TABLE_ARGS:-1000}
cache=${PARITY_ORACLE_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/parity-oracle.jsonl}
sample=false
[ "${1:-}" = "--sample" ] && sample=true && table_args=${PARITY_TABLE_ARGS:-60}
seed=${PARITY_SEED:-15}
python=$(hack/sglang-oracle-venv.sh | tail -n1)
# The dry run's shim is the oracle's code: first, on every supported release's wheel.
hack/dry-run-shim.sh
target=${CARGO_TARGET_DIR:-target}
cargo build --quiet --locked -p pd-testing --bin parity-cases
work="$(realpath -m "$target/parity")"
rm -rf "$work" && mkdir -p "$work/rules"
# The rule tests write every spec they validate when PD_PARITY_DUMP names a directory.
PD_PARITY_DUMP="$work/rules" cargo test --quiet --locked -p pd-core --test rules >/dev/null
failed=()
for release in $releases; do
  n=$generated
  state=${PARITY_GENERATED_STATE:-1000}
  args=(--release "$release")
  if [ "$release" = "$REFERENCE" ]; then
    # The DeepSeek-V4 KV layout corpus: the layout is in the handshake from 0.5.23 on.
    args+=(--layouts)
    $sample && n=${PARITY_GENERATED:-300} && state=${PARITY_GENERATED_STATE:-40}
  else
    args+=(--release-dir "$(hack/sglang-release.sh "$release")")
    # The older releases' sample is smaller: the reference carries the layout corpus and most rules.
    $sample && n=${PARITY_GENERATED:-120} && state=${PARITY_GENERATED_STATE:-20}
  fi
  echo "[parity] SGLang $release: examples, rule specs, $n generated specs, $state of hybrid-state models, $table_args option-table specs" >&2
  "$python" tests/parity/parity.py --parity-cases "$target/debug/parity-cases" --python "$python" "${args[@]}" \
    --examples examples/*.yaml --rules-dir "$work/rules" --generated "$n" --generated-state "$state" --table-args "$table_args" --seed "$seed" \
    --workdir "$work/$release" --jobs "${PARITY_JOBS:-2}" ${PARITY_JSON:+--json "$PARITY_JSON-$release.json"} \
    ${cache:+--oracle-cache "$cache"} || failed+=("$release")
done
[ ${#failed[@]} -eq 0 ] || { echo "[parity] disagreements with SGLang ${failed[*]} (above)" >&2; exit 1; }
