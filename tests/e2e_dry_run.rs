//! The engine dry run, the gate before GPUs (docs/dry-run.md), against a real control plane with
//! kwok nodes. kwok runs no containers: the tier's stage `pd-dry-run-modelled`
//! (hack/kwok/pod-stages.yaml) ends each dry-run pod with the shim's verdict, the one a test seeds
//! in the roles' template annotation `kwok.pd.inference.dev/dry-run-verdict` or a passing one, as
//! it plays the handshake sidecar. The shim itself is tested on every release's wheel by
//! tests/parity/dry_run_shim.py.

use pd_testing as common;

use std::time::Duration;

use common::{ControllerProcess, TestNamespace, cluster, text, wait_for};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);
const REFUSAL: &str = "unrecognized arguments: --speculative-algorithm-typo EAGLE";

fn spec(extra: &str, seeded: Option<&str>) -> String {
    let annotations = seeded.map_or(String::new(), |v| format!(", annotations: {{kwok.pd.inference.dev/dry-run-verdict: '{v}'}}"));
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: gate}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 2}}, template: {{extraArgs: [{extra}]{annotations}}}}}\n  decode: {{replicas: 1, parallelism: {{tp: 2}}}}\n  router: {{enabled: false}}\n"
    )
}

/// The verdict the shim writes when SGLang's parser refuses the prefill's argv.
fn refused_verdict() -> String {
    serde_json::json!({"v": 1, "ok": false, "sglang": "0.5.23", "processes": [
        {"role": "prefill", "node": 0, "profile": "H100", "ok": false, "stage": "parse", "error_type": "SystemExit", "error": REFUSAL},
        {"role": "decode", "node": 0, "profile": "H100", "ok": true, "stage": "done"},
    ]})
    .to_string()
}

const HANDSHAKE_REFUSAL: &str = "PD decode DCP requires an MLA or hybrid-MLA KV pool.";

/// The verdict the shim writes when both roles start and SGLang's decode refuses the prefill's
/// topology at the handshake.
fn handshake_refused_verdict() -> String {
    serde_json::json!({"v": 1, "ok": false, "sglang": "0.5.23", "processes": [
        {"role": "prefill", "node": 0, "profile": "H100", "ok": true, "stage": "done"},
        {"role": "decode", "node": 0, "profile": "H100", "ok": true, "stage": "done"},
    ], "handshake": {"ok": false, "ran": true, "stage": "decode_handshake", "error_type": "RuntimeError",
        "error": HANDSHAKE_REFUSAL, "prefill_profile": "H100", "decode_profile": "H100"}})
    .to_string()
}

fn engine_pods(ns: &TestNamespace) -> usize {
    ns.role_pods("gate", "prefill,decode").len()
}

fn verified(ns: &TestNamespace) -> Result<Value, String> {
    let v = ns.get_json("pdd", "gate")?;
    common::condition(&v, "EngineVerified").ok_or_else(|| v["status"].to_string())
}

fn events(ns: &TestNamespace) -> String {
    let o =
        cluster().kubectl(&["get", "events", "-n", &ns.name, "-o", "jsonpath={range .items[*]}{.reason}: {.note}{.message}{\"\\n\"}{end}"]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Waits for `EngineVerified` to turn `status`, checking on every look that no engine pod exists
/// while a dry-run pod has not ended (the pass that reads a passing verdict creates the pods
/// before it writes the status, so pods may be seen a moment before the condition).
fn wait_verdict_with_no_engine_pod(ns: &TestNamespace, status: &str) -> Value {
    wait_for(WAIT, &format!("EngineVerified={status}, no engine pod before"), || {
        let engines = engine_pods(ns);
        let running: Vec<Value> = ns.role_pods("gate", "dry-run").into_iter().filter(|p| p["status"]["phase"] != "Succeeded").collect();
        if engines > 0 && !running.is_empty() {
            panic!("{engines} engine pods beside a dry run under way: {running:?}\nevents:\n{}", events(ns));
        }
        let c = verified(ns)?;
        if c["status"] == status {
            return Ok(c);
        }
        Err(c.to_string())
    })
}

#[test]
fn a_refused_spec_creates_no_engine_pod_and_a_passing_one_does_once_without_rerunning_on_scale() {
    let ns = TestNamespace::new("dry-run");
    let _ctl = ControllerProcess::start(&ns.name);
    // SGLang (as the tier's stage plays it) refuses the prefill's argv.
    assert!(ns.apply(&spec("--log-level, info", Some(&refused_verdict()))).status.success());
    let c = wait_verdict_with_no_engine_pod(&ns, "False");
    assert_eq!(c["reason"], "EngineRefused", "{c}");
    let message = c["message"].as_str().unwrap();
    assert!(message.contains(&format!("prefill node 0 on H100: SGLang refused it at parse: SystemExit: {REFUSAL}")), "{message}");
    wait_for(WAIT, "the EngineRefused Event with SGLang's text", || {
        let e = events(&ns);
        e.lines().any(|l| l.starts_with("EngineRefused:") && l.contains(REFUSAL)).then_some(()).ok_or(e)
    });
    wait_for(WAIT, "the dry-run pod to go", || {
        let left = ns.role_pods("gate", "dry-run");
        left.is_empty().then_some(()).ok_or_else(|| format!("{} left", left.len()))
    });
    let status = ns.get_json("pdd", "gate").unwrap()["status"].clone();
    let progressing = common::condition(&status_object(&status), "Progressing").unwrap();
    assert_eq!(progressing["reason"], "EngineRefused", "{progressing}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(engine_pods(&ns), 0, "a refusal stands: no engine pod");

    // Both roles start, and SGLang's handshake between them refuses: still no engine pod.
    assert!(ns.apply(&spec("--log-level, debug", Some(&handshake_refused_verdict()))).status.success());
    let c = wait_for(WAIT, "EngineVerified=False with the handshake's text", || {
        let c = verified(&ns)?;
        let m = c["message"].as_str().unwrap_or_default();
        (c["status"] == "False" && m.contains(HANDSHAKE_REFUSAL)).then_some(c.clone()).ok_or_else(|| c.to_string())
    });
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "the handshake of decode node 0 on H100 with prefill node 0 on H100: SGLang refused it at decode_handshake: RuntimeError: {HANDSHAKE_REFUSAL}"
        )),
        "{message}"
    );
    assert_eq!(engine_pods(&ns), 0, "a handshake refusal creates no engine pod");

    // A spec SGLang accepts: the dry run runs again (a new key), passes, and only then pods come.
    assert!(ns.apply(&spec("--log-level, warning", None)).status.success());
    let c = wait_verdict_with_no_engine_pod(&ns, "True");
    assert_eq!(c["reason"], "Verified", "{c}");
    let verdict_at = c["lastTransitionTime"].as_str().unwrap().to_owned();
    wait_for(WAIT, "the engine pods", || {
        let ps = ns.role_pods("gate", "prefill,decode");
        if ps.len() == 2 { Ok(ps) } else { Err(format!("{} pods", ps.len())) }
    })
    .iter()
    .for_each(|p| {
        let created = p["metadata"]["creationTimestamp"].as_str().unwrap();
        assert!(created >= verdict_at.as_str(), "{} created at {created}, before the verdict at {verdict_at}", p["metadata"]["name"]);
    });
    let key = ns.get_json("pdd", "gate").unwrap()["status"]["engineVerification"]["key"].clone();
    assert!(key.is_string(), "the verdict's key is in status");

    // A scale is the same processes: no dry run, the new instance comes at once.
    // Dry runs by the scheduler's Events (ours for one reason are folded into one series).
    let runs = |e: &str| e.lines().filter(|l| l.starts_with("Scheduled:") && l.contains("/gate-dry-run-")).count();
    let before = runs(&events(&ns));
    assert_eq!(before, 3, "one dry run per spec: {}", events(&ns));
    assert!(cluster().kubectl(&["scale", "pdd", "gate", "-n", &ns.name, "--replicas", "2"]).status.success());
    wait_for(WAIT, "four engine pods", || {
        let n = engine_pods(&ns);
        (n == 4).then_some(()).ok_or_else(|| format!("{n} pods"))
    });
    assert_eq!(runs(&events(&ns)), before, "a scale ran the dry run again");
    assert!(ns.role_pods("gate", "dry-run").is_empty());
    let status = ns.get_json("pdd", "gate").unwrap()["status"].clone();
    assert_eq!(status["engineVerification"]["key"], key);
    assert_eq!(status["engineVerification"]["result"], "Verified");
}

/// `common::condition` reads an object's status; a bare status wrapped as one.
fn status_object(status: &Value) -> Value {
    serde_json::json!({"status": status})
}

#[test]
fn dry_run_off_creates_the_engine_pods_at_once_and_says_it_skipped() {
    let ns = TestNamespace::new("dry-run-off");
    let _ctl = ControllerProcess::start(&ns.name);
    // Quoted: YAML 1.1 (kubectl's) reads a bare Off as false.
    let off = spec("--log-level, info", Some(&refused_verdict())).replace("spec:\n", "spec:\n  engine: {dryRun: 'Off'}\n");
    let o = ns.apply(&off);
    assert!(o.status.success(), "{}", text(&o));
    wait_for(WAIT, "the engine pods", || {
        let n = engine_pods(&ns);
        (n == 2).then_some(()).ok_or_else(|| format!("{n} pods"))
    });
    let c = wait_for(WAIT, "EngineVerified", || verified(&ns));
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("Unknown"), Some("Skipped")), "{c}");
    assert!(!events(&ns).lines().any(|l| l.starts_with("Scheduled:") && l.contains("/gate-dry-run-")), "a dry run ran: {}", events(&ns));
}
