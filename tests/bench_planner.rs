//! `make bench-planner`: the planner against a fixed ratio, on kind (real kubelets, the chart's
//! operator, smg 1.13.0 in front), under the same open-loop load whose mix shifts from long
//! prompts (prefill's load) to long answers (decode's): `pd-sim bench --rate`. The stand-in
//! engines have a capacity per role: a prefill computes one prompt at a time at
//! `PREFILL_TOKENS_PER_S`, a decode's step is `ITL_MS` plus `ITL_MS_PER_RUNNING` per running
//! request. Per run: requests and failures as the client saw them, the windows meeting both SLOs,
//! and GPU-seconds (engine pods on the node, sampled every `SAMPLE`, one GPU each at tp 1).
//! Run by hack/kind-e2e.sh with `PD_KIND_SUITE=bench-planner` (a binary, not a test: figures,
//! not a verdict; it fails only when the run itself cannot be measured).
//!   PD_BENCH_RUNS=fixed|planner|both (default both), PD_BENCH_FIXED_UNITS (default 3),
//!   PD_BENCH_OUT=file (a JSON line per run appended).

use pd_testing as common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{TestNamespace, cluster, condition, text, wait_for};
use serde_json::{Value, json};

const MODEL: &str = "deepseek-ai/DeepSeek-V3";
const PREFILL_TOKENS_PER_S: u32 = 8000;
const ITL_MS: u32 = 10;
const ITL_MS_PER_RUNNING: u32 = 1;
/// The load: arrivals a second, seconds sent, the mix's shift from kind A to kind B.
const RATE: f64 = 6.0;
const SECONDS: u32 = 360;
const SHIFT: &str = "90:180";
const WINDOW_SECONDS: u32 = 15;
/// Windows left out of the attainment: the first minute, while the planner meets its first load.
const WARMUP_WINDOWS: usize = 4;
const SLO_TTFT_P90: f64 = 1.0;
const SLO_ITL_P90: f64 = 0.04;
const SAMPLE: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(300);

fn role_args() -> (String, String) {
    let common = "--enable-metrics";
    (
        format!("[{common}, --sim-prefill-tokens-per-s, '{PREFILL_TOKENS_PER_S}']"),
        format!("[{common}, --sim-itl-ms, '{ITL_MS}', --sim-itl-ms-per-running, '{ITL_MS_PER_RUNNING}']"),
    )
}

/// The PDDeployment of a run: a fixed count of 1:1 units, or the planner in `Auto` mode scraping
/// the engines itself (no Prometheus), each role 1–4.
fn manifest(planner: bool, units: u32) -> String {
    let (p, d) = role_args();
    let mut m = format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: bench}}\nspec:\n  engine: {{type: sim}}\n  \
         model: {{path: {MODEL}}}\n  kvTransfer: {{pageSize: 64}}\n  replicas: {units}\n  \
         prefill: {{replicas: 1, parallelism: {{tp: 1}}, template: {{extraArgs: {p}}}}}\n  \
         decode: {{replicas: 1, parallelism: {{tp: 1}}, template: {{extraArgs: {d}}}}}\n  \
         router: {{policy: round_robin}}\n  rollout: {{drainSeconds: 5}}\n"
    );
    if planner {
        m.push_str(&format!(
            "  scaling:\n    prefill: {{minReplicas: 1, maxReplicas: 4}}\n    decode: {{minReplicas: 1, maxReplicas: 4}}\n  \
             autoscaling:\n    mode: Auto\n    slo: {{ttftP90Seconds: {SLO_TTFT_P90}, itlP90Seconds: {SLO_ITL_P90}}}\n    \
             load: {{runningPerInstance: 16}}\n    intervalSeconds: 5\n    metricsWindowSeconds: {WINDOW_SECONDS}\n    \
             cooldownSeconds: 30\n    stabilizationWindowSeconds: 30\n"
        ));
    }
    m
}

fn is_ready(v: &Value) -> bool {
    condition(v, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Engine pods present (scheduled, not finished) in `ns` now, prefill and decode: each holds its
/// GPU (the router's pod holds none); and the decode pods Ready (serving through the router).
fn engine_pods(ns: &str) -> [u64; 3] {
    let selector = format!("{} in (prefill,decode)", pd_api::labels::LABEL_ROLE);
    let o = cluster().kubectl(&["get", "pods", "-n", ns, "-l", &selector, "-o", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let holds = |p: &&Value| p["spec"]["nodeName"].is_string() && !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    let role = |p: &&Value, r: &str| p["metadata"]["labels"][pd_api::labels::LABEL_ROLE] == r;
    let held: Vec<&Value> = items.iter().filter(holds).collect();
    let count = |f: &dyn Fn(&&Value) -> bool| held.iter().filter(|p| f(p)).count() as u64;
    [count(&|p| role(p, "prefill")), count(&|p| role(p, "decode")), count(&|p| role(p, "decode") && is_ready(p))]
}

/// GPU-seconds while `run` runs: engine pods sampled every `SAMPLE`; and the samples
/// (`prefill+decode`, with the Ready decodes after a `/`).
fn gpu_seconds_during<T>(ns: &str, run: impl FnOnce() -> T) -> (T, f64, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, name) = (stop.clone(), ns.to_owned());
    let sampler = std::thread::spawn(move || {
        let (mut total, mut counts, mut last) = (0.0, Vec::new(), Instant::now());
        while !flag.load(Ordering::Relaxed) {
            let [p, d, ready] = engine_pods(&name);
            std::thread::sleep(SAMPLE.saturating_sub(last.elapsed()));
            total += (p + d) as f64 * last.elapsed().as_secs_f64();
            last = Instant::now();
            counts.push(format!("{p}+{d}/{ready}"));
        }
        (total, counts)
    });
    let out = run();
    stop.store(true, Ordering::Relaxed);
    let (total, counts) = sampler.join().expect("the GPU sampler");
    (out, total, counts)
}

/// The PDDeployment's Events (the planner's decisions among them) and every Warning (a probe
/// failing, a container restarted), oldest first.
fn events(ns: &str) -> Vec<String> {
    let o = cluster().kubectl(&["get", "events", "-n", ns, "-o", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let shown = |e: &Value| e["involvedObject"]["kind"] == "PDDeployment" || e["type"] == "Warning";
    let mut items: Vec<Value> = v["items"].as_array().into_iter().flatten().filter(|e| shown(e)).cloned().collect();
    let at = |e: &Value| e["eventTime"].as_str().or(e["firstTimestamp"].as_str()).unwrap_or_default().to_owned();
    items.sort_by_key(at);
    items
        .iter()
        .map(|e| format!("{} {} {}: {}", at(e), e["reason"], e["action"], e["note"].as_str().or(e["message"].as_str()).unwrap_or_default()))
        .collect()
}

/// The open loop in a pod of its own against the router; its JSON line.
fn load(ns: &TestNamespace) -> Value {
    let image = std::env::var("PD_KIND_SIM_IMAGE").expect("PD_KIND_SIM_IMAGE: run through make bench-planner");
    let target = format!("bench-router:{}", pd_api::DEFAULT_ROUTER_PORT);
    let (rate, seconds, window) = (RATE.to_string(), SECONDS.to_string(), WINDOW_SECONDS.to_string());
    let cmd = ["pd-sim", "bench", "--target", &target, "--model", MODEL, "--rate", &rate, "--seconds", &seconds];
    let timeout = Duration::from_secs(u64::from(SECONDS)) + WAIT;
    ns.run_to_report("load", &image, &[&cmd[..], &["--window-seconds", &window, "--shift", SHIFT]].concat(), timeout)
}

/// Windows after the warm-up, and those meeting both SLOs (a window with a failure misses).
fn attainment(report: &Value) -> (usize, usize) {
    let windows = report["windows"].as_array().cloned().unwrap_or_default();
    let counted: Vec<&Value> = windows.iter().skip(WARMUP_WINDOWS).collect();
    let meets = |w: &&&Value| {
        w["failed"] == 0
            && w["ttft_p90_s"].as_f64().is_some_and(|t| t <= SLO_TTFT_P90)
            && w["itl_p90_s"].as_f64().is_some_and(|t| t <= SLO_ITL_P90)
    };
    (counted.len(), counted.iter().filter(meets).count())
}

fn one_run(planner: bool, units: u32) -> Value {
    let label = if planner { "planner".to_owned() } else { format!("fixed-{units}x1:1") };
    let ns = TestNamespace::new(if planner { "bench-planner" } else { "bench-fixed" });
    let o = ns.apply(&manifest(planner, if planner { 1 } else { units }));
    assert!(o.status.success(), "{}", text(&o));
    wait_for(WAIT, "the PDDeployment Ready and its router available", || {
        let v = ns.get_json("pdd", "bench")?;
        let router = ns.get_json("deployment", "bench-router")?;
        (is_ready(&v) && router["status"]["availableReplicas"] == 1).then_some(()).ok_or_else(|| v["status"].to_string())
    });
    let (report, gpu_seconds, counts) = gpu_seconds_during(&ns.name, || load(&ns));
    let (counted, met) = attainment(&report);
    let decisions = ns.get_json("pdd", "bench").map(|v| v["status"]["autoscaling"].clone()).unwrap_or_default();
    let windows: Vec<Value> = report["windows"].as_array().cloned().unwrap_or_default();
    let line = json!({
        "run": label, "requests": report["requests"], "failed": report["failed"], "errors": report["errors"],
        "windows_counted": counted, "windows_meeting_both_slos": met, "gpu_seconds": gpu_seconds.round(),
        "engine_pods_sampled": counts, "windows": windows, "planner_last": decisions,
    });
    eprintln!(
        "[bench-planner] {label}: {} requests, {} failed {}, {met}/{counted} windows meet both SLOs, {gpu_seconds:.0} GPU-seconds",
        report["requests"], report["failed"], report["errors"]
    );
    for w in &windows {
        eprintln!("  {w}");
    }
    eprintln!("  engine pods every {} s (prefill+decode/ready decodes): {}", SAMPLE.as_secs(), counts.join(" "));
    for e in events(&ns.name) {
        eprintln!("  {e}");
    }
    line
}

fn main() {
    let runs = std::env::var("PD_BENCH_RUNS").unwrap_or_else(|_| "both".into());
    let units: u32 = std::env::var("PD_BENCH_FIXED_UNITS").ok().and_then(|u| u.parse().ok()).unwrap_or(3);
    let plan: Vec<bool> = match runs.as_str() {
        "fixed" => vec![false],
        "planner" => vec![true],
        "both" => vec![false, true],
        other => panic!("PD_BENCH_RUNS must be fixed, planner or both, got {other:?}"),
    };
    let mut out = std::env::var("PD_BENCH_OUT")
        .ok()
        .map(|p| std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap_or_else(|e| panic!("PD_BENCH_OUT {p}: {e}")));
    for planner in plan {
        let line = one_run(planner, units);
        if let Some(f) = out.as_mut() {
            writeln!(f, "{line}").expect("write PD_BENCH_OUT");
        }
    }
}
