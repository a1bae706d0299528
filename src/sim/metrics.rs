//! `/metrics` under SGLang 0.5.23's metric names and buckets (`sglang:*`, labelled with
//! `model_name` and `engine_type`), plus the stand-in's own KV transfer counters per rank pair
//! (`pd_sim_*`), which tests compare with the rank map.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

/// SGLang's default buckets (`metrics_collector.py`).
const TTFT_BUCKETS: [f64; 18] = [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0];
const ITL_BUCKETS: [f64; 23] = [
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000,
    2.000, 4.000, 6.000, 8.000,
];
const E2E_BUCKETS: [f64; 22] =
    [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0];
const KV_SPEED_BUCKETS: [f64; 10] = [0.1, 0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0];
const KV_LATENCY_MS_BUCKETS: [f64; 12] = [1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Streaming {
    pub is_streaming: String,
}

/// One decode rank / prefill row pair.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PairLabels {
    pub decode_engine_rank: String,
    pub decode_pp_rank: String,
    pub prefill_dp_rank: String,
    pub prefill_cp_rank: String,
    pub prefill_tp_rank: String,
    pub prefill_pp_rank: String,
}

type Hist = Family<Streaming, Histogram, fn() -> Histogram>;

fn ttft() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}
fn e2e() -> Histogram {
    Histogram::new(E2E_BUCKETS)
}

pub struct SimMetrics {
    registry: Registry,
    pub running: Gauge,
    pub queued: Gauge,
    pub gen_throughput: Gauge<f64, AtomicU64>,
    pub token_usage: Gauge<f64, AtomicU64>,
    pub ttft: Hist,
    pub e2e: Hist,
    pub itl: Histogram,
    pub prompt_tokens: Family<Streaming, Counter>,
    pub generation_tokens: Family<Streaming, Counter>,
    pub requests: Family<Streaming, Counter>,
    pub aborted: Counter,
    pub bootstrap_failed: Counter,
    pub transfer_failed: Counter,
    pub kv_speed: Histogram,
    pub kv_latency_ms: Histogram,
    pair_bytes: Family<PairLabels, Counter>,
    pair_pulls: Family<PairLabels, Counter>,
    /// The same counters for `/get_server_info`, ordered.
    pairs: Mutex<BTreeMap<PairLabels, (u64, u64)>>,
    /// Requests whose KV came from each prefill bootstrap address (`host:port`).
    sources: Mutex<BTreeMap<String, u64>>,
    /// Generated tokens, for `gen_throughput`.
    pub generated: AtomicU64,
}

impl SimMetrics {
    pub fn new(model_name: &str, engine_type: &str) -> Self {
        let labels = [("model_name".into(), model_name.to_owned().into()), ("engine_type".into(), engine_type.to_owned().into())];
        let mut registry = Registry::with_labels(labels.into_iter());
        let m = Self {
            running: Gauge::default(),
            queued: Gauge::default(),
            gen_throughput: Gauge::default(),
            token_usage: Gauge::default(),
            ttft: Family::new_with_constructor(ttft as fn() -> Histogram),
            e2e: Family::new_with_constructor(e2e as fn() -> Histogram),
            itl: Histogram::new(ITL_BUCKETS),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            requests: Family::default(),
            aborted: Counter::default(),
            bootstrap_failed: Counter::default(),
            transfer_failed: Counter::default(),
            kv_speed: Histogram::new(KV_SPEED_BUCKETS),
            kv_latency_ms: Histogram::new(KV_LATENCY_MS_BUCKETS),
            pair_bytes: Family::default(),
            pair_pulls: Family::default(),
            pairs: Mutex::new(BTreeMap::new()),
            sources: Mutex::new(BTreeMap::new()),
            generated: AtomicU64::new(0),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("sglang:num_running_reqs", "The number of running requests.", m.running.clone());
        r.register("sglang:num_queue_reqs", "The number of requests in the waiting queue.", m.queued.clone());
        r.register("sglang:gen_throughput", "The generation throughput (token/s).", m.gen_throughput.clone());
        r.register("sglang:token_usage", "The token usage.", m.token_usage.clone());
        r.register("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft.clone());
        r.register("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m.itl.clone());
        r.register("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", m.e2e.clone());
        r.register("sglang:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens.clone());
        r.register("sglang:generation_tokens", "Number of generation tokens processed.", m.generation_tokens.clone());
        r.register("sglang:num_requests", "Number of requests processed.", m.requests.clone());
        r.register("sglang:num_aborted_requests", "Number of requests aborted.", m.aborted.clone());
        r.register("sglang:num_bootstrap_failed_reqs", "Number of bootstrap failed requests.", m.bootstrap_failed.clone());
        r.register("sglang:num_transfer_failed_reqs", "Number of transfer failed requests.", m.transfer_failed.clone());
        r.register("sglang:kv_transfer_speed_gb_s", "The transfer speed of the KV cache in GB/s.", m.kv_speed.clone());
        r.register("sglang:kv_transfer_latency_ms", "The transfer latency of the KV cache in ms.", m.kv_latency_ms.clone());
        r.register("pd_sim_kv_pulled_bytes", "KV bytes a decode rank pulled from a prefill row (stand-in).", m.pair_bytes.clone());
        r.register("pd_sim_kv_pulls", "KV pulls a decode rank made from a prefill row (stand-in).", m.pair_pulls.clone());
        Self { registry, ..m }
    }

    pub fn streaming(stream: bool) -> Streaming {
        Streaming { is_streaming: stream.to_string() }
    }

    /// One verified pull of `bytes` from a prefill row by a decode rank.
    pub fn record_pull(&self, pair: PairLabels, bytes: u64) {
        self.pair_bytes.get_or_create(&pair).inc_by(bytes);
        self.pair_pulls.get_or_create(&pair).inc();
        let mut pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        let e = pairs.entry(pair).or_default();
        e.0 += 1;
        e.1 += bytes;
    }

    /// One request's KV received whole from the prefill at `addr`.
    pub fn record_source(&self, addr: &str) {
        *self.sources.lock().unwrap_or_else(|p| p.into_inner()).entry(addr.to_owned()).or_default() += 1;
    }

    /// Requests per prefill bootstrap address, as a JSON object.
    pub fn sources_json(&self) -> Value {
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        Value::Object(sources.iter().map(|(addr, n)| (addr.clone(), Value::from(*n))).collect())
    }

    /// The per-pair counters as JSON rows.
    pub fn pairs_json(&self) -> Value {
        let pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        let num = |s: &str| s.parse::<i64>().map(Value::from).unwrap_or(Value::Null);
        Value::Array(
            pairs
                .iter()
                .map(|(k, (n, b))| {
                    json!({"decode_engine_rank": num(&k.decode_engine_rank), "decode_pp_rank": num(&k.decode_pp_rank),
                    "prefill_dp_rank": num(&k.prefill_dp_rank), "prefill_cp_rank": num(&k.prefill_cp_rank),
                    "prefill_tp_rank": num(&k.prefill_tp_rank), "prefill_pp_rank": num(&k.prefill_pp_rank),
                    "pulls": n, "bytes": b})
                })
                .collect(),
        )
    }

    /// Turns the generated-token count into `gen_throughput` over the last `secs`.
    pub fn tick(&self, last: &mut u64, secs: f64) {
        let now = self.generated.load(Ordering::Relaxed);
        self.gen_throughput.set((now - *last) as f64 / secs.max(1e-9));
        *last = now;
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_sglang_names() {
        let m = SimMetrics::new("m", "decode");
        m.ttft.get_or_create(&SimMetrics::streaming(true)).observe(0.3);
        m.requests.get_or_create(&SimMetrics::streaming(false)).inc();
        let text = m.encode();
        for name in [
            "sglang:num_running_reqs{",
            "sglang:num_queue_reqs{",
            "sglang:gen_throughput{",
            "sglang:token_usage{",
            "sglang:time_to_first_token_seconds_bucket{",
            "sglang:inter_token_latency_seconds_bucket{",
            "sglang:num_requests_total{",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        assert!(text.contains("engine_type=\"decode\""));
    }
}
