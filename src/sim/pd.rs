//! The decode's side of a PD request, as SGLang 0.5.23 runs it: resolve the prefill through its
//! bootstrap server (the handshake of `pd_runtime::probe`, cached per address), look up the rows the
//! rank map names, and have every decode rank pull its share of the room's KV from exactly those
//! prefill ranks, verifying each checksum.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing::{debug, warn};

use super::kv::{self, KvGeometry, Shape};
use super::metrics::{PairLabels, SimMetrics};
use super::openai::Bootstrap;
use super::rooms;
use super::transfer::{PullSpec, Puller, Row};
use pd_core::handshake::core::{DecodeTopology, PrefillInfo, RankMapping};
use pd_runtime::http_client;
use pd_runtime::probe::{self, Verdict};

/// SGLang's decode: a failed topology fetch is retried 1 s apart; 15 failures abort the request.
const FETCH_ATTEMPTS: u32 = 15;
const FETCH_SPACING: Duration = Duration::from_secs(1);

/// A prefill as the decode resolved it.
struct Resolved {
    info: PrefillInfo,
    ranks: Vec<RankMapping>,
}

pub struct DecodeSide {
    pub topology: DecodeTopology,
    pub geometry: KvGeometry,
    pub shape: Shape,
    pub own_bootstrap_port: u16,
    pub waiting_timeout: Duration,
    resolved: Mutex<HashMap<String, Arc<Resolved>>>,
    endpoints: Mutex<HashMap<(String, Row), String>>,
    fetch: tokio::sync::Mutex<()>,
    puller: Puller,
}

/// What one request moved.
#[derive(Debug, Default)]
pub struct Received {
    pub bytes: u64,
    pub pulls: usize,
}

fn lookup_failed(row: Row) -> String {
    let (dp, cp, tp, pp) = row;
    format!("Could not fetch bootstrap info for: prefill_dp_rank: {dp} prefill_cp_rank: {cp} target_tp_rank: {tp} and target_pp_rank {pp}")
}

impl DecodeSide {
    pub fn new(topology: DecodeTopology, geometry: KvGeometry, own_bootstrap_port: u16, waiting_timeout: Duration) -> Self {
        let shape = Shape { attn_tp: topology.attn_tp_size, attn_cp: topology.attn_cp_size, pp: topology.pp_size, dcp: topology.dcp_size };
        Self {
            topology,
            geometry,
            shape,
            own_bootstrap_port,
            waiting_timeout,
            resolved: Mutex::default(),
            endpoints: Mutex::default(),
            fetch: tokio::sync::Mutex::new(()),
            puller: Puller::default(),
        }
    }

    fn cached(&self, addr: &str) -> Option<Arc<Resolved>> {
        self.resolved.lock().unwrap_or_else(|p| p.into_inner()).get(addr).cloned()
    }

    /// Forgets a prefill after a failed transfer, as SGLang's decode drops its cached bootstrap infos.
    fn invalidate(&self, addr: &str) {
        self.resolved.lock().unwrap_or_else(|p| p.into_inner()).remove(addr);
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner()).retain(|(a, _), ep| {
            let keep = a != addr;
            if !keep {
                self.puller.forget(ep);
            }
            keep
        });
    }

    /// The topology and mapping for `addr`, fetched once and checked with the handshake core.
    async fn resolve(&self, addr: &str) -> Result<Arc<Resolved>, String> {
        if let Some(r) = self.cached(addr) {
            return Ok(r);
        }
        let _one_at_a_time = self.fetch.lock().await;
        for attempt in 1..=FETCH_ATTEMPTS {
            if let Some(r) = self.cached(addr) {
                return Ok(r);
            }
            let answer =
                http_client::send(hyper::Method::GET, addr, probe::TOPOLOGY_QUERY, None, probe::FETCH_TIMEOUT, probe::MAX_BODY).await;
            let outcome = match answer {
                Ok(r) => probe::assess(&self.topology, r.status, &r.body).map_err(|v| *v),
                Err(e) => Err(Verdict::Pending { reason: "PrefillUnreachable".into(), message: e.to_string() }),
            };
            match outcome {
                Ok((_, info, h)) => {
                    let r = Arc::new(Resolved { info, ranks: h.ranks });
                    self.resolved.lock().unwrap_or_else(|p| p.into_inner()).insert(addr.to_owned(), r.clone());
                    return Ok(r);
                }
                Err(v @ Verdict::Failed { .. }) => return Err(v.reason_and_message().1),
                Err(v) => debug!(%addr, attempt, message = %v.reason_and_message().1, "Failed to get prefill server info"),
            }
            if attempt < FETCH_ATTEMPTS {
                tokio::time::sleep(FETCH_SPACING).await;
            }
        }
        Err(format!("Could not fetch prefill parallel info from {addr} after {FETCH_ATTEMPTS} attempts"))
    }

    /// `ip:port` of a prefill row, looked up once per address.
    async fn endpoint(&self, addr: &str, row: Row) -> Result<String, String> {
        let key = (addr.to_owned(), row);
        if let Some(ep) = self.endpoints.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(ep.clone());
        }
        let (dp, cp, tp, pp) = row;
        let path = format!("/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}&target_tp_rank={tp}&target_pp_rank={pp}");
        let answer = http_client::send(hyper::Method::GET, addr, &path, None, probe::FETCH_TIMEOUT, probe::MAX_BODY).await;
        let (ip, port) = match answer {
            Ok(r) if r.status == 200 => probe::parse_row(&r.body).map_err(|_| lookup_failed(row))?,
            _ => return Err(lookup_failed(row)),
        };
        let ep = http_client::host_port(&ip, port);
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner()).insert(key, ep.clone());
        Ok(ep)
    }

    /// Every decode rank's pulls for this request, with resolved endpoints.
    async fn plan(&self, addr: &str, r: &Resolved, b: &Bootstrap, tokens: u64) -> Result<Vec<(RankMapping, PullSpec)>, String> {
        let p = &r.info;
        let dp = b.prefill_dp_rank.unwrap_or(if p.dp_size > 1 { (b.room % p.dp_size as u64) as i64 } else { 0 });
        let pshape = Shape { attn_tp: p.attn_tp_size, attn_cp: p.attn_cp_size, pp: p.pp_size, dcp: 1 };
        let mut out = Vec::new();
        for m in &r.ranks {
            for pull in kv::pulls(&self.geometry, &pshape, &self.shape, m, tokens) {
                let row = (dp, pull.cp, pull.tp, pull.pp);
                let ep = self.endpoint(addr, row).await?;
                let decode_rank = (m.engine_rank as u32) << 16 | m.pp_rank as u32;
                out.push((m.clone(), PullSpec { addr: ep, row, room: b.room, tokens, bytes: pull.bytes, decode_rank }));
            }
        }
        Ok(out)
    }

    /// Receives the room's KV on every decode rank. The error is the request's abort message.
    pub async fn receive(&self, metrics: &SimMetrics, b: &Bootstrap, tokens: u64, rid: &str) -> Result<Received, String> {
        let addr = http_client::host_port(&b.host, b.port.unwrap_or(self.own_bootstrap_port));
        let r = self.resolve(&addr).await.inspect_err(|_| {
            metrics.bootstrap_failed.inc();
        })?;
        let plan = self.plan(&addr, &r, b, tokens).await.inspect_err(|_| {
            metrics.bootstrap_failed.inc();
        })?;
        let start = Instant::now();
        let pulls = join_all(plan.iter().map(|(_, spec)| self.puller.pull(spec)));
        let results = tokio::time::timeout(self.waiting_timeout, pulls).await.map_err(|_| {
            metrics.transfer_failed.inc();
            rooms::timed_out(b.room, start, "WaitingForInput")
        })?;
        let mut received = Received::default();
        for ((m, spec), result) in plan.iter().zip(results) {
            match result {
                Ok(bytes) => {
                    received.bytes += bytes;
                    received.pulls += 1;
                    let (dp, cp, tp, pp) = spec.row;
                    let pair = PairLabels {
                        decode_engine_rank: m.engine_rank.to_string(),
                        decode_pp_rank: m.pp_rank.to_string(),
                        prefill_dp_rank: dp.to_string(),
                        prefill_cp_rank: cp.to_string(),
                        prefill_tp_rank: tp.to_string(),
                        prefill_pp_rank: pp.to_string(),
                    };
                    metrics.record_pull(pair, bytes);
                }
                Err(e) => {
                    warn!(error = %e, %addr, "KV transfer failed");
                    metrics.transfer_failed.inc();
                    self.invalidate(&addr);
                    return Err(format!(
                        "Decode transfer failed for request rank={} decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={} with exception {e}",
                        m.engine_rank, b.room
                    ));
                }
            }
        }
        metrics.record_source(&addr);
        let secs = start.elapsed().as_secs_f64();
        metrics.kv_latency_ms.observe(secs * 1e3);
        if secs > 0.0 && received.bytes > 0 {
            metrics.kv_speed.observe(received.bytes as f64 / secs / 1e9);
        }
        Ok(received)
    }
}
