#!/usr/bin/env bash
# Serving benchmark on loopback, no cluster: smg 1.13.0 (PD mode) -> sim prefill -> KV transfer ->
# sim decode, against the timing model's ideal and against the client playing the gateway.
#   hack/bench-serving.sh                      # all three parts
#   PD_BENCH_PARTS=latency hack/bench-serving.sh
# Knobs: PD_BENCH_LEVELS (1 8 64 256), PD_BENCH_ITL_MS (20), PD_BENCH_PREFILL_TPS (20000),
# PD_BENCH_PROMPT_BYTES (4096, about 1 k tokens), PD_BENCH_MAX_TOKENS (32), PD_BENCH_ROUNDS (4:
# requests per level = rounds x concurrency, at least 64), PD_BENCH_KV (the latency part's model
# KV geometry: "--sim-num-layers 16 --sim-head-dim 64", Llama-3.2-1B-like, 32 KiB a token; the
# sim's default is Llama-3-8B-like, 128 KiB a token). Prints markdown tables on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release --locked --quiet -p pd-sim
BIN="$CARGO_TARGET_DIR/release/pd-sim"
PARTS=${PD_BENCH_PARTS:-latency transfer throughput}
LEVELS=${PD_BENCH_LEVELS:-1 8 64 256}
ITL_MS=${PD_BENCH_ITL_MS:-20}
TPS=${PD_BENCH_PREFILL_TPS:-20000}
PROMPT=${PD_BENCH_PROMPT_BYTES:-4096}
TOKENS=${PD_BENCH_MAX_TOKENS:-32}
ROUNDS=${PD_BENCH_ROUNDS:-4}
read -r -a KV <<<"${PD_BENCH_KV:---sim-num-layers 16 --sim-head-dim 64}"
WORK=$(mktemp -d /tmp/pd-bench-serving.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# shellcheck source=lib/wait.sh
. "$ROOT/hack/lib/wait.sh"
gateway_serves() { [ "$(field "$(bench --target "127.0.0.1:$1" --concurrency 1 --requests 1 --max-tokens 2)" failed)" = 0 ]; }
wait_http() {
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$1$2" >/dev/null && return 0; sleep 0.25; done
  echo "nothing answers on port $1$2; logs in $WORK" >&2; return 1
}
# start NAME CPUS CMD...: a background process pinned to CPUS ("" for any), logged under $WORK.
start() {
  local name=$1 cpus=$2; shift 2
  if [ -n "$cpus" ]; then taskset -c "$cpus" "$@" >"$WORK/$name.log" 2>&1 & else "$@" >"$WORK/$name.log" 2>&1 & fi
  PIDS+=($!)
}
stop_all() { cleanup; PIDS=(); }

# pair NAME_SUFFIX CPUS TP TIMING...: a prefill and a decode; sets PH (prefill http), BP
# (bootstrap), DH (decode http).
pair() {
  local cpus=$1 ptp=$2 dtp=$3; shift 3
  PH=$(free_port); BP=$(free_port); DH=$(free_port)
  local common=(--model-path sim-model --host 127.0.0.1 --max-running-requests 1024 "$@")
  start prefill "$cpus" "$BIN" prefill --tp-size "$ptp" --port "$PH" --disaggregation-bootstrap-port "$BP" "${common[@]}"
  start decode "$cpus" "$BIN" decode --tp-size "$dtp" --port "$DH" "${common[@]}"
  wait_http "$PH" /health; wait_http "$DH" /health
}

bench() { "$BIN" bench --model sim-model "$@"; }

# The timing model's ideal for a closed loop of C clients: one prefill lane (FIFO, p seconds a
# prompt), first token when the prompt is done, then T-1 tokens ITL apart.
ideal() {
  python3 - "$@" <<'EOF'
import heapq, json, math, sys
c, n, prompt, tokens, tps, itl_ms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
ptok = math.ceil((prompt + 16) / 4)  # the stand-in's tokenizer: chat content + 16 bytes of template, 4 bytes a token
p = ptok / tps if tps > 0 else 0.0
tail = (tokens - 1) * itl_ms / 1e3
ready = [0.0] * c
lane, ttft, end = 0.0, [], 0.0
for _ in range(n):
    t = heapq.heappop(ready)
    done = max(t, lane) + p
    lane = done
    ttft.append(done - t)
    end = max(end, done + tail)
    heapq.heappush(ready, done + tail)
ttft.sort()
pick = lambda q: ttft[min(len(ttft) - 1, len(ttft) * q // 100)] * 1e3
print(json.dumps({"requests_per_s": round(n / end, 1), "ttft_ms_p50": round(pick(50), 2), "ttft_ms_p99": round(pick(99), 2), "itl_ms": itl_ms}))
EOF
}

field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

latency() {
  local py; py=$(hack/smg-venv.sh | tail -n 1)
  pair "" 2 2 --sim-itl-ms "$ITL_MS" --sim-prefill-tokens-per-s "$TPS" "${KV[@]}"
  local gw gm; gw=$(free_port); gm=$(free_port)
  start smg "" "$py" -m smg.launch_router --pd-disaggregation --prefill "http://127.0.0.1:$PH" "$BP" \
    --decode "http://127.0.0.1:$DH" --host 127.0.0.1 --port "$gw" --prometheus-port "$gm" --log-level warn
  wait_http "$gw" /readiness
  # The gateway activates its workers before it serves.
  wait_for "smg to serve a request (logs in $WORK)" 60 gateway_serves "$gw"
  echo "### Latency: prefill ${TPS} tokens/s, ITL ${ITL_MS} ms, prompt ${PROMPT} bytes, ${TOKENS} output tokens, streamed, KV flags: ${KV[*]}"
  echo
  echo "| concurrency | path | requests | failed | req/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p99 (ms) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for c in $LEVELS; do
    local n=$(( c * ROUNDS < 64 ? 64 : c * ROUNDS ))
    local i; i=$(ideal "$c" "$n" "$PROMPT" "$TOKENS" "$TPS" "$ITL_MS")
    echo "| $c | timing model (ideal) | $n | 0 | $(field "$i" requests_per_s) | $(field "$i" ttft_ms_p50) | $(field "$i" ttft_ms_p99) | $ITL_MS | $ITL_MS |"
    for path in gateway direct; do
      local r
      if [ "$path" = gateway ]; then
        r=$(bench --target "127.0.0.1:$gw" --concurrency "$c" --requests "$n" --max-tokens "$TOKENS" --prompt-bytes "$PROMPT" --stream)
      else
        r=$(bench --target "127.0.0.1:$DH" --prefill "127.0.0.1:$PH" --bootstrap "127.0.0.1:$BP" --concurrency "$c" --requests "$n" \
          --max-tokens "$TOKENS" --prompt-bytes "$PROMPT" --stream)
      fi
      echo "| $c | $path | $(field "$r" requests) | $(field "$r" failed) | $(field "$r" requests_per_s) | $(field "$r" ttft_ms_p50) | $(field "$r" ttft_ms_p99) | $(field "$r" itl_ms_p50) | $(field "$r" itl_ms_p99) |"
    done
  done
  echo
  stop_all
}

# KV transfer speed per rank pair: 1 GiB-class pulls (8 k tokens x 128 KiB) with zero timing.
transfer() {
  echo "### KV transfer on loopback (GQA 32 layers x 8 KV heads x 128 x bf16 = 128 KiB a token)"
  echo
  echo "| prefill TP -> decode TP | rank pairs | prompt tokens | bytes a pair a request | GB/s a request (all pairs) | GB/s a pair |"
  echo "|---|---|---|---|---|---|"
  for tp in 1 2 4; do
    pair "" "$tp" "$tp" --sim-itl-ms 0 --sim-prefill-tokens-per-s 0
    bench --target "127.0.0.1:$DH" --prefill "127.0.0.1:$PH" --bootstrap "127.0.0.1:$BP" --concurrency 1 --requests 8 \
      --max-tokens 1 --prompt-bytes 32768 >/dev/null
    local m; m=$(curl -s "http://127.0.0.1:$DH/metrics")
    python3 - "$tp" "$m" <<'EOF'
import sys
tp, text = int(sys.argv[1]), sys.argv[2]
val = lambda name: sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name))
speed = val("sglang:kv_transfer_speed_gb_s_sum") / val("sglang:kv_transfer_speed_gb_s_count")
tokens = -(-(32768 + 16) // 4)
print(f"| {tp} -> {tp} | {tp} | {tokens} | {tokens * 131072 // tp} | {speed:.2f} | {speed / tp:.2f} |")
EOF
    stop_all
  done
  echo
}

# Requests per second with the timing model at zero: the engines on CPU 0, the client on CPU 1.
throughput() {
  echo "### Zero timing: engines pinned to one core (CPU 0), client on CPU 1; 64-byte prompts, 4 tokens, not streamed"
  echo
  echo "| setup | concurrency | requests | failed | req/s | e2e p50 (ms) | e2e p99 (ms) |"
  echo "|---|---|---|---|---|---|---|"
  local port; port=$(free_port)
  start unified 0 "$BIN" engine --disaggregation-mode null --model-path sim-model --host 127.0.0.1 --port "$port" \
    --sim-itl-ms 0 --sim-prefill-tokens-per-s 0 --max-running-requests 1024
  wait_http "$port" /health
  for c in 16 64; do
    local r; r=$(taskset -c 1 "$BIN" bench --model sim-model --target "127.0.0.1:$port" --concurrency "$c" --requests 40000 --max-tokens 4)
    echo "| unified engine | $c | $(field "$r" requests) | $(field "$r" failed) | $(field "$r" requests_per_s) | $(field "$r" e2e_ms_p50) | $(field "$r" e2e_ms_p99) |"
  done
  stop_all
  # The sim's default KV (128 KiB a token: 2.6 MB a 20-token request), then a 1-layer, 1-head
  # model (256 B a token) that leaves the protocol's own cost.
  for kv in "" "--sim-num-layers 1 --sim-num-kv-heads 1 --sim-head-dim 64"; do
    read -r -a kvf <<<"$kv"
    pair 0 1 1 --sim-itl-ms 0 --sim-prefill-tokens-per-s 0 "${kvf[@]}"
    for c in 16 64; do
      local r; r=$(taskset -c 1 "$BIN" bench --model sim-model --target "127.0.0.1:$DH" --prefill "127.0.0.1:$PH" --bootstrap "127.0.0.1:$BP" \
        --concurrency "$c" --requests 20000 --max-tokens 4)
      echo "| prefill + decode (TP1, KV pulled${kv:+, $kv}), both on CPU 0 | $c | $(field "$r" requests) | $(field "$r" failed) | $(field "$r" requests_per_s) | $(field "$r" e2e_ms_p50) | $(field "$r" e2e_ms_p99) |"
    done
    stop_all
  done
  echo
}

for part in $PARTS; do "$part"; done
echo "logs: $WORK" >&2
