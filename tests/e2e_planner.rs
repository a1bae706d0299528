//! The planner (`spec.autoscaling`) against a real control plane and a real Prometheus
//! (hack/prometheus.sh, or PD_PROMETHEUS_BIN) scraping pd-sim engines on this host. The engine
//! pods on the control plane are kwok's (no process); the engines whose metrics Prometheus
//! scrapes run here, and the scrape configuration puts on their series the labels the chart's
//! PodMonitor puts on real pods' (`namespace`, `pdd`, `role`), so the planner's queries are the
//! ones a cluster's Prometheus answers.

use pd_testing as common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{Background, ControllerProcess, TestNamespace, cluster, free_port, repo_path, text, wait_for};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

fn prometheus_bin() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::env::var("PD_PROMETHEUS_BIN").unwrap_or_else(|_| {
            let o = Command::new(repo_path("hack/prometheus.sh")).output().expect("run hack/prometheus.sh");
            assert!(o.status.success(), "hack/prometheus.sh: {}", text(&o));
            String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or_default().to_owned()
        });
        PathBuf::from(dir).join("prometheus")
    })
    .clone()
}

/// A prefill and a decode stand-in on this host: prefill computes prompts slowly (so TTFT under
/// load is long) and decode runs few requests at once.
struct Engines {
    _prefill: Background,
    _decode: Background,
    prefill_http: u16,
    bootstrap: u16,
    decode_http: u16,
}

fn start_engines() -> Engines {
    let (prefill_http, bootstrap, decode_http) = (free_port(), free_port(), free_port());
    let (ph, b, dh) = (prefill_http.to_string(), bootstrap.to_string(), decode_http.to_string());
    let common = ["--model-path", "sim-model", "--host", "127.0.0.1", "--sim-itl-ms", "5"];
    let prefill = ["prefill", "--port", &ph, "--disaggregation-bootstrap-port", &b, "--sim-prefill-tokens-per-s", "2000"];
    let decode = ["decode", "--port", &dh];
    let spawn = |name: &str, args: &[&str]| Background::sim(name, &[args, &common[..]].concat());
    let (p, d) = (spawn("planner-prefill", &prefill), spawn("planner-decode", &decode));
    p.wait_port(prefill_http);
    d.wait_port(decode_http);
    Engines { _prefill: p, _decode: d, prefill_http, bootstrap, decode_http }
}

/// Prometheus scraping both engines every second, each target relabelled as the PodMonitor
/// relabels a pod of PDDeployment `ns/pdd` (charts/pd-operator/templates/podmonitor.yaml).
fn start_prometheus(ns: &str, pdd: &str, e: &Engines) -> (Background, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let job = |role: &str, port: u16| {
        format!(
            "- job_name: {role}\n  scrape_interval: 1s\n  static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n  relabel_configs:\n  \
             - {{target_label: namespace, replacement: {ns}}}\n  - {{target_label: pdd, replacement: {pdd}}}\n  \
             - {{target_label: role, replacement: {role}}}\n  - {{target_label: pd_instance, replacement: '0'}}\n"
        )
    };
    let config =
        format!("global: {{scrape_interval: 1s}}\nscrape_configs:\n{}{}", job("prefill", e.prefill_http), job("decode", e.decode_http));
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let prom = Background::spawn(
        "planner-prometheus",
        Command::new(prometheus_bin()).args([
            &format!("--config.file={}", dir.path().join("prometheus.yml").display()),
            &format!("--storage.tsdb.path={}", dir.path().join("data").display()),
            &format!("--web.listen-address=127.0.0.1:{port}"),
        ]),
    );
    prom.wait_port(port);
    (prom, port, dir)
}

/// Closed-loop load through both engines (pd-sim bench plays the gateway): long prompts queue on
/// the slow prefill.
fn load(e: &Engines, seconds: u32) -> Background {
    let (target, prefill, bootstrap) =
        (format!("127.0.0.1:{}", e.decode_http), format!("127.0.0.1:{}", e.prefill_http), format!("127.0.0.1:{}", e.bootstrap));
    Background::sim(
        "planner-load",
        &[
            "bench",
            "--target",
            &target,
            "--prefill",
            &prefill,
            "--bootstrap",
            &bootstrap,
            "--model",
            "sim-model",
            "--concurrency",
            "8",
            "--requests",
            "100000",
            "--seconds",
            &seconds.to_string(),
            "--max-tokens",
            "8",
            "--prompt-bytes",
            "2000",
            "--stream",
        ],
    )
}

fn manifest(mode: &str, prometheus: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: plan}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  \
         kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 2}}}}\n  decode: {{replicas: 1, parallelism: {{tp: 2}}}}\n  \
         router: {{enabled: false}}\n  rollout: {{drainSeconds: 1}}\n  scaling:\n    prefill: {{minReplicas: 1, maxReplicas: 2}}\n    \
         decode: {{minReplicas: 1, maxReplicas: 2}}\n  autoscaling:\n    mode: {mode}\n    prometheus: {{url: '{prometheus}'}}\n    \
         slo: {{ttftP90Seconds: 0.3, itlP90Seconds: 5}}\n    intervalSeconds: 2\n    metricsWindowSeconds: 10\n    \
         cooldownSeconds: 600\n    stabilizationWindowSeconds: 600\n"
    )
}

fn autoscaling(ns: &TestNamespace) -> Result<Value, String> {
    Ok(ns.get_json("pdd", "plan")?["status"]["autoscaling"].clone())
}

fn events(ns: &TestNamespace, reason: &str) -> Vec<String> {
    let o = cluster().kubectl(&["get", "events", "-n", &ns.name, "--field-selector", &format!("reason={reason}"), "-o", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["items"].as_array().into_iter().flatten().filter_map(|e| e["note"].as_str().or(e["message"].as_str()).map(str::to_owned)).collect()
}

/// Prefill instances with pods on the control plane.
fn prefill_instances(ns: &TestNamespace) -> Result<usize, String> {
    let o = cluster().kubectl(&[
        "get",
        "pods",
        "-n",
        &ns.name,
        "-l",
        "pd.inference.dev/deployment=plan,pd.inference.dev/role=prefill",
        "-o",
        "jsonpath={range .items[*]}{.metadata.labels.pd\\.inference\\.dev/instance}{\"\\n\"}{end}",
    ]);
    if !o.status.success() {
        return Err(text(&o));
    }
    Ok(String::from_utf8_lossy(&o.stdout).lines().collect::<std::collections::BTreeSet<_>>().len())
}

#[test]
fn the_planner_reads_sglangs_metrics_from_prometheus_recommends_then_scales_prefill_within_bounds() {
    let ns = TestNamespace::new("planner");
    let _ctl = ControllerProcess::start(&ns.name);
    let engines = start_engines();
    // First with a metrics source that does not answer: no change, and the status says why.
    let dead = format!("http://127.0.0.1:{}", free_port());
    assert!(ns.apply(&manifest("Auto", &dead)).status.success());
    wait_for(WAIT, "1 prefill instance", || (prefill_instances(&ns)? == 1).then_some(()).ok_or_else(|| "not yet".to_owned()));
    wait_for(WAIT, "MetricsUnavailable in status.autoscaling, with an Event", || {
        let a = autoscaling(&ns)?;
        let ok = a["reason"] == "MetricsUnavailable" && a["message"].as_str().is_some_and(|m| m.contains("never scales on missing data"));
        (ok && !events(&ns, "MetricsUnavailable").is_empty()).then_some(()).ok_or_else(|| a.to_string())
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(prefill_instances(&ns).unwrap(), 1, "no change on missing data");

    let (_prom, port, _dir) = start_prometheus(&ns.name, "plan", &engines);
    let _load = load(&engines, 300);
    assert!(ns.apply(&manifest("Recommend", &format!("http://127.0.0.1:{port}"))).status.success());
    let recommended = wait_for(WAIT, "a Recommend pass asking for 2 prefill on TTFT over its objective", || {
        let a = autoscaling(&ns)?;
        let p = &a["prefill"];
        let ok = a["reason"] == "Recommended"
            && p["current"] == 1
            && p["recommended"] == 2
            && p["reason"].as_str().is_some_and(|r| r.starts_with("up: TTFT p90 (s)"))
            && p["observed"]["ttftP90Seconds"].as_f64().is_some_and(|t| t > 0.3);
        ok.then(|| a.clone()).ok_or_else(|| a.to_string())
    });
    eprintln!("recommendation: {recommended}");
    let event = wait_for(WAIT, "a Recommended Event with the figures", || {
        events(&ns, "Recommended").into_iter().find(|m| m.contains("prefill 1 → 2: up: TTFT p90")).ok_or_else(|| "none yet".to_owned())
    });
    eprintln!("event: {event}");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(prefill_instances(&ns).unwrap(), 1, "Recommend changes no count");

    // Auto: prefill moves through its PDRole, owned by the planner, and never beyond maxReplicas.
    assert!(ns.apply(&manifest("Auto", &format!("http://127.0.0.1:{port}"))).status.success());
    wait_for(WAIT, "2 prefill instances, the PDRole owned by the planner", || {
        let role = ns.get_json("pdrole", "plan-prefill")?;
        let ok = role["spec"]["replicas"] == 2 && role["status"]["replicasOwner"] == "pd-operator-planner";
        (ok && prefill_instances(&ns)? == 2).then_some(()).ok_or_else(|| role.to_string())
    });
    wait_for(WAIT, "a Scaled Event", || events(&ns, "Scaled").into_iter().next().ok_or_else(|| "none yet".to_owned()));
    // Still above its objective at the bound: the planner stays at maxReplicas and says so.
    wait_for(WAIT, "prefill held at spec.scaling.prefill.maxReplicas", || {
        let a = autoscaling(&ns)?;
        let p = &a["prefill"];
        let ok = p["current"] == 2
            && p["recommended"] == 2
            && p["reason"].as_str().is_some_and(|r| r.contains("maxReplicas"))
            && a["decode"]["observed"]["itlP90Seconds"].as_f64().is_some();
        ok.then_some(()).ok_or_else(|| a.to_string())
    });
    assert_eq!(prefill_instances(&ns).unwrap(), 2);
    assert_eq!(ns.get_json("pdrole", "plan-decode").unwrap()["spec"]["replicas"], 1, "decode untouched");

    // kubectl takes the prefill count: the planner leaves it to kubectl and says so.
    let o = cluster().kubectl(&["scale", "-n", &ns.name, "pdrole/plan-prefill", "--replicas", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_for(WAIT, "the planner Held, naming kubectl, and prefill at kubectl's 1", || {
        let a = autoscaling(&ns)?;
        let ok = a["reason"] == "Held" && a["message"].as_str().is_some_and(|m| m.contains("prefill: its count is owned by kubectl"));
        (ok && prefill_instances(&ns)? == 1).then_some(()).ok_or_else(|| a.to_string())
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(ns.get_json("pdrole", "plan-prefill").unwrap()["spec"]["replicas"], 1, "the planner did not take the count back");
}

#[test]
fn the_apiserver_refuses_crossed_kv_thresholds_and_a_non_http_prometheus_naming_the_field() {
    let ns = TestNamespace::new("plannercel");
    let crossed =
        manifest("Recommend", "http://prom:9090").replace("    intervalSeconds: 2\n", "    load: {kvUsageHigh: 0.5, kvUsageLow: 0.9}\n");
    let o = ns.apply(&crossed);
    assert!(!o.status.success(), "crossed thresholds accepted");
    assert!(text(&o).contains("spec.autoscaling.load.kvUsageLow must be below kvUsageHigh"), "{}", text(&o));
    let o = ns.apply(&manifest("Recommend", "https://prom:9090"));
    assert!(!o.status.success(), "https accepted");
    assert!(text(&o).contains("spec.autoscaling.prometheus.url"), "{}", text(&o));
    let o = ns.apply(&manifest("Sometimes", "http://prom:9090"));
    assert!(text(&o).contains("spec.autoscaling.mode"), "{}", text(&o));
}
