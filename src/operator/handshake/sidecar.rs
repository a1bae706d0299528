//! `pd-operator handshake run`: the decode pod's sidecar. It checks every prefill instance as the
//! decode will, keeps checking, serves `/readyz`, and reports to its pod: the readiness-gate
//! condition `pd.inference.dev/handshake` and the rank map annotation the controller reads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use thiserror::Error;
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use pd_api::RankTargets;
use pd_api::conditions::{HasStatus, Status};
use pd_api::labels::{HANDSHAKE_CONDITION, RANK_MAP_ANNOTATION};
use pd_core::handshake::core::{DecodeTopology, RankMapping};
use pd_runtime::http_client;
use pd_runtime::probe::{self, Verdict};

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// The decode's heartbeat: `GET /health` every 5 s, lost after 2 consecutive failures.
const HEARTBEAT: Duration = Duration::from_secs(5);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
const HEARTBEAT_FAILURES: u32 = 2;
/// A full re-check also catches a prefill that restarted between two heartbeats.
const RECHECK: Duration = Duration::from_secs(60);
const PREFILL_FILE_POLL: Duration = Duration::from_secs(5);
/// `--once`: rounds an unreachable rank gets before it counts as a failure.
const DIAL_ROUNDS: u32 = 3;
/// How long a restarted sidecar (a crash, or a new image) keeps the gate a serving decode pod
/// already has while its own first check is undecided: three times a running sidecar's
/// heartbeat loss (2 x 5 s), so a restart never turns a serving decode unready for "Checking",
/// and a prefill that stays unreachable still turns it unready within half a minute.
const RESTART_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum SidecarError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Decode { path: PathBuf, message: String },
    #[error("--pod must be NAMESPACE/NAME, got {0:?}")]
    PodRef(String),
    #[error("cannot reach the Kubernetes API to report to the pod: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// What the sidecar checks, and where it reports.
#[derive(Clone, Debug)]
pub struct SidecarConfig {
    pub decode: DecodeTopology,
    pub prefills: Vec<String>,
    pub prefill_file: Option<PathBuf>,
    pub pod: Option<(String, String)>,
    pub listen: Option<SocketAddr>,
}

pub fn read_decode(path: &PathBuf) -> Result<DecodeTopology, SidecarError> {
    let text = std::fs::read_to_string(path).map_err(|source| SidecarError::Read { path: path.clone(), source })?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| SidecarError::Decode { path: path.clone(), message: format!("not JSON: {e}") })?;
    DecodeTopology::parse(&value).map_err(|e| SidecarError::Decode { path: path.clone(), message: e.to_string() })
}

pub fn parse_pod_ref(s: &str) -> Result<(String, String), SidecarError> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok((ns.into(), name.into())),
        _ => Err(SidecarError::PodRef(s.into())),
    }
}

/// Addresses from `--prefill` and the prefill file (one `host:port` per line, `#` comments).
fn addresses(cfg: &SidecarConfig) -> Result<Vec<String>, SidecarError> {
    let file = match &cfg.prefill_file {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|source| SidecarError::Read { path: path.clone(), source })?),
        None => None,
    };
    Ok(merge_addresses(&cfg.prefills, file.as_deref()))
}

/// Flag addresses, then the file's, each once, in first-seen order.
fn merge_addresses(flags: &[String], file: Option<&str>) -> Vec<String> {
    let from_file = file.into_iter().flat_map(str::lines).map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
    let mut seen = std::collections::HashSet::new();
    flags.iter().map(String::as_str).chain(from_file).filter(|a| seen.insert(*a)).map(str::to_owned).collect()
}

/// The reason of a prefill whose first check is still running.
const CHECKING: &str = "Checking";

/// The aggregate over every prefill, as the pod condition shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aggregate {
    pub passed: bool,
    pub reason: String,
    pub message: String,
}

/// The gate's rule. A failed check closes it: the prefills of a KV set share one topology, so a
/// failure is the decode's own mismatch. Otherwise one passed prefill opens it: a prefill still
/// starting, not yet in DNS, lost, or whose first check is still running is one this decode
/// cannot pull from yet, but the others serve it and the router sends no request to an unready
/// prefill. (All of them once had to pass: a prefill scale-up took the only decode out of
/// service until the new pods were in DNS. Later a first check still running kept it closed:
/// when the new prefills reached the decode's prefill file, about a minute after a scale-up, the
/// only decode left service while they were checked, smg's readiness failed with it, and every
/// request failed for half a minute; `make bench-planner`, 2026-12-05.)
pub fn aggregate(verdicts: &[(String, Option<Verdict>)]) -> Aggregate {
    if verdicts.is_empty() {
        return Aggregate { passed: false, reason: "NoPrefillInstances".into(), message: "no prefill instance to check against".into() };
    }
    let is_passed = |v: &Option<Verdict>| v.as_ref().is_some_and(Verdict::passed);
    let not_passed: Vec<&(String, Option<Verdict>)> = verdicts.iter().filter(|(_, v)| !is_passed(v)).collect();
    let failed = not_passed.iter().find(|(_, v)| matches!(v, Some(Verdict::Failed { .. })));
    let checking = not_passed.iter().find(|(_, v)| v.is_none());
    let (addr, v) = match failed {
        Some(closing) => closing,
        None if not_passed.len() < verdicts.len() => return passed(verdicts, &not_passed),
        // None passed: every verdict is in `not_passed`, and there is at least one.
        None => checking.unwrap_or(&not_passed[0]),
    };
    let (reason, text) = match v {
        Some(v) => v.reason_and_message(),
        None => (CHECKING.into(), "first check in progress".into()),
    };
    let more = match not_passed.len() {
        n if n > 1 => format!(" ({} more prefill instance(s) not passed)", n - 1),
        _ => String::new(),
    };
    Aggregate { passed: false, reason, message: format!("prefill {addr}: {text}{more}") }
}

/// The open gate's message: how many passed, SGLang's first warning, and the prefills not (yet)
/// passed with their reasons.
fn passed(verdicts: &[(String, Option<Verdict>)], not_passed: &[&(String, Option<Verdict>)]) -> Aggregate {
    let n = verdicts.len() - not_passed.len();
    let mut message = format!("SGLang's bootstrap handshake passed against {n} prefill instance(s)");
    let warning = verdicts.iter().find_map(|(_, v)| match v {
        Some(Verdict::Passed { warnings, .. }) => warnings.first(),
        _ => None,
    });
    if let Some(w) = warning {
        message.push_str(&format!("; SGLang warns: {}", w.trim_end()));
    }
    if !not_passed.is_empty() {
        let others: Vec<String> = not_passed
            .iter()
            .map(|(addr, v)| format!("{addr} ({})", v.as_ref().map_or_else(|| CHECKING.to_owned(), |v| v.reason_and_message().0)))
            .collect();
        message.push_str(&format!("; not serving this decode yet: {}", others.join(", ")));
    }
    Aggregate { passed: true, reason: "HandshakePassed".into(), message }
}

/// The rank map the controller copies into `status.rankMap`: the mapping of the first prefill
/// (every prefill of a PDDeployment shares one topology).
pub fn rank_targets(ranks: &[RankMapping]) -> Vec<RankTargets> {
    let u = |v: i64| u32::try_from(v).unwrap_or(0);
    let us = |v: &[i64]| v.iter().map(|x| u(*x)).collect();
    ranks
        .iter()
        .map(|r| RankTargets {
            engine_rank: u(r.engine_rank),
            pp_rank: u(r.pp_rank),
            tp_ranks: us(&r.target_tp_ranks),
            cp_ranks: us(&r.target_cp_ranks),
            pp_ranks: us(&r.target_pp_ranks),
            required_dst_info_num: u(r.required_dst_info_num),
            required_prefill_response_num: u(r.required_prefill_response_num),
        })
        .collect()
}

/// The strategic-merge patch of `pods/status`: the gate condition (merged by `type`) and the rank
/// map annotation (the status subresource accepts metadata changes; removed while not passed).
/// A rank map that does not serialize is an error, never an empty annotation beside a passed gate.
pub fn pod_patch(agg: &Aggregate, ranks: Option<&[RankMapping]>, transition: &str) -> Result<Value, serde_json::Error> {
    let annotation = match (agg.passed, ranks) {
        (true, Some(r)) => Value::from(serde_json::to_string(&rank_targets(r))?),
        _ => Value::Null,
    };
    Ok(json!({
        "metadata": {"annotations": {RANK_MAP_ANNOTATION: annotation}},
        "status": {"conditions": [{
            "type": HANDSHAKE_CONDITION,
            "status": Status::from(agg.passed).as_str(),
            "reason": agg.reason,
            "message": agg.message,
            "lastTransitionTime": transition,
        }]}
    }))
}

/// Whether the gate is decided: closed by a failure or opened by a pass ([`aggregate`]'s rule);
/// `Checking` and pending verdicts alone decide nothing.
pub fn decided(verdicts: &[(String, Option<Verdict>)]) -> bool {
    let failed = verdicts.iter().any(|(_, v)| matches!(v, Some(Verdict::Failed { .. })));
    failed || aggregate(verdicts).passed
}

/// The gate a restarted sidecar finds on its pod: passed, since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    pub transition: String,
}

/// The passed gate condition already on the pod, if any (a sidecar that restarted beside a
/// serving engine).
pub fn inherited_gate(pod: &Pod) -> Option<Inherited> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == HANDSHAKE_CONDITION && c.is_true())?;
    Some(Inherited { transition: c.last_transition_time.as_ref().map(|t| t.0.to_string()).unwrap_or_default() })
}

/// Whether to leave the pod's gate as it is instead of reporting `agg`: a restarted sidecar
/// keeps an inherited pass while it has decided nothing, for `RESTART_GRACE`.
pub fn keeps_inherited(inherited: Option<&Inherited>, decided: bool, since_start: Duration) -> bool {
    inherited.is_some() && !decided && since_start < RESTART_GRACE
}

type Verdicts = Arc<Mutex<BTreeMap<String, Option<Verdict>>>>;

fn lock(v: &Verdicts) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<Verdict>>> {
    v.lock().unwrap_or_else(|p| p.into_inner())
}

fn snapshot(v: &Verdicts) -> Vec<(String, Option<Verdict>)> {
    lock(v).iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// When an undecided check or a refused write is tried again: from `RETRY_MIN` doubling to
/// `RETRY_MAX`, jittered so the decodes of one prefill do not probe it in step, never giving up.
fn retry_delays() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default().with_min_delay(RETRY_MIN).with_max_delay(RETRY_MAX).with_jitter().without_max_times().build()
}

/// `--once`: decide every prefill, print the report, return the exit code (0, 1 or 3).
pub async fn run_once(cfg: &SidecarConfig, timeout: Duration) -> Result<(Value, u8), SidecarError> {
    let addrs = addresses(cfg)?;
    let deadline = Instant::now() + timeout;
    let checks = addrs.iter().map(|addr| {
        let d = cfg.decode.clone();
        async move {
            let mut delays = retry_delays();
            let mut dial_rounds = 0;
            loop {
                let v = probe::probe(addr, &d).await;
                let unreachable = matches!(&v, Verdict::Failed { unreachable_ranks, .. } if !unreachable_ranks.is_empty());
                if unreachable {
                    dial_rounds += 1;
                }
                let settled = match &v {
                    Verdict::Passed { .. } => true,
                    Verdict::Failed { .. } => !unreachable || dial_rounds >= DIAL_ROUNDS,
                    Verdict::Pending { .. } => false,
                };
                let delay = delays.next().unwrap_or(RETRY_MAX);
                if settled || Instant::now() + delay >= deadline {
                    return (addr.clone(), v, settled);
                }
                tokio::time::sleep(delay).await;
            }
        }
    });
    let results = futures::future::join_all(checks).await;
    let all_passed = !results.is_empty() && results.iter().all(|(_, v, _)| v.passed());
    let timed_out = results.iter().any(|(_, _, settled)| !settled);
    let report: Vec<Value> = results.iter().map(|(addr, v, _)| report_entry(addr, v)).collect();
    let code = if all_passed {
        0
    } else if results.iter().any(|(_, v, settled)| *settled && !v.passed()) || results.is_empty() {
        1
    } else if timed_out {
        3
    } else {
        1
    };
    Ok((json!({"ok": all_passed, "prefill": report}), code))
}

fn report_entry(addr: &str, v: &Verdict) -> Value {
    match v {
        Verdict::Passed { info, ranks, warnings } => {
            json!({"address": addr, "info": info, "ranks": ranks, "warnings": warnings, "unreachable_ranks": []})
        }
        Verdict::Failed { kind, reason, error, info, unreachable_ranks } => {
            json!({"address": addr, "info": info, "kind": kind, "reason": reason, "error": error, "unreachable_ranks": unreachable_ranks})
        }
        Verdict::Pending { reason, message } => {
            json!({"address": addr, "info": null, "kind": "Timeout", "reason": reason, "error": message, "unreachable_ranks": []})
        }
    }
}

async fn healthy(addr: &str) -> bool {
    matches!(http_client::send(hyper::Method::GET, addr, "/health", None, HEARTBEAT_TIMEOUT, 4096).await, Ok(r) if r.status == 200)
}

/// Checks one prefill for as long as the sidecar runs, publishing each new verdict.
async fn watch_prefill(addr: String, d: DecodeTopology, verdicts: Verdicts, changed: watch::Sender<()>) {
    let publish = |v: Verdict| {
        let mut map = lock(&verdicts);
        let entry = map.entry(addr.clone()).or_insert(None);
        if entry.as_ref() != Some(&v) {
            let (reason, message) = v.reason_and_message();
            info!(prefill = %addr, %reason, %message, "handshake verdict");
            *entry = Some(v);
            changed.send_replace(());
        }
    };
    let mut delays = retry_delays();
    loop {
        let v = probe::probe(&addr, &d).await;
        let passed = v.passed();
        publish(v);
        if !passed {
            tokio::time::sleep(delays.next().unwrap_or(RETRY_MAX)).await;
            continue;
        }
        delays = retry_delays();
        // Passed: follow the decode's heartbeat until the prefill is lost or it is time to re-check.
        let since = Instant::now();
        let mut failures = 0;
        while since.elapsed() < RECHECK {
            tokio::time::sleep(HEARTBEAT).await;
            if healthy(&addr).await {
                failures = 0;
                continue;
            }
            failures += 1;
            if failures >= HEARTBEAT_FAILURES {
                publish(Verdict::Pending {
                    reason: "PrefillLost".into(),
                    message: format!("Lost connection with prefill instance (bootstrap_addr: {addr})"),
                });
                break;
            }
        }
    }
}

async fn readyz(State(verdicts): State<Verdicts>) -> impl IntoResponse {
    let agg = aggregate(&snapshot(&verdicts));
    let status = if agg.passed { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, format!("{}: {}\n", agg.reason, agg.message))
}

async fn status_json(State(verdicts): State<Verdicts>) -> impl IntoResponse {
    let entries: Vec<Value> = snapshot(&verdicts).into_iter().map(|(a, v)| json!({"address": a, "verdict": v})).collect();
    axum::Json(json!({"prefill": entries}))
}

/// Reports the aggregate to the pod whenever it changes; retries failed writes.
async fn report_to_pod(client: kube::Client, (ns, name): (String, String), verdicts: Verdicts, mut changed: watch::Receiver<()>) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(client, &ns);
    let started = Instant::now();
    let mut inherited = inherited_from(&pods, &name).await;
    let mut last: Option<Aggregate> = None;
    let mut transition = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut delays = retry_delays();
    loop {
        let snap = snapshot(&verdicts);
        let agg = aggregate(&snap);
        if keeps_inherited(inherited.as_ref(), decided(&snap), started.elapsed()) {
            // Wake when the grace ends even if no verdict changes.
            let left = RESTART_GRACE.saturating_sub(started.elapsed());
            let _ = tokio::time::timeout(left, changed.changed()).await;
            continue;
        }
        if last.as_ref() != Some(&agg) {
            let was_passed = last.as_ref().map(|l| l.passed).or(inherited.as_ref().map(|_| true));
            if was_passed != Some(agg.passed) {
                transition = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            } else if let (None, Some(i)) = (&last, &inherited) {
                transition.clone_from(&i.transition);
            }
            match send_report(&pods, &name, &snap, &agg, &transition).await {
                Ok(()) => {
                    info!(pod = %name, passed = agg.passed, reason = %agg.reason, "reported the handshake to the pod");
                    last = Some(agg);
                    inherited = None;
                    delays = retry_delays();
                }
                Err(e) => {
                    warn!(pod = %name, error = %e, "cannot report the handshake to the pod; retrying");
                    tokio::time::sleep(delays.next().unwrap_or(RETRY_MAX)).await;
                    continue;
                }
            }
        }
        if changed.changed().await.is_err() {
            return;
        }
    }
}

/// The pod's passed gate at start; a pod that cannot be read inherits nothing (the sidecar then
/// reports from scratch, as on first start).
async fn inherited_from(pods: &kube::Api<Pod>, name: &str) -> Option<Inherited> {
    match pods.get_status(name).await {
        Ok(pod) => {
            let i = inherited_gate(&pod);
            if i.is_some() {
                info!(pod = %name, "the pod's handshake gate is already True: kept while the first check runs");
            }
            i
        }
        Err(e) => {
            warn!(pod = %name, error = %e, "cannot read the pod's current handshake gate");
            None
        }
    }
}

/// One report: the gate condition and, when passed, the rank map.
async fn send_report(
    pods: &kube::Api<Pod>,
    name: &str,
    snap: &[(String, Option<Verdict>)],
    agg: &Aggregate,
    transition: &str,
) -> Result<(), String> {
    let ranks = snap.iter().find_map(|(_, v)| match v {
        Some(Verdict::Passed { ranks, .. }) => Some(ranks.clone()),
        _ => None,
    });
    // Unreported, the gate keeps the pod out of service: a report is never sent half-made.
    let patch = pod_patch(agg, ranks.as_deref(), transition).map_err(|e| format!("cannot serialize the rank map: {e}"))?;
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(drop).map_err(|e| e.to_string())
}

/// The long-running sidecar; returns when `shutdown` resolves.
pub async fn run(cfg: SidecarConfig, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), SidecarError> {
    let verdicts: Verdicts = Arc::new(Mutex::new(BTreeMap::new()));
    let (changed_tx, changed_rx) = watch::channel(());
    let mut tasks: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut background = Vec::new();
    if let Some(pod) = cfg.pod.clone() {
        let client = pd_runtime::kube_client::connect().await?;
        let span = info_span!("report", pod = %format!("{}/{}", pod.0, pod.1));
        background.push(tokio::spawn(report_to_pod(client, pod, verdicts.clone(), changed_rx).instrument(span)));
    }
    if let Some(addr) = cfg.listen {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| SidecarError::Listen { addr, source })?;
        let app = Router::new()
            .route("/livez", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/status", get(status_json))
            .with_state(verdicts.clone());
        background.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                warn!(error = %e, "handshake status server stopped");
            }
        }));
    }
    let sync = async {
        loop {
            match addresses(&cfg) {
                Ok(addrs) => {
                    let gone: Vec<String> = tasks.keys().filter(|a| !addrs.contains(a)).cloned().collect();
                    for a in gone {
                        if let Some(t) = tasks.remove(&a) {
                            t.abort();
                        }
                        lock(&verdicts).remove(&a);
                        changed_tx.send_replace(());
                    }
                    for a in addrs {
                        if let std::collections::btree_map::Entry::Vacant(slot) = tasks.entry(a.clone()) {
                            lock(&verdicts).insert(a.clone(), None);
                            changed_tx.send_replace(());
                            let span = info_span!("prefill", address = %a);
                            let task = watch_prefill(a, cfg.decode.clone(), verdicts.clone(), changed_tx.clone()).instrument(span);
                            slot.insert(tokio::spawn(task));
                        }
                    }
                }
                Err(e) => warn!(error = %e, "cannot read the prefill addresses; keeping the current set"),
            }
            tokio::time::sleep(PREFILL_FILE_POLL).await;
        }
    };
    tokio::select! {
        _ = shutdown => info!("shutdown signal received; the handshake sidecar stops"),
        _ = sync => {}
    }
    for t in tasks.values().chain(background.iter()) {
        t.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_prefill_address_is_probed_once_in_first_seen_order() {
        let flags = vec!["a:8998".to_owned(), "b:8998".to_owned(), "a:8998".to_owned()];
        let file = "# prefills\nc:8998\n\n  b:8998  \na:8998\n";
        assert_eq!(merge_addresses(&flags, Some(file)), ["a:8998", "b:8998", "c:8998"]);
        assert_eq!(merge_addresses(&[], None), Vec::<String>::new());
    }

    fn failed(reason: &str) -> Verdict {
        Verdict::Failed {
            kind: "RuntimeError".into(),
            reason: reason.into(),
            error: "Page size mismatch: x".into(),
            info: None,
            unreachable_ranks: vec![],
        }
    }

    fn registering() -> Verdict {
        Verdict::Pending { reason: "Registering".into(), message: "Prefill server not fully registered yet (1 workers registered).".into() }
    }

    fn ok() -> Verdict {
        Verdict::Passed { info: Value::Null, ranks: vec![], warnings: vec![] }
    }

    #[test]
    fn aggregate_prefers_failures_and_counts_the_rest() {
        let agg =
            aggregate(&[("a:1".into(), Some(registering())), ("b:1".into(), Some(failed("PageSizeMismatch"))), ("c:1".into(), Some(ok()))]);
        assert!(!agg.passed);
        assert_eq!(agg.reason, "PageSizeMismatch");
        assert_eq!(agg.message, "prefill b:1: RuntimeError: Page size mismatch: x (1 more prefill instance(s) not passed)");
        assert!(aggregate(&[("c:1".into(), Some(ok()))]).passed);
        assert_eq!(aggregate(&[("c:1".into(), None)]).reason, "Checking");
        assert_eq!(aggregate(&[("a:1".into(), Some(registering())), ("b:1".into(), Some(registering()))]).reason, "Registering");
        assert!(!aggregate(&[]).passed);
    }

    /// A prefill scale-up: the new pod is not in DNS yet, the old one serves; the decode stays in
    /// service and its condition names the newcomer.
    #[test]
    fn one_passed_prefill_opens_the_gate() {
        let unreachable = Verdict::Pending { reason: "PrefillUnreachable".into(), message: "dns error".into() };
        let agg = aggregate(&[("old:1".into(), Some(ok())), ("new:1".into(), Some(unreachable))]);
        assert!(agg.passed, "{agg:?}");
        assert_eq!(
            agg.message,
            "SGLang's bootstrap handshake passed against 1 prefill instance(s); not serving this decode yet: new:1 (PrefillUnreachable)"
        );
        let first = aggregate(&[("old:1".into(), Some(ok())), ("new:1".into(), None)]);
        assert!(first.passed, "a first check still running does not close it: {first:?}");
        assert!(first.message.ends_with("not serving this decode yet: new:1 (Checking)"), "{}", first.message);
        let none = aggregate(&[
            ("a:1".into(), None),
            ("b:1".into(), Some(Verdict::Pending { reason: "PrefillUnreachable".into(), message: "m".into() })),
        ]);
        assert_eq!((none.passed, none.reason.as_str()), (false, "Checking"), "none passed: closed, the first check named");
        let failing = aggregate(&[("old:1".into(), Some(ok())), ("new:1".into(), Some(failed("PageSizeMismatch")))]);
        assert_eq!((failing.passed, failing.reason.as_str()), (false, "PageSizeMismatch"), "a failure closes it");
    }

    #[test]
    fn pod_patch_sets_the_gate_and_drops_the_rank_map_when_failing() {
        let agg = Aggregate { passed: false, reason: "PageSizeMismatch".into(), message: "m".into() };
        let p = pod_patch(&agg, None, "2026-01-01T00:00:00Z").unwrap();
        assert_eq!(p["status"]["conditions"][0]["type"], HANDSHAKE_CONDITION);
        assert_eq!(p["status"]["conditions"][0]["status"], "False");
        assert!(p["metadata"]["annotations"][RANK_MAP_ANNOTATION].is_null());
    }

    #[test]
    fn only_passes_and_failures_are_decided() {
        let pending = Verdict::Pending { reason: "Unreachable".into(), message: "connection refused".into() };
        assert!(decided(&[("a:1".into(), Some(ok()))]));
        assert!(decided(&[("a:1".into(), Some(failed("PageSizeMismatch"))), ("b:1".into(), None)]));
        assert!(decided(&[("a:1".into(), Some(ok())), ("b:1".into(), None)]), "one pass opens the gate");
        assert!(!decided(&[("a:1".into(), None)]));
        assert!(decided(&[("a:1".into(), Some(ok())), ("b:1".into(), Some(pending.clone()))]), "one pass opens the gate");
        assert!(!decided(&[("a:1".into(), Some(pending))]));
    }

    #[test]
    fn a_restarted_sidecar_keeps_a_passed_gate_only_while_undecided_and_within_the_grace() {
        let i = Inherited { transition: "2026-01-01T00:00:00Z".into() };
        let soon = Duration::from_secs(1);
        assert!(keeps_inherited(Some(&i), false, soon));
        assert!(!keeps_inherited(Some(&i), true, soon), "a decided verdict is reported at once");
        assert!(!keeps_inherited(Some(&i), false, RESTART_GRACE), "an unreachable prefill turns it unready after the grace");
        assert!(!keeps_inherited(None, false, soon), "a first start reports Checking as before");
    }

    #[test]
    fn only_a_true_gate_is_inherited_with_its_transition_time() {
        let pod = |status: &str| -> Pod {
            serde_json::from_value(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": HANDSHAKE_CONDITION, "status": status, "lastTransitionTime": "2026-01-02T03:04:05Z"},
            ]}}))
            .unwrap()
        };
        assert_eq!(inherited_gate(&pod("True")), Some(Inherited { transition: "2026-01-02T03:04:05Z".into() }));
        assert_eq!(inherited_gate(&pod("False")), None);
        assert_eq!(inherited_gate(&Pod::default()), None);
    }

    #[test]
    fn pod_reference_must_name_namespace_and_pod() {
        assert_eq!(parse_pod_ref("ns/p").unwrap(), ("ns".into(), "p".into()));
        for bad in ["p", "/p", "ns/", "a/b/c"] {
            assert!(parse_pod_ref(bad).is_err(), "{bad}");
        }
    }
}
