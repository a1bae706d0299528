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
/// load is long) and decode runs few requests at once. Addresses are `host:port`.
struct Engines {
    _prefill: Background,
    _decode: Background,
    prefill_http: String,
    bootstrap: String,
    decode_http: String,
}

fn start_engines() -> Engines {
    let local = |port: u16| ("127.0.0.1".to_owned(), port);
    start_engines_at(local(free_port()), free_port(), local(free_port()))
}

/// The stand-ins listening on `(host, port)`: the prefill's HTTP port with its bootstrap port
/// on the same host, the decode's HTTP port.
fn start_engines_at(prefill: (String, u16), bootstrap: u16, decode: (String, u16)) -> Engines {
    let (ph, b, dh) = (prefill.1.to_string(), bootstrap.to_string(), decode.1.to_string());
    let common = ["--model-path", "sim-model", "--sim-itl-ms", "5"];
    let prefill_args =
        ["prefill", "--host", &prefill.0, "--port", &ph, "--disaggregation-bootstrap-port", &b, "--sim-prefill-tokens-per-s", "2000"];
    let decode_args = ["decode", "--host", &decode.0, "--port", &dh];
    let spawn = |name: &str, args: &[&str]| Background::sim(name, &[args, &common[..]].concat());
    let (p, d) = (spawn("planner-prefill", &prefill_args), spawn("planner-decode", &decode_args));
    let e = Engines {
        _prefill: p,
        _decode: d,
        prefill_http: format!("{}:{ph}", prefill.0),
        bootstrap: format!("{}:{b}", prefill.0),
        decode_http: format!("{}:{dh}", decode.0),
    };
    for addr in [&e.prefill_http, &e.decode_http] {
        wait_for(Duration::from_secs(30), &format!("a stand-in listening on {addr}"), || {
            std::net::TcpStream::connect(addr.as_str())
                .map(|_| ())
                .map_err(|err| format!("{err}; logs:\n{}\n{}", e._prefill.log_text(), e._decode.log_text()))
        });
    }
    e
}

/// Prometheus scraping both engines every second, each target relabelled as the PodMonitor
/// relabels a pod of PDDeployment `ns/pdd` (charts/pd-operator/templates/podmonitor.yaml).
fn start_prometheus(ns: &str, pdd: &str, e: &Engines) -> (Background, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let job = |role: &str, addr: &str| {
        format!(
            "- job_name: {role}\n  scrape_interval: 1s\n  static_configs: [{{targets: ['{addr}']}}]\n  relabel_configs:\n  \
             - {{target_label: namespace, replacement: {ns}}}\n  - {{target_label: pdd, replacement: {pdd}}}\n  \
             - {{target_label: role, replacement: {role}}}\n  - {{target_label: pd_instance, replacement: '0'}}\n"
        )
    };
    let config =
        format!("global: {{scrape_interval: 1s}}\nscrape_configs:\n{}{}", job("prefill", &e.prefill_http), job("decode", &e.decode_http));
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
    let (target, prefill, bootstrap) = (&e.decode_http, &e.prefill_http, &e.bootstrap);
    Background::sim(
        "planner-load",
        &[
            "bench",
            "--target",
            target,
            "--prefill",
            prefill,
            "--bootstrap",
            bootstrap,
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
    // The operator's own scrape compares its passes' samples: a window shorter than a pass has none.
    let short = manifest("Recommend", "x")
        .replace("    prometheus: {url: 'x'}\n", "")
        .replace("metricsWindowSeconds: 10", "metricsWindowSeconds: 1");
    let o = ns.apply(&short);
    assert!(!o.status.success(), "a window shorter than intervalSeconds accepted without a Prometheus");
    assert!(text(&o).contains("metricsWindowSeconds must be at least intervalSeconds"), "{}", text(&o));
    let with_prometheus = manifest("Recommend", "http://prom:9090").replace("metricsWindowSeconds: 10", "metricsWindowSeconds: 1");
    assert!(ns.apply(&with_prometheus).status.success(), "with a Prometheus the window is PromQL's");
}

/// A kwok node whose pods get addresses on this host's loopback (`podCIDR` in 127.0.0.0/8, which
/// kwok allocates pod IPs from), tainted for one namespace's pods: a stand-in started at a pod's
/// address plays that pod's engine for a client that reaches pods by IP, as the operator's own
/// scrape does. Deleted on drop.
struct LoopbackNode {
    name: String,
}

impl LoopbackNode {
    fn new(ns: &TestNamespace, cidr: &str) -> Self {
        let name = format!("loopback-{}", ns.name);
        let yaml = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  annotations: {{kwok.x-k8s.io/node: fake}}\n  \
             labels: {{type: kwok, kubernetes.io/hostname: {name}, nvidia.com/gpu.present: 'true', pd-test/loopback: {ns}}}\n\
             spec:\n  podCIDR: {cidr}\n  taints: [{{key: pd-test/loopback, value: {ns}, effect: NoSchedule}}]\n\
             status:\n  capacity: {{cpu: '32', memory: 256Gi, ephemeral-storage: 1Ti, pods: '20', nvidia.com/gpu: '8'}}\n  \
             allocatable: {{cpu: '32', memory: 256Gi, ephemeral-storage: 1Ti, pods: '20', nvidia.com/gpu: '8'}}\n",
            ns = ns.name
        );
        let o = cluster().kubectl_stdin(&["apply", "-f", "-"], &yaml);
        assert!(o.status.success(), "{}", text(&o));
        Self { name }
    }

    /// The template lines that put a role's pods on this node.
    fn template(ns: &TestNamespace) -> String {
        format!(
            "template: {{nodeSelector: {{pd-test/loopback: {ns}}}, tolerations: [{{key: pd-test/loopback, value: {ns}, effect: NoSchedule}}]}}",
            ns = ns.name
        )
    }
}

impl Drop for LoopbackNode {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["delete", "node", &self.name, "--wait=false"]);
    }
}

/// The address of the Ready leader pod of `role` of PDDeployment `plan`.
fn leader_ip(ns: &TestNamespace, role: &str) -> Result<String, String> {
    let selector = format!("pd.inference.dev/deployment=plan,pd.inference.dev/role={role},pd.inference.dev/node-rank=0");
    let o = cluster().kubectl(&["get", "pods", "-n", &ns.name, "-l", &selector, "-o", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
    let pod = v["items"].as_array().and_then(|i| i.first()).ok_or("no pod yet")?;
    let ready = pod["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True");
    let ip = pod["status"]["podIP"].as_str().filter(|_| ready).ok_or_else(|| format!("not Ready with an IP: {}", pod["status"]))?;
    Ok(ip.to_owned())
}

#[test]
fn without_prometheus_the_planner_scrapes_the_engine_pods_itself_and_says_which_did_not_answer() {
    let ns = TestNamespace::new("plannerscrape");
    let _node = LoopbackNode::new(&ns, "127.77.0.0/24");
    let _ctl = ControllerProcess::start(&ns.name);
    let place = LoopbackNode::template(&ns);
    let spec = manifest("Recommend", "unused")
        .replace("    prometheus: {url: 'unused'}\n", "")
        .replace("prefill: {replicas: 1,", &format!("prefill: {{{place}, replicas: 1,"))
        .replace("decode: {replicas: 1,", &format!("decode: {{{place}, replicas: 1,"));
    assert!(ns.apply(&spec).status.success(), "{spec}");
    let (prefill_ip, decode_ip) = wait_for(WAIT, "both leaders Ready with a loopback address", || {
        Ok::<_, String>((leader_ip(&ns, "prefill")?, leader_ip(&ns, "decode")?))
    });
    assert!(prefill_ip.starts_with("127.77.0.") && decode_ip.starts_with("127.77.0."), "{prefill_ip} {decode_ip}");

    // Nothing listens at the pods' addresses yet: no change, and the status names the pod.
    wait_for(WAIT, "MetricsUnavailable naming an engine pod that did not answer", || {
        let a = autoscaling(&ns)?;
        let m = a["message"].as_str().unwrap_or_default();
        (a["reason"] == "MetricsUnavailable" && m.contains("engine pod plan-") && m.contains(":30000"))
            .then_some(())
            .ok_or_else(|| a.to_string())
    });

    let http = pd_api::DEFAULT_HTTP_PORT;
    let engines = start_engines_at((prefill_ip, http), pd_api::DEFAULT_BOOTSTRAP_PORT, (decode_ip, http));
    let _load = load(&engines, 300);
    let recommended = wait_for(WAIT, "a Recommend pass on the scraped figures asking for 2 prefill", || {
        let a = autoscaling(&ns)?;
        let (p, d) = (&a["prefill"], &a["decode"]);
        let ok = a["reason"] == "Recommended"
            && p["recommended"] == 2
            && p["reason"].as_str().is_some_and(|r| r.starts_with("up: TTFT p90 (s)"))
            && p["observed"]["ttftP90Seconds"].as_f64().is_some_and(|t| t > 0.3)
            && d["observed"]["itlP90Seconds"].as_f64().is_some_and(|t| t > 0.0)
            && d["observed"]["runningRequests"].as_f64().is_some()
            && d["observed"]["kvUsage"].as_f64().is_some();
        ok.then(|| a.clone()).ok_or_else(|| a.to_string())
    });
    eprintln!("recommendation from the engines' own /metrics: {recommended}");
    assert_eq!(prefill_instances(&ns).unwrap(), 1, "Recommend changes no count");
}

/// `GET http://addr/path` with curl; the body.
fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let o = Command::new("curl").args(["-sf", "--max-time", "5", &format!("http://{addr}{path}")]).output().map_err(|e| e.to_string())?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned()).ok_or_else(|| text(&o))
}

#[test]
fn the_planners_own_quantile_equals_prometheus_histogram_quantile_on_the_same_engine() {
    use pd_core::planner::{promql, scrape};
    let engines = start_engines();
    let (_prom, port, _dir) = start_prometheus("q", "q", &engines);
    let mut traffic = load(&engines, 3);
    std::thread::sleep(Duration::from_secs(5));
    traffic.stop();
    // Once the histograms stop moving, Prometheus' latest scrape and the planner's read of the
    // same exposition must give the same p90 (both over the counts since the engine started).
    let agreed = wait_for(Duration::from_secs(30), "the same p90 from Prometheus and from the planner's own read", || {
        let ours = scrape::parse(&http_get(&engines.decode_http, scrape::METRICS_PATH)?).map_err(|e| e.to_string())?;
        let mut pairs = Vec::new();
        for (metric, buckets) in [(promql::TTFT, &ours.ttft), (promql::ITL, &ours.itl)] {
            let query = format!("histogram_quantile({}, sum by (le) ({metric}_bucket{{role=\"decode\"}}))", promql::QUANTILE);
            let path =
                format!("/api/v1/query?query={}", query.replace('{', "%7B").replace('}', "%7D").replace('"', "%22").replace(' ', "%20"));
            let answer: Value = serde_json::from_str(&http_get(&format!("127.0.0.1:{port}"), &path)?).map_err(|e| e.to_string())?;
            let theirs = promql::value(&answer).map_err(|e| e.to_string())?;
            let mine = buckets.quantile(promql::QUANTILE);
            match (mine, theirs) {
                (Some(a), Some(b)) if (a - b).abs() <= 1e-9 * b.abs().max(1.0) && a > 0.0 => pairs.push((metric, a, b)),
                other => return Err(format!("{metric}: planner {:?}, Prometheus {:?}", other.0, other.1)),
            }
        }
        Ok(pairs)
    });
    eprintln!("p90 (planner, Prometheus): {agreed:?}");
}
