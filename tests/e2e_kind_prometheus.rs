//! The kind tier's Prometheus (issue #34): a real Prometheus 3.16.0 and kube-state-metrics 2.20.0,
//! both built from the Go module proxy (hack/monitoring-images.sh), installed by
//! hack/kind-monitoring.sh from hack/kind/prometheus.yaml. There is no Prometheus Operator in the
//! tier: the scrape jobs are hand-written equivalents of the chart's PodMonitor and ServiceMonitor,
//! and the chart's rule file is loaded as a rule file. Run by `make e2e-kind` (hack/kind-e2e.sh),
//! ignored under `make test`.
//!
//! Prometheus is asked through the apiserver's service proxy
//! (`/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/api/v1/...`).

use pd_testing as common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{PAGE_SIZE_32_VS_64, TestNamespace, cluster, condition, repo_path, text, wait_for};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(180);
const MONITORING: &str = "monitoring";
const MODEL: &str = "deepseek-ai/DeepSeek-V3";
/// Grafana's `$__rate_interval` for a 15 s scrape interval (4 × 15 s); the tier scrapes every 5 s.
const RATE_INTERVAL: &str = "1m";
/// What hack/kind-monitoring.sh sets PDDecodeHandshakeFailing's `for:` to (the chart says 5m).
const HANDSHAKE_ALERT_FOR: &str = "30s";

/// Dashboard queries that count failures only: their series appear with the first failure
/// (smg's error counters, 4xx/5xx responses, webhook calls that failed or failed open, reconcile
/// errors), so a healthy run may leave them empty. Their panels must still show data.
const FAILURES_ONLY: &[&str] = &[
    "smg_router_request_errors_total",
    "status_code=~\"[45]..\"}[",
    "error_type!=\"no_error\"",
    "apiserver_admission_webhook_fail_open_count",
    "pd_operator_reconcile_errors_total",
];

/// Percent-encodes a query parameter (RFC 3986 unreserved characters stay).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET Prometheus' HTTP API at `path` (with its query string) through the apiserver's service proxy;
/// the `data` of a `success` answer.
fn prometheus(path: &str) -> Result<Value, String> {
    let raw = format!("/api/v1/namespaces/{MONITORING}/services/prometheus:9090/proxy{path}");
    let o = cluster().kubectl(&["get", "--raw", &raw]);
    if !o.status.success() {
        return Err(format!("GET {path}: {}", text(&o)));
    }
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
    (v["status"] == "success").then(|| v["data"].clone()).ok_or_else(|| format!("GET {path}: {v}"))
}

/// An instant query's result vector.
fn query(expr: &str) -> Result<Vec<Value>, String> {
    let data = prometheus(&format!("/api/v1/query?query={}", encode(expr)))?;
    Ok(data["result"].as_array().cloned().unwrap_or_default())
}

fn label_values(label: &str, selector: &str) -> Vec<String> {
    let data = prometheus(&format!("/api/v1/label/{label}/values?match%5B%5D={}", encode(selector))).unwrap_or_default();
    data.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
}

/// The series of a result with a finite value (a histogram quantile over a window with no events
/// is NaN: a series, but nothing Grafana draws).
fn finite(result: &[Value]) -> usize {
    result.iter().filter(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).is_some_and(f64::is_finite)).count()
}

fn is_ready(pod: &Value) -> bool {
    condition(pod, "Ready").is_some_and(|c| c["status"] == "True")
}

fn pods(ns: &str, selector: &str) -> Vec<Value> {
    let o = cluster().kubectl(&["get", "pods", "-n", ns, "-l", selector, "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

/// One prefill and one decode (TP2 each, one pod each) behind smg. Prometheus' namespace may reach
/// the router's metrics port (`clientsFrom`, beside the namespace's own pods) and, by the
/// NetworkPolicy docs/observability.md tells users to add, the engines' HTTP port.
fn scraped_pdd(name: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  engine: {{type: sim}}\n  model: {{path: {MODEL}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 2}}, template: {{extraArgs: [--sim-itl-ms, '5']}}}}\n  decode: {{replicas: 1, parallelism: {{tp: 2}}, template: {{extraArgs: [--sim-itl-ms, '5']}}}}\n  router: {{policy: round_robin}}\n  networkPolicy:\n    clientsFrom:\n    - podSelector: {{}}\n    - namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {MONITORING}}}}}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: prometheus-scrapes-engines}}\nspec:\n  podSelector: {{matchLabels: {{pd.inference.dev/engine: \"true\"}}}}\n  policyTypes: [Ingress]\n  ingress:\n  - from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {MONITORING}}}}}}}]\n    ports: [{{port: {}, protocol: TCP}}]\n",
        pd_api::DEFAULT_HTTP_PORT
    )
}

/// `pd-sim bench` for `seconds` at `concurrency` in pod `pod`, started and not waited for.
fn start_load(ns: &TestNamespace, pod: &str, target: &str, seconds: u32, concurrency: u32) {
    let image = std::env::var("PD_KIND_SIM_IMAGE").expect("PD_KIND_SIM_IMAGE: run through `make e2e-kind`");
    let (s, c) = (seconds.to_string(), concurrency.to_string());
    let bench = ["pd-sim", "bench", "--target", target, "--model", MODEL, "--max-tokens", "8", "--requests", "100000000"];
    ns.start_pod(pod, &image, &[&bench[..], &["--seconds", &s, "--concurrency", &c]].concat());
}

fn wait_pdd_ready(ns: &TestNamespace, name: &str) {
    wait_for(WAIT * 2, "Ready=True and the router available", || {
        let v = ns.get_json("pdd", name)?;
        let ready = condition(&v, "Ready").is_some_and(|c| c["status"] == "True");
        let d = ns.get_json("deployment", &format!("{name}-router"))?;
        (ready && d["status"]["availableReplicas"] == 1).then_some(()).ok_or_else(|| format!("{} {}", v["status"], d["status"]))
    });
}

/// One dashboard query: the panel it belongs to and its PromQL as the dashboard has it.
struct PanelQuery {
    panel: String,
    expr: String,
}

fn dashboard_queries() -> Vec<PanelQuery> {
    let path = repo_path("charts/pd-operator/dashboards/pd-serving.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let panel = p["title"].as_str().unwrap().to_owned();
            out.push(PanelQuery { panel, expr: t["expr"].as_str().unwrap().to_owned() });
        }
    }
    out
}

/// The dashboard's variables as Grafana would fill them for this PDDeployment, read from
/// Prometheus by the variables' own queries (`label_values(sglang:num_running_reqs, ...)`).
fn variables(ns: &str, name: &str) -> Result<Vec<(&'static str, String)>, String> {
    let has = |label: &str, selector: &str, want: &str| {
        let got = label_values(label, selector);
        got.iter().any(|v| v == want).then_some(()).ok_or_else(|| format!("label_values({selector}, {label}) = {got:?}, no {want}"))
    };
    has("namespace", "sglang:num_running_reqs", ns)?;
    has("pdd", &format!("sglang:num_running_reqs{{namespace=~\"{ns}\"}}"), name)?;
    has("model_name", &format!("sglang:num_running_reqs{{namespace=~\"{ns}\", pdd=~\"{name}\"}}"), MODEL)?;
    Ok(vec![
        ("$namespace", ns.to_owned()),
        ("$pdd", name.to_owned()),
        ("$model", MODEL.to_owned()),
        ("$__rate_interval", RATE_INTERVAL.to_owned()),
    ])
}

fn substitute(expr: &str, vars: &[(&str, String)]) -> String {
    // Longest name first: `$__rate_interval` before anything that could prefix it.
    let mut vars = vars.to_vec();
    vars.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    let out = vars.iter().fold(expr.to_owned(), |e, (k, v)| e.replace(k, v));
    assert!(!out.contains('$'), "a dashboard variable this test does not fill: {out}");
    out
}

/// Every query once: (panel, query, series, finite series).
fn evaluate(queries: &[PanelQuery], vars: &[(&str, String)]) -> Result<Vec<(String, String, usize, usize)>, String> {
    queries
        .iter()
        .map(|q| {
            let r = query(&substitute(&q.expr, vars))?;
            Ok((q.panel.clone(), q.expr.clone(), r.len(), finite(&r)))
        })
        .collect()
}

/// What is missing: queries (not failure counters) with no finite value, and panels with none.
fn missing(rows: &[(String, String, usize, usize)]) -> Vec<String> {
    let mut out: Vec<String> = rows
        .iter()
        .filter(|(_, e, _, f)| *f == 0 && !FAILURES_ONLY.iter().any(|k| e.contains(k)))
        .map(|(p, e, _, _)| format!("{p}: {e}"))
        .collect();
    let panels: BTreeSet<&String> = rows.iter().map(|(p, ..)| p).collect();
    for p in panels {
        if rows.iter().filter(|(q, ..)| q == p).all(|(_, _, _, f)| *f == 0) {
            out.push(format!("panel {p:?} has no data at all"));
        }
    }
    out
}

/// Every scrape job of hack/kind/prometheus.yaml has a healthy target, and the PodMonitor's jobs
/// scrape this PDDeployment's prefill, decode and router with the chart's labels.
fn targets_up(ns: &str, name: &str) -> Result<(), String> {
    let data = prometheus("/api/v1/targets?state=active")?;
    let active = data["activeTargets"].as_array().cloned().unwrap_or_default();
    let up = |job: &str| active.iter().any(|t| t["labels"]["job"] == job && t["health"] == "up");
    let jobs = [
        "podMonitor/pd-system/pd-operator-serving/0",
        "podMonitor/pd-system/pd-operator-serving/1",
        "serviceMonitor/pd-system/pd-operator/0",
        "apiserver",
        "kube-state-metrics",
    ];
    let down: Vec<&str> = jobs.into_iter().filter(|j| !up(j)).collect();
    let ours: BTreeSet<String> = active
        .iter()
        .filter(|t| t["labels"]["namespace"] == ns && t["labels"]["pdd"] == name && t["health"] == "up")
        // Engines carry their instance; the router belongs to no instance.
        .filter(|t| (t["labels"]["pd_instance"] == "0") != (t["labels"]["role"] == "router"))
        .filter(|t| t["labels"]["kv_set"].is_string() && t["labels"]["pod"].is_string())
        .filter_map(|t| t["labels"]["role"].as_str().map(str::to_owned))
        .collect();
    let want: BTreeSet<String> = ["decode", "prefill", "router"].map(String::from).into();
    (down.is_empty() && ours == want)
        .then_some(())
        .ok_or_else(|| format!("jobs without a healthy target: {down:?}; {name}'s roles up: {ours:?}"))
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
/// Under load through smg, every panel of the chart's dashboard has data in the tier's Prometheus:
/// each of the 43 queries, with the variables filled as Grafana fills them from the variables'
/// own queries, returns a finite value (the failure counters may be empty: nothing fails here),
/// and no panel is empty.
fn every_dashboard_panel_has_data_under_load() {
    let ns = TestNamespace::new("kind-prom");
    let name = "scraped";
    let o = ns.apply(&scraped_pdd(name));
    assert!(o.status.success(), "{}", text(&o));
    wait_pdd_ready(&ns, name);
    wait_for(WAIT, "every scrape job up, this PDDeployment's pods scraped with the chart's labels", || {
        targets_up(&ns.name, name).inspect_err(|_| std::thread::sleep(Duration::from_secs(2)))
    });
    let target = format!("{name}-router:{}", pd_api::DEFAULT_ROUTER_PORT);
    start_load(&ns, "load", &target, 60, 4);
    let queries = dashboard_queries();
    assert!(queries.len() >= 40, "{} dashboard queries", queries.len());
    let started = Instant::now();
    let mut pokes = 0;
    let rows = wait_for(WAIT, "every dashboard query with data", || {
        // The operator's panels need work for it too: each update of the PDDeployment goes
        // through the webhook (the apiserver's calls to it) and triggers a reconcile.
        pokes += 1;
        let poke = format!("e2e.pd.inference.dev/poke={pokes}");
        let o = cluster().kubectl(&["annotate", "pdd", name, "-n", &ns.name, "--overwrite", &poke]);
        assert!(o.status.success(), "{}", text(&o));
        let vars = variables(&ns.name, name)?;
        let rows = evaluate(&queries, &vars)?;
        let gaps = missing(&rows);
        std::thread::sleep(Duration::from_secs(if gaps.is_empty() { 0 } else { 3 }));
        gaps.is_empty().then_some(rows).ok_or_else(|| gaps.join("\n"))
    });
    let phase = ns.get_json("pod", "load").unwrap()["status"]["phase"].as_str().unwrap_or_default().to_owned();
    eprintln!("every panel with data {:.0} s into the load (load pod {phase}):", started.elapsed().as_secs_f64());
    for (panel, expr, series, fin) in &rows {
        eprintln!("  {fin:>2}/{series:<2} {panel}: {}", expr.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    assert_eq!(phase, "Running", "the queries were answered after the load ended");
    let report = ns.pod_report("load", WAIT);
    eprintln!("load: {report}");
    assert_eq!(report["failed"], 0, "{report}");
}

/// The rule file Prometheus loaded is the chart's with one line changed, PDDecodeHandshakeFailing's
/// `for:`, and Prometheus evaluates that alert with the shortened hold.
fn loaded_rules_are_the_charts_with_a_shorter_handshake_hold() {
    let o = cluster().kubectl(&["get", "configmap", "prometheus-rules", "-n", MONITORING, "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let cm: Value = serde_json::from_slice(&o.stdout).unwrap();
    let loaded = cm["data"]["pd-operator.rules.yaml"].as_str().expect("the rule file in the ConfigMap").to_owned();
    let chart = std::fs::read_to_string(repo_path("charts/pd-operator/rules/pd-operator.rules.yaml")).unwrap();
    let (loaded, chart): (Vec<&str>, Vec<&str>) = (loaded.lines().collect(), chart.lines().collect());
    assert_eq!(loaded.len(), chart.len(), "the loaded rule file is not the chart's");
    let changed: Vec<usize> = (0..chart.len()).filter(|i| loaded[*i] != chart[*i]).collect();
    assert_eq!(changed.len(), 1, "lines changed from the chart's rule file: {changed:?}");
    let i = changed[0];
    assert_eq!((chart[i], loaded[i]), ("    for: 5m", format!("    for: {HANDSHAKE_ALERT_FOR}").as_str()));
    let alert = chart[..i].iter().rev().find(|l| l.starts_with("  - alert: ")).unwrap();
    assert_eq!(*alert, "  - alert: PDDecodeHandshakeFailing");
    let data = wait_for(WAIT, "Prometheus to load the rules", || prometheus("/api/v1/rules?type=alert"));
    let rule = data["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .find(|r| r["name"] == "PDDecodeHandshakeFailing")
        .expect("PDDecodeHandshakeFailing loaded");
    assert_eq!(rule["duration"].as_f64(), Some(30.0), "{rule}");
}

/// Active PDDecodeHandshakeFailing alerts in namespace `ns` (other tests' namespaces may have theirs).
fn handshake_alerts(ns: &str) -> Result<Vec<Value>, String> {
    let data = prometheus("/api/v1/alerts")?;
    Ok(data["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["labels"]["alertname"] == "PDDecodeHandshakeFailing" && a["labels"]["namespace"] == ns)
        .cloned()
        .collect())
}

/// A prefill (TP2) advertising page size 32 to a decode (TP2) launched with 64, no router.
fn mismatch_pdd(name: &str, prefill_args: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  engine: {{type: sim}}\n  model: {{path: {MODEL}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 2}}, template: {{extraArgs: {prefill_args}}}}}\n  decode: {{replicas: 1, parallelism: {{tp: 2}}}}\n  router: {{enabled: false}}\n"
    )
}

fn decode_pods(ns: &str, name: &str) -> Vec<Value> {
    pods(ns, &format!("pd.inference.dev/deployment={name},pd.inference.dev/role=decode"))
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
/// A page-size mismatch makes PDDecodeHandshakeFailing fire for the decode pod, and fixing the
/// prefill clears it. Time compressed in the tier: the alert's `for:` is 30 s here instead of the
/// chart's 5 m (hack/kind-monitoring.sh rewrites that one line; the expression is unchanged, and
/// this test checks that it is the only change).
fn a_page_size_mismatch_fires_the_handshake_alert_and_the_fix_clears_it() {
    loaded_rules_are_the_charts_with_a_shorter_handshake_hold();
    let ns = TestNamespace::new("kind-alert");
    let name = "mismatch";
    let t0 = Instant::now();
    let secs = || t0.elapsed().as_secs_f64();
    let o = ns.apply(&mismatch_pdd(name, "[--sim-page-size, '32']"));
    assert!(o.status.success(), "{}", text(&o));
    common::wait_page_size_mismatch(&ns, name, WAIT);
    let mismatch = format!("RuntimeError: {PAGE_SIZE_32_VS_64}");
    let pod = wait_for(WAIT, "the decode engine ready, its gate failing on the page size", || {
        let d = decode_pods(&ns.name, name);
        let settled = |p: &Value| {
            let engine = p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["name"] == "engine" && c["ready"] == true));
            let gate = condition(p, "pd.inference.dev/handshake");
            engine
                && !is_ready(p)
                && gate.is_some_and(|g| g["status"] == "False" && g["message"].as_str().is_some_and(|m| m.contains(&mismatch)))
        };
        match d.as_slice() {
            [p] if settled(p) => Ok(p["metadata"]["name"].as_str().unwrap().to_owned()),
            _ => Err(format!("{d:?}")),
        }
    });
    let settled = secs();
    let pending = wait_for(WAIT, "PDDecodeHandshakeFailing pending or firing", || {
        let a = handshake_alerts(&ns.name)?;
        (!a.is_empty()).then(secs).ok_or_else(|| "no alert yet".to_owned())
    });
    let alert = wait_for(WAIT, "PDDecodeHandshakeFailing firing", || {
        let a = handshake_alerts(&ns.name)?;
        std::thread::sleep(Duration::from_millis(500));
        a.iter().find(|a| a["state"] == "firing").cloned().ok_or_else(|| format!("{a:?}"))
    });
    let firing = secs();
    assert_eq!(alert["labels"]["pod"], pod.as_str(), "{alert}");
    assert_eq!(alert["labels"]["pdd"], name, "{alert}");
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    assert!(firing - pending >= 20.0, "fired {:.0} s after it was first seen pending, under the 30 s hold: {alert}", firing - pending);

    // The fix: the prefill advertises the page size both sides were launched with.
    let o = ns.apply(&mismatch_pdd(name, "[]"));
    assert!(o.status.success(), "{}", text(&o));
    let fixed = secs();
    wait_for(WAIT * 2, "the decode pod Ready through its gate", || {
        let d = decode_pods(&ns.name, name);
        (d.len() == 1 && is_ready(&d[0])).then_some(()).ok_or_else(|| format!("{d:?}"))
    });
    let ready = secs();
    wait_for(WAIT, "PDDecodeHandshakeFailing gone", || {
        let a = handshake_alerts(&ns.name)?;
        std::thread::sleep(Duration::from_millis(500));
        a.is_empty().then_some(()).ok_or_else(|| format!("{a:?}"))
    });
    let cleared = secs();
    eprintln!(
        "PDDecodeHandshakeFailing for {pod}, seconds after the apply: mismatch settled {settled:.0}, pending {pending:.0}, \
         firing {firing:.0}, fix applied {fixed:.0}, decode Ready {ready:.0}, alert gone {cleared:.0}; {alert}"
    );
}
