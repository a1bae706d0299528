#!/usr/bin/env bash
# The engine tier (docs/engine-on-cpu.md): real SGLang 0.5.23 prefill and decode processes on this
# CPU-only host, started with the argv `pd-operator render` writes into their pods plus only the
# CPU switches tests/engine/run.py names, the KV moved by Mooncake over TCP.
#   1. serve: tests/engine/specs/tiny-gqa.yaml; the handshake sidecar as rendered gates the decode
#      against the real prefill and publishes the rank map; smg in front answers a request by token
#      ids (the plain engine's tokens: the KV arrived) and a chat request (a tokenizer of ours).
#      serve-prefill-tp2: the same with tests/engine/specs/tiny-gqa-prefill-tp2.yaml, whose rank map
#      names two prefill ranks (each sends the decode one of the two KV heads).
#   2. seed:  tests/engine/specs/tiny-gqa-dcp2.yaml is refused by `pd-operator validate`; its valid
#      twin (decode tp 2) rendered and started with --dcp-size 2 (admission bypassed): the real decode
#      raises "PD decode DCP requires an MLA or hybrid-MLA KV pool." at the first request where SGLang
#      allows DCP; on a CPU host SGLang 0.5.23 refuses DCP at start-up first, and the step checks that.
#      The sidecar, given the same decode, refuses it with that text against the real prefill.
# In CI after `make chaos` (.ci/run), not in `make test` (minutes of CPU per engine start). Env: PD_OPERATOR_BIN skips the cargo
# build; PD_ENGINE_LOGS keeps the engines' logs there (default: a temp dir, removed on success).
# Prints "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(hack/sglang-engine-venv.sh | tail -n 1)
SMG_PYTHON=$(hack/smg-venv.sh | tail -n 1)
if [ -z "${PD_OPERATOR_BIN:-}" ]; then
  cargo build --quiet --locked --bin pd-operator
  PD_OPERATOR_BIN="$(realpath "${CARGO_TARGET_DIR:-target}")/debug/pd-operator"
fi
export PD_OPERATOR_BIN SMG_PYTHON
model="$PWD/tests/engine/models/tiny-llama"
logs=${PD_ENGINE_LOGS:-$(mktemp -d /tmp/pd-engine.XXXXXX)}
mkdir -p "$logs/serve" "$logs/serve-prefill-tp2" "$logs/seed"
passed=0 failed=0
step() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  if "$@"; then passed=$((passed + 1)); echo "ok   $name ($((SECONDS - t0))s)"
  else failed=$((failed + 1)); echo "FAIL $name ($((SECONDS - t0))s), logs in $logs" >&2; fi
}
render() { "$PD_OPERATOR_BIN" render -f "$1" --model-config "$model/config.json" >"$2"; }
refused() { ! "$PD_OPERATOR_BIN" validate -f tests/engine/specs/tiny-gqa-dcp2.yaml --model-config "$model/config.json"; }

render tests/engine/specs/tiny-gqa.yaml "$logs/serve/rendered.yaml"
render tests/engine/specs/tiny-gqa-prefill-tp2.yaml "$logs/serve-prefill-tp2/rendered.yaml" 2>/dev/null
render tests/engine/specs/tiny-gqa-decode-tp2.yaml "$logs/seed/rendered.yaml" 2>/dev/null
step serve "$python" tests/engine/run.py serve "$logs/serve/rendered.yaml" "$model" "$python" "$logs/serve"
step serve-prefill-tp2 "$python" tests/engine/run.py serve "$logs/serve-prefill-tp2/rendered.yaml" "$model" "$python" "$logs/serve-prefill-tp2"
step seed-refused-by-validate refused
step seed-started-directly "$python" tests/engine/run.py seed "$logs/seed/rendered.yaml" "$model" "$python" "$logs/seed"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ -z "${PD_ENGINE_LOGS:-}" ] && rm -rf "$logs"
[ "$failed" -eq 0 ]
