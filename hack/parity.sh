#!/usr/bin/env bash
# Engine parity (docs/parity.md): `pd-operator validate` against SGLang 0.5.23's own start-up
# resolution on the examples, the specs the rule tests validate, and fixed-seed generated specs.
#   hack/parity.sh            the full run (5,000 generated specs), what `make parity` runs
#   hack/parity.sh --sample   examples + rule-test specs + a 300-spec sample, for CI
# Env: PARITY_GENERATED=N and PARITY_SEED=S override the generated corpus; PARITY_JOBS=N oracle
# workers per accelerator profile (default 2); PARITY_JSON=path keeps the per-case report.
# The full run keeps SGLang's results in PARITY_ORACLE_CACHE (default under ~/.cache/pd-operator),
# keyed by the oracle's code, its venv and each process's inputs, so a rerun sends only cases
# whose argv changed to SGLang; PARITY_ORACLE_CACHE= (empty) runs every case. --sample never
# reads it: CI runs SGLang on every case of its sample.
set -euo pipefail
cd "$(dirname "$0")/.."
generated=${PARITY_GENERATED:-5000}
cache=${PARITY_ORACLE_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/parity-oracle.jsonl}
[ "${1:-}" = "--sample" ] && generated=${PARITY_GENERATED:-300} && cache=""
seed=${PARITY_SEED:-15}
python=$(hack/sglang-oracle-venv.sh | tail -n1)
target=${CARGO_TARGET_DIR:-target}
cargo build --quiet --locked --bin pd-operator
work="$(realpath -m "$target/parity")"
rm -rf "$work" && mkdir -p "$work/rules"
# The rule tests write every spec they validate when PD_PARITY_DUMP names a directory.
PD_PARITY_DUMP="$work/rules" cargo test --quiet --locked --test rules >/dev/null
"$python" tests/parity/parity.py --operator "$target/debug/pd-operator" --python "$python" \
  --examples examples/*.yaml --rules-dir "$work/rules" --layouts --generated "$generated" --seed "$seed" \
  --workdir "$work" --jobs "${PARITY_JOBS:-2}" ${PARITY_JSON:+--json "$PARITY_JSON"} ${cache:+--oracle-cache "$cache"}
