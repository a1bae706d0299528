//! The handshake end to end on the real control plane: the controller renders a decode pod with
//! the sidecar's readiness gate; the sidecar runs as a host process (kwok plays the containers)
//! under the decode pod's own ServiceAccount token, against a stand-in prefill.

use pd_testing as common;

use std::time::Duration;

use common::{
    Background, ControllerProcess, PAGE_SIZE_32_VS_64, TestNamespace, cluster, condition, free_port, text, token_kubeconfig, wait_for,
};

const WAIT: Duration = Duration::from_secs(90);

fn sim_pdd(name: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  engine: {{type: sim}}\n  model: {{path: deepseek-ai/DeepSeek-V3}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 4}}}}\n  decode: {{replicas: 1, parallelism: {{tp: 2}}}}\n  router: {{enabled: false}}\n"
    )
}

fn start_prefill(bootstrap: u16, extra: &[&str]) -> Background {
    let b = bootstrap.to_string();
    let http = free_port().to_string();
    let mut args = vec!["prefill", "--tp-size", "4", "--page-size", "64", "--host", "127.0.0.1"];
    args.extend(["--disaggregation-bootstrap-port", &b, "--port", &http]);
    args.extend(extra);
    let p = Background::sim("e2e-prefill", &args);
    p.wait_port(bootstrap);
    p
}

/// The sidecar's token may patch its own PDDeployment's decode pods' status, nothing else.
fn sidecar_token_is_confined(ns: &TestNamespace, name: &str, kubeconfig: &std::path::Path) {
    let as_sidecar = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
        all.extend(args);
        cluster().kubectl(&all)
    };
    let o = as_sidecar(&[
        "patch",
        "pod",
        &format!("{name}-prefill-0-0"),
        "-n",
        &ns.name,
        "--subresource=status",
        "--type=merge",
        "-p",
        "{\"metadata\":{\"annotations\":{\"x\":\"y\"}}}",
    ]);
    assert!(!o.status.success() && text(&o).contains("forbidden"), "{}", text(&o));
    let o = as_sidecar(&["get", "pods", "-n", &ns.name]);
    assert!(!o.status.success() && text(&o).contains("forbidden"), "{}", text(&o));
}

/// A sidecar restarted beside a serving decode (a crash, or a new operator image) while its
/// prefill is briefly away: the gate it inherits stays True, with its transition time, through
/// the undecided first check and after the new pass.
fn a_restarted_sidecar_keeps_the_serving_decode_ready(
    ns: &TestNamespace,
    decode_pod: &str,
    old_sidecar: &mut Background,
    prefill: &mut Background,
    new_sidecar: impl Fn() -> Background,
    new_prefill: impl Fn() -> Background,
) {
    let gate = || condition(&ns.get_json("pod", decode_pod).unwrap(), "pd.inference.dev/handshake").unwrap();
    let before = gate();
    assert_eq!(before["status"], "True");
    old_sidecar.stop();
    prefill.stop();
    let sidecar = new_sidecar();
    // The new sidecar's first check waits out a refused connection; sample the gate meanwhile.
    for _ in 0..16 {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(gate(), before, "a restarted sidecar must not take a serving decode out of service while it checks");
    }
    assert!(sidecar.log_text().contains("kept while the first check runs"), "{}", sidecar.log_text());
    let _prefill = new_prefill();
    wait_for(WAIT, "the restarted sidecar's own pass", || {
        let log = sidecar.log_text();
        log.contains("reported the handshake to the pod").then_some(()).ok_or(log)
    });
    let after = gate();
    assert_eq!(after["status"], "True");
    assert_eq!(after["lastTransitionTime"], before["lastTransitionTime"], "the gate never changed, so neither did its transition time");
    assert_eq!(condition(&ns.get_json("pod", decode_pod).unwrap(), "Ready").unwrap()["status"], "True");
}

/// `kubectl pd explain`, found by kubectl's own plugin lookup, names the pod with SGLang's text;
/// the rank map is not there yet.
fn plugin_explains_the_mismatch(ns: &TestNamespace, name: &str, pod_line: &str) {
    let explain = text(&cluster().kubectl_pd(&["explain", name, "-n", &ns.name]));
    assert!(explain.contains("is not Ready") && explain.contains("HandshakeReady=False"), "{explain}");
    assert!(explain.contains(pod_line), "{explain}");
    let rankmap = text(&cluster().kubectl_pd(&["rankmap", name, "-n", &ns.name]));
    assert!(rankmap.contains("no rank map yet"), "{rankmap}");
}

/// `kubectl pd rankmap` draws the map (the table row and the matrix row of decode rank 1),
/// `status` shows the decode pod's passed handshake, and a wrong name exits 2.
fn plugin_draws_the_rank_map(ns: &TestNamespace, name: &str, decode_pod: &str) {
    let o = cluster().kubectl_pd(&["rankmap", name, "-n", &ns.name]);
    assert!(o.status.success(), "{}", text(&o));
    let rankmap = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(rankmap.contains("decode (attention TP 2, PP 1, DCP 1) reads from prefill (attention TP 4, PP 1, CP 1)"), "{rankmap}");
    let words: Vec<String> = rankmap.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    assert!(words.iter().any(|l| l == "1 0 2,3 0 0 1 1"), "{rankmap}");
    assert!(words.iter().any(|l| l == "rank 1 pp 0 . . # #"), "{rankmap}");
    let status = text(&cluster().kubectl_pd(&["status", name, "-n", &ns.name]));
    assert!(status.contains(&format!("PDDeployment {}/{name}", ns.name)) && status.contains("HandshakeReady"), "{status}");
    assert!(status.lines().any(|l| l.starts_with(decode_pod) && l.ends_with("passed")), "{status}");
    let missing = cluster().kubectl_pd(&["status", "no-such-pdd", "-n", &ns.name]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(text(&missing).contains("pddeployment \"no-such-pdd\" not found"), "{}", text(&missing));
}

#[test]
fn decode_stays_unready_on_a_page_size_mismatch_and_turns_ready_once_the_prefill_matches() {
    let ns = TestNamespace::new("handshake");
    let _ctl = ControllerProcess::start(&ns.name);
    let name = "hs";
    let o = ns.apply(&sim_pdd(name));
    assert!(o.status.success(), "{}", text(&o));
    let decode_pod = format!("{name}-decode-0-0");
    wait_for(WAIT, "the decode pod running under kwok", || {
        let p = ns.get_json("pod", &decode_pod)?;
        (p["status"]["phase"] == "Running").then_some(()).ok_or_else(|| p["status"].to_string())
    });

    // The sidecar reads what the controller rendered into the handshake ConfigMap.
    let cm = ns.get_json("configmap", &format!("{name}-handshake")).unwrap();
    let decode_json = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(decode_json.path(), cm["data"]["decode.json"].as_str().unwrap()).unwrap();
    let bootstrap = free_port();
    let mut prefill = start_prefill(bootstrap, &["--sim-page-size", "32"]);
    let kubeconfig = token_kubeconfig(&ns.name, &format!("{name}-decode"));
    let pod_ref = format!("{}/{decode_pod}", ns.name);
    let addr = format!("127.0.0.1:{bootstrap}");
    let sidecar = || {
        common::Background::spawn(
            "e2e-sidecar",
            std::process::Command::new(env!("CARGO_BIN_EXE_pd-operator"))
                .args(["handshake", "run", "--decode", decode_json.path().to_str().unwrap(), "--prefill", &addr, "--pod", &pod_ref])
                .env("KUBECONFIG", &kubeconfig),
        )
    };
    let mut first_sidecar = sidecar();

    common::wait_page_size_mismatch(&ns, name, WAIT);
    let pod = ns.get_json("pod", &decode_pod).unwrap();
    let gate = condition(&pod, "pd.inference.dev/handshake").unwrap();
    assert_eq!(gate["status"], "False");
    assert_eq!(gate["message"], format!("prefill {addr}: RuntimeError: {PAGE_SIZE_32_VS_64}"));
    assert_eq!(condition(&pod, "Ready").unwrap()["status"], "False", "a failed handshake must keep the decode pod out of service");
    assert!(ns.get_json("pdd", name).unwrap()["status"]["rankMap"].is_null());
    plugin_explains_the_mismatch(
        &ns,
        name,
        &format!("{decode_pod}  handshake failed (PageSizeMismatch): prefill {addr}: RuntimeError: {PAGE_SIZE_32_VS_64}"),
    );

    sidecar_token_is_confined(&ns, name, &kubeconfig);

    // Fix the prefill: the sidecar re-checks, the gate turns True, the pod Ready, the map appears.
    prefill.stop();
    let mut prefill = start_prefill(bootstrap, &[]);
    wait_for(WAIT, "HandshakeReady=True and status.rankMap", || {
        let v = ns.get_json("pdd", name)?;
        let c = condition(&v, "HandshakeReady").ok_or_else(|| v["status"].to_string())?;
        (c["status"] == "True" && v["status"]["rankMap"].is_array()).then_some(v.clone()).ok_or_else(|| v["status"].to_string())
    });
    let v = ns.get_json("pdd", name).unwrap();
    let map = &v["status"]["rankMap"][0];
    assert_eq!(map["decodeInstance"], 0);
    // MLA decode TP2 against prefill TP4: rank 0 reads prefill ranks 0 and 1, rank 1 reads 2 and 3.
    assert_eq!(map["ranks"][0]["tpRanks"], serde_json::json!([0, 1]));
    assert_eq!(map["ranks"][1]["tpRanks"], serde_json::json!([2, 3]));
    assert_eq!(map["ranks"][1]["requiredPrefillResponseNum"], 1);
    wait_for(WAIT, "the decode pod Ready", || {
        let p = ns.get_json("pod", &decode_pod)?;
        let ready = condition(&p, "Ready").ok_or_else(|| p["status"].to_string())?;
        (ready["status"] == "True").then_some(()).ok_or_else(|| ready.to_string())
    });
    plugin_draws_the_rank_map(&ns, name, &decode_pod);
    a_restarted_sidecar_keeps_the_serving_decode_ready(&ns, &decode_pod, &mut first_sidecar, &mut prefill, sidecar, || {
        start_prefill(bootstrap, &[])
    });
    let o = cluster().kubectl(&["get", "events.events.k8s.io", "-n", &ns.name, "-o", "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}"]);
    let reasons = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(reasons.contains("PageSizeMismatch") && reasons.contains("HandshakeSucceeded"), "events: {reasons}");
}
