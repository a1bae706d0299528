//! One handshake round against one prefill's bootstrap server, as a decode would run it, plus the
//! preflight no decode does: every prefill rank the decode will read is looked up and dialled.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::http_client::{self, HttpError, HttpResponse};
use pd_core::handshake::core::{self, DecodeTopology, HandshakeFailure, PrefillInfo, RankMapping};
use pd_core::handshake::pyvalue;

/// SGLang's decode uses a 5 s timeout for the topology fetch.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The most characters of a bootstrap server's own text a verdict carries (into the pod's
/// condition and the PDDeployment's status): SGLang's texts ("Prefill server not fully
/// registered yet (1 workers registered).") fit whole; anything longer is cut by
/// `pd_core::remote`, as every remote text is.
const BOOTSTRAP_TEXT: usize = 160;
/// Largest bootstrap answer read; a real topology body is well under 4 KiB.
pub const MAX_BODY: usize = 256 << 10;
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);
const LOOKUP_CONCURRENCY: usize = 16;
pub const TOPOLOGY_QUERY: &str = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";

/// Outcome of one round against one prefill.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Verdict {
    /// The handshake passed and every needed rank answered.
    Passed {
        info: Value,
        ranks: Vec<RankMapping>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
    },
    /// A real decode would fail the same way: a check raised, or the prefill cannot serve it.
    Failed {
        kind: String,
        reason: String,
        error: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        info: Option<Value>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        unreachable_ranks: Vec<String>,
    },
    /// Not decided yet: the prefill is starting, registering or unreachable.
    Pending { reason: String, message: String },
}

impl Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Passed { .. })
    }
    fn failed(kind: &str, reason: &str, error: String, info: Option<Value>) -> Self {
        Verdict::Failed { kind: kind.into(), reason: reason.into(), error, info, unreachable_ranks: Vec::new() }
    }
    fn pending(reason: &str, message: String) -> Self {
        Verdict::Pending { reason: reason.into(), message }
    }
    fn from_failure(f: HandshakeFailure, info: &Value) -> Self {
        Verdict::failed(f.kind, f.reason(), f.error, Some(info.clone()))
    }
    /// Condition reason and message for this prefill.
    pub fn reason_and_message(&self) -> (String, String) {
        match self {
            Verdict::Passed { warnings, .. } if warnings.is_empty() => ("HandshakePassed".into(), "handshake passed".into()),
            Verdict::Passed { warnings, .. } => {
                ("HandshakePassed".into(), format!("handshake passed; SGLang warns: {}", warnings.join(" ")))
            }
            Verdict::Failed { kind, reason, error, .. } => (reason.clone(), format!("{kind}: {error}")),
            Verdict::Pending { reason, message } => (reason.clone(), message.clone()),
        }
    }
}

fn transport_pending(e: &HttpError) -> Verdict {
    match e {
        HttpError::TooLarge { .. } => {
            Verdict::failed("InputError", "IncompatibleTopologyBody", format!("topology body incompatible with SGLang 0.5.23: {e}"), None)
        }
        _ => Verdict::pending("PrefillUnreachable", e.to_string()),
    }
}

/// Steps 1–4 on a fetched topology answer: status, strict parse, checks, mapping, receiver rules.
pub fn assess(d: &DecodeTopology, status: u16, body: &[u8]) -> Result<(Value, PrefillInfo, core::Handshake), Box<Verdict>> {
    let text = pd_core::remote::excerpt_within(&String::from_utf8_lossy(body), BOOTSTRAP_TEXT);
    match status {
        200 => {}
        503 => return Err(Box::new(Verdict::pending("Registering", text))),
        s => return Err(Box::new(Verdict::pending("BootstrapError", format!("bootstrap server answered {s}: {text}")))),
    }
    let incompatible = |why: String| {
        Box::new(Verdict::failed(
            "InputError",
            "IncompatibleTopologyBody",
            format!("topology body incompatible with SGLang {} (a real decode retries and then aborts its requests): {why}", d.release),
            None,
        ))
    };
    let info: Value = serde_json::from_slice(body).map_err(|e| incompatible(format!("not JSON: {e}")))?;
    let p = PrefillInfo::from_release_body(d.release, &info).map_err(incompatible)?;
    let h = core::handshake(d, &p).map_err(|f| Box::new(Verdict::from_failure(f, &info)))?;
    core::receiver_checks(d, &p).map_err(|f| Box::new(Verdict::from_failure(f, &info)))?;
    Ok((info, p, h))
}

/// A concrete row the decode will look up: (prefill dp rank, cp rank, tp rank, pp rank).
pub type Row = (i64, i64, i64, i64);

/// Every distinct row any decode rank needs, for every prefill DP rank.
pub fn needed_rows(p: &PrefillInfo, ranks: &[RankMapping]) -> Vec<Row> {
    let mut rows = BTreeSet::new();
    for dp in 0..p.dp_size.max(0) {
        for r in ranks {
            for &cp in &r.target_cp_ranks {
                for &tp in &r.target_tp_ranks {
                    for &pp in r.target_pp_ranks.iter().rev() {
                        rows.insert((dp, cp, tp, pp));
                    }
                }
            }
        }
    }
    rows.into_iter().collect()
}

/// `PrefillRankInfo(**data)`: exactly `rank_ip` and `rank_port`, coerced with `str()`/`int()`.
pub fn parse_row(body: &[u8]) -> Result<(String, u16), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or_else(|| format!("expected an object, got {}", pyvalue::type_name(&v)))?;
    if let Some(k) = obj.keys().find(|k| *k != "rank_ip" && *k != "rank_port") {
        return Err(format!("TypeError: PrefillRankInfo.__init__() got an unexpected keyword argument '{k}'"));
    }
    let ip = obj.get("rank_ip").ok_or("TypeError: PrefillRankInfo.__init__() missing 1 required positional argument: 'rank_ip'")?;
    let port = obj.get("rank_port").ok_or("TypeError: PrefillRankInfo.__init__() missing 1 required positional argument: 'rank_port'")?;
    let port = pyvalue::int(port)?;
    let port = u16::try_from(port).map_err(|_| format!("rank_port {port} is not a TCP port"))?;
    Ok((pyvalue::str(ip), port))
}

fn lookup_path(row: Row) -> String {
    let (dp, cp, tp, pp) = row;
    format!("/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}&target_tp_rank={tp}&target_pp_rank={pp}")
}

fn receiver_text(row: Row) -> String {
    let (dp, cp, tp, pp) = row;
    format!("Could not fetch bootstrap info for: prefill_dp_rank: {dp} prefill_cp_rank: {cp} target_tp_rank: {tp} and target_pp_rank {pp}")
}

/// A bootstrap server's answer as a verdict may carry it.
fn bootstrap_text(r: &HttpResponse) -> String {
    pd_core::remote::excerpt_within(&r.text(), BOOTSTRAP_TEXT)
}

async fn get(addr: &str, path: &str) -> Result<HttpResponse, HttpError> {
    http_client::send(hyper::Method::GET, addr, path, None, FETCH_TIMEOUT, MAX_BODY).await
}

async fn dial(ip: &str, port: u16) -> Result<(), String> {
    let target = http_client::host_port(ip, port);
    match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(&target)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{target}: {e}")),
        Err(_) => Err(format!("{target}: no answer within {DIAL_TIMEOUT:?}")),
    }
}

/// A full round against the bootstrap server at `addr` (`host:port`).
pub async fn probe(addr: &str, d: &DecodeTopology) -> Verdict {
    let response = match get(addr, TOPOLOGY_QUERY).await {
        Ok(r) => r,
        Err(e) => return transport_pending(&e),
    };
    let (info, p, h) = match assess(d, response.status, &response.body) {
        Ok(x) => x,
        Err(v) => return *v,
    };
    let rows = needed_rows(&p, &h.ranks);
    let lookups: Vec<(Row, Result<HttpResponse, HttpError>)> = futures::stream::iter(rows)
        .map(|row| async move { (row, get(addr, &lookup_path(row)).await) })
        .buffered(LOOKUP_CONCURRENCY)
        .collect()
        .await;
    let mut endpoints = Vec::with_capacity(lookups.len());
    for (row, answer) in lookups {
        match answer {
            Ok(r) if r.status == 200 => match parse_row(&r.body) {
                Ok(ep) => endpoints.push((row, ep)),
                Err(why) => {
                    return Verdict::failed(
                        "InputError",
                        "IncompatibleRankBody",
                        format!("{}: rank body incompatible with SGLang 0.5.23: {why}", receiver_text(row)),
                        Some(info),
                    );
                }
            },
            Ok(r) if r.status == 503 => return Verdict::pending("Registering", bootstrap_text(&r)),
            Ok(r) => {
                return Verdict::failed(
                    "RuntimeError",
                    "PrefillRankMissing",
                    format!("{} (bootstrap server answered {}: {})", receiver_text(row), r.status, bootstrap_text(&r)),
                    Some(info),
                );
            }
            Err(e) => return transport_pending(&e),
        }
    }
    let dials = futures::stream::iter(endpoints)
        .map(|(row, (ip, port))| async move { (row, dial(&ip, port).await) })
        .buffered(LOOKUP_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let unreachable: Vec<String> =
        dials.into_iter().filter_map(|((dp, cp, tp, pp), r)| r.err().map(|e| format!("dp{dp}/cp{cp}/tp{tp}/pp{pp} {e}"))).collect();
    if !unreachable.is_empty() {
        return Verdict::Failed {
            kind: "ConnectionError".into(),
            reason: "PrefillRankUnreachable".into(),
            error: format!(
                "{} prefill rank(s) registered an address that refuses TCP connections: {}",
                unreachable.len(),
                unreachable.join("; ")
            ),
            info: Some(info),
            unreachable_ranks: unreachable,
        };
    }
    Verdict::Passed { info, ranks: h.ranks, warnings: h.warnings }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(page: i64) -> DecodeTopology {
        DecodeTopology::parse(&json!({"attn_tp_size": 2, "page_size": page, "kv_cache_dtype": "auto", "kv_pool": "mla"})).unwrap()
    }
    const BODY: &str = r#"{"attn_tp_size": 4, "attn_cp_size": 1, "dp_size": 2, "pp_size": 1, "page_size": 64, "kv_cache_dtype": "auto", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false, "decode_allocation_policy": "early", "enable_kv_cache_sharding": false, "prefill_http_port": 30000, "target_tp_rank": null, "target_tp_ranks": null, "target_cp_ranks": null, "target_pp_ranks": null, "required_dst_info_num": null, "required_prefill_response_num": null}"#;

    #[test]
    fn assess_separates_waiting_from_failing() {
        let verdict = |page: i64, status: u16, body: &[u8]| *assess(&decode(page), status, body).expect_err("must not pass");
        let reason = |v: &Verdict| v.reason_and_message().0;
        let registering = verdict(64, 503, b"Prefill server not fully registered yet (1 workers registered).");
        assert!(matches!(registering, Verdict::Pending { .. }) && reason(&registering) == "Registering");
        let broken = verdict(64, 500, b"boom");
        assert!(matches!(broken, Verdict::Pending { .. }) && reason(&broken) == "BootstrapError");
        let page = verdict(64, 502, b"<html><body>internal admin console, token=abc</body></html>");
        assert_eq!(page.reason_and_message(), ("BootstrapError".to_owned(), "bootstrap server answered 502: an HTML page".to_owned()));
        let Verdict::Pending { message, .. } = verdict(64, 503, "x".repeat(10_000).as_bytes()) else { panic!("503 waits") };
        assert!(message.chars().count() <= BOOTSTRAP_TEXT + 1, "a long answer is cut");
        assert_eq!(
            registering.reason_and_message().1,
            "Prefill server not fully registered yet (1 workers registered).",
            "SGLang's own text stays whole"
        );
        let Verdict::Failed { reason, error, .. } = verdict(32, 200, BODY.as_bytes()) else { panic!("page size must fail") };
        assert_eq!(reason, "PageSizeMismatch");
        assert!(error.starts_with("Page size mismatch: prefill server has page_size=64, but decode server has page_size=32."));
        let extra = BODY.replace("\"dp_size\"", "\"bonus\": 1, \"dp_size\"");
        let Verdict::Failed { reason, error, .. } = verdict(64, 200, extra.as_bytes()) else { panic!("an extra key must fail") };
        assert_eq!(reason, "IncompatibleTopologyBody");
        assert!(error.contains("unexpected keyword argument 'bonus'"), "{error}");
        let truncated = verdict(64, 200, b"{\"attn_tp_size\": ");
        assert!(matches!(truncated, Verdict::Failed { .. }) && truncated.reason_and_message().0 == "IncompatibleTopologyBody");
    }

    #[test]
    fn rows_cover_every_dp_rank_and_target() {
        let (_, p, h) = assess(&decode(64), 200, BODY.as_bytes()).unwrap();
        // MLA decode TP2 reads prefill TP ranks {0,1} and {2,3}: all four, on both DP ranks.
        let rows = needed_rows(&p, &h.ranks);
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[0], (0, 0, 0, 0));
        assert_eq!(rows[7], (1, 0, 3, 0));
    }

    #[test]
    fn rank_bodies_are_read_as_sglang_reads_them() {
        assert_eq!(parse_row(br#"{"rank_ip": "10.0.0.1", "rank_port": "4000"}"#), Ok(("10.0.0.1".into(), 4000)));
        assert!(parse_row(br#"{"rank_ip": "10.0.0.1"}"#).unwrap_err().contains("'rank_port'"));
        assert!(parse_row(br#"{"rank_ip": "a", "rank_port": 1, "x": 2}"#).unwrap_err().contains("'x'"));
        assert!(parse_row(br#"{"rank_ip": "a", "rank_port": 70000}"#).is_err());
        assert!(parse_row(b"[]").is_err());
    }
}
