//! The kind tier: what only real nodes show. Run by `make e2e-kind` (hack/kind-e2e.sh), which
//! creates the cluster from the offline-built node image, loads our image, installs the CRD and
//! the chart, and sets `PD_E2E_KUBECONFIG` and `PD_KIND_OPERATOR_NAMESPACE`. Ignored under
//! `make test`, whose kwok nodes run no containers.

mod common;

use std::time::Duration;

use common::{PAGE_SIZE_32_VS_64, TestNamespace, cluster, condition, repo_path, text, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(180);

fn operator_namespace() -> String {
    std::env::var("PD_KIND_OPERATOR_NAMESPACE").expect("PD_KIND_OPERATOR_NAMESPACE: run through `make e2e-kind`")
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

fn sim_pdd(name: &str, prefill_args: &[&str]) -> String {
    let args = serde_json::to_string(prefill_args).unwrap();
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  engine: {{type: sim}}\n  model: {{path: deepseek-ai/DeepSeek-V3}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 4}}, template: {{extraArgs: {args}}}}}\n  decode: {{replicas: 2, parallelism: {{tp: 2}}}}\n"
    )
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
fn the_chart_brings_the_operator_pods_to_ready_on_real_nodes() {
    let ns = operator_namespace();
    let image = std::env::var("PD_KIND_OPERATOR_IMAGE").expect("PD_KIND_OPERATOR_IMAGE");
    let deployment = wait_for(WAIT, "the operator Deployment available", || {
        let o = cluster().kubectl(&["get", "deployment", "pd-operator", "-n", &ns, "-o", "json"]);
        let d: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
        let want = d["spec"]["replicas"].as_i64().unwrap_or(0);
        (want > 0 && d["status"]["availableReplicas"].as_i64() == Some(want)).then_some(d.clone()).ok_or_else(|| d["status"].to_string())
    });
    let running = pods(&ns, "app.kubernetes.io/name=pd-operator");
    assert_eq!(running.len() as i64, deployment["spec"]["replicas"].as_i64().unwrap());
    for p in &running {
        assert!(is_ready(p), "operator pod not Ready: {}", p["status"]);
        let c = &p["status"]["containerStatuses"][0];
        assert_eq!(c["image"].as_str().map(|i| i.trim_start_matches("docker.io/library/")), Some(image.as_str()));
        assert_eq!(c["restartCount"], 0, "operator container restarted: {c}");
    }
    // Leader election between the real replicas: the Lease names one of them.
    let holder = wait_for(WAIT, "a lease holder", || {
        let o = cluster().kubectl(&["get", "lease", "pd-operator", "-n", &ns, "-o", "jsonpath={.spec.holderIdentity}"]);
        let h = String::from_utf8_lossy(&o.stdout).into_owned();
        (!h.is_empty()).then_some(h).ok_or_else(|| text(&o))
    });
    let names: Vec<&str> = running.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    assert!(names.iter().any(|n| holder.contains(n)), "lease holder {holder} is none of {names:?}");
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
fn the_webhook_denies_the_qwen_dcp2_example_through_its_service() {
    let o = cluster().kubectl(&["get", "validatingwebhookconfiguration", "pd-operator", "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let cfg: Value = serde_json::from_slice(&o.stdout).unwrap();
    let client = &cfg["webhooks"][0]["clientConfig"];
    assert!(client["service"]["name"].is_string() && client["url"].is_null(), "webhook not routed through a Service: {client}");

    let ns = TestNamespace::new("kind-webhook");
    let o = ns.apply_file(&repo_path("examples/qwen-dcp2-mistake.yaml"));
    let out = text(&o);
    assert!(!o.status.success(), "the Qwen dcp: 2 example was admitted: {out}");
    assert!(out.contains("admission webhook \"validate.pd.inference.dev\" denied the request"), "{out}");
    assert!(out.contains("PD decode DCP requires an MLA or hybrid-MLA KV pool."), "{out}");
    assert!(out.contains("spec.decode.parallelism.dcp"), "{out}");
    let o = cluster().kubectl(&["get", "pdd", "-n", &ns.name, "-o", "name"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "", "a denied object was stored");
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
fn sim_deployment_completes_the_handshake_and_decode_pods_turn_ready() {
    let ns = TestNamespace::new("kind-sim");
    let name = "sim";
    let o = ns.apply(&sim_pdd(name, &[]));
    assert!(o.status.success(), "{}", text(&o));
    let v = wait_for(WAIT, "HandshakeReady=True, Ready=True, both decodes ready and status.rankMap", || {
        let v = ns.get_json("pdd", name)?;
        let hs = condition(&v, "HandshakeReady").ok_or_else(|| v["status"].to_string())?;
        let ready = condition(&v, "Ready").ok_or_else(|| v["status"].to_string())?;
        // Ready needs only enough decode instances (replicas - maxUnavailable): wait for both.
        let both = v["status"]["decode"]["readyReplicas"] == 2;
        (hs["status"] == "True" && ready["status"] == "True" && both && v["status"]["rankMap"].as_array().is_some_and(|m| m.len() == 2))
            .then_some(v.clone())
            .ok_or_else(|| v["status"].to_string())
    });
    assert_eq!(v["status"]["decode"]["readyReplicas"], 2);
    assert_eq!(v["status"]["prefill"]["readyReplicas"], 1);
    // MLA decode TP2 against prefill TP4: decode rank 0 reads prefill ranks 0 and 1, rank 1 reads 2 and 3.
    for (i, map) in v["status"]["rankMap"].as_array().unwrap().iter().enumerate() {
        assert_eq!(map["decodeInstance"], i as u64);
        assert_eq!(map["ranks"][0]["tpRanks"], json!([0, 1]));
        assert_eq!(map["ranks"][1]["tpRanks"], json!([2, 3]));
    }
    // Real containers: both decode pods Ready through the sidecar's gate, the sidecar running.
    let decode = pods(&ns.name, &format!("pd.inference.dev/deployment={name},pd.inference.dev/role=decode"));
    assert_eq!(decode.len(), 2, "decode pods: {decode:?}");
    for p in &decode {
        assert!(is_ready(p), "decode pod not Ready: {}", p["status"]);
        let gate = condition(p, "pd.inference.dev/handshake").expect("gate condition");
        assert_eq!(gate["status"], "True", "{gate}");
        let statuses = p["status"]["containerStatuses"].as_array().unwrap();
        assert!(statuses.iter().all(|c| c["ready"] == true && c["state"]["running"].is_object()), "{statuses:?}");
        // The sidecar is a native sidecar (restartable init container) and keeps running.
        let sidecar = p["status"]["initContainerStatuses"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == "handshake"));
        assert!(sidecar.is_some_and(|c| c["state"]["running"].is_object() && c["restartCount"] == 0), "{}", p["status"]);
        assert!(p["metadata"]["annotations"]["pd.inference.dev/rank-map"].is_string());
    }
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
fn a_page_size_mismatch_keeps_decode_pods_out_of_service_with_sglangs_message() {
    let ns = TestNamespace::new("kind-mismatch");
    let name = "mismatch";
    // The prefill stand-in advertises page_size 32 while both sides were launched with 64.
    let o = ns.apply(&sim_pdd(name, &["--sim-page-size", "32"]));
    assert!(o.status.success(), "{}", text(&o));
    common::wait_page_size_mismatch(&ns, name, WAIT);
    let v = ns.get_json("pdd", name).unwrap();
    assert!(v["status"]["rankMap"].is_null(), "a failed handshake published a rank map: {}", v["status"]["rankMap"]);
    // The sidecar (an init-phase sidecar container) may report before the engine starts, and may
    // first find the prefill's DNS name not yet published (PrefillUnreachable): wait until both
    // engines run and both gates carry the page-size failure; the gate alone holds the pods back.
    let mismatch = format!("RuntimeError: {PAGE_SIZE_32_VS_64}");
    let decode = wait_for(WAIT, "both decode engines running, both gates failing on the page size", || {
        let decode = pods(&ns.name, &format!("pd.inference.dev/deployment={name},pd.inference.dev/role=decode"));
        let settled = |p: &Value| {
            let engine_ready = p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["name"] == "engine" && c["ready"] == true));
            let gate = condition(p, "pd.inference.dev/handshake");
            engine_ready && gate.is_some_and(|g| g["status"] == "False" && g["message"].as_str().is_some_and(|m| m.contains(&mismatch)))
        };
        (decode.len() == 2 && decode.iter().all(settled)).then_some(decode.clone()).ok_or_else(|| format!("{decode:?}"))
    });
    for p in &decode {
        assert!(!is_ready(p), "decode pod Ready despite the mismatch: {}", p["status"]);
    }
    // With both engines ready, the controller must still count no decode instance as ready.
    let until = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < until {
        let v = ns.get_json("pdd", name).unwrap();
        assert_eq!(v["status"]["decode"]["readyReplicas"].as_i64().unwrap_or(0), 0, "{}", v["status"]);
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs `script` in the stranger pod's shell; its output (empty when nothing answered).
fn from_stranger(ns: &str, script: &str) -> String {
    let o = cluster().kubectl(&["exec", "-n", ns, "stranger", "--", "sh", "-c", script]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether `ip:port` answers an HTTP request from the stranger (the reply's status line).
fn http_from_stranger(ns: &str, ip: &str, port: u16, request: &str) -> Option<String> {
    let out = from_stranger(ns, &format!("printf '{request}' | nc -w 3 {ip} {port}"));
    out.lines().next().filter(|l| l.starts_with("HTTP/")).map(str::to_owned)
}

/// Whether a TCP connection from the stranger to `ip:port` succeeds.
fn connects_from_stranger(ns: &str, ip: &str, port: u16) -> bool {
    from_stranger(ns, &format!("nc -w 3 {ip} {port} </dev/null && echo connected")).contains("connected")
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
fn the_network_policy_keeps_other_pods_off_the_engines_while_the_pair_serves() {
    let ns = TestNamespace::new("kind-netpol");
    let name = "np";
    assert!(ns.apply(&sim_pdd(name, &[])).status.success());
    // The PDDeployment's own decodes pass the handshake and serve, under its NetworkPolicies.
    wait_for(WAIT, "both decodes ready through the handshake", || {
        let v = ns.get_json("pdd", name)?;
        let hs = condition(&v, "HandshakeReady").map(|c| c["status"].clone()).unwrap_or_default();
        (hs == "True" && v["status"]["decode"]["readyReplicas"] == 2).then_some(()).ok_or_else(|| v["status"].to_string())
    });
    assert!(ns.get_json("networkpolicy", &format!("{name}-engines")).is_ok());
    let probe = std::env::var("PD_KIND_PROBE_IMAGE").expect("PD_KIND_PROBE_IMAGE: run through `make e2e-kind`");
    let stranger = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranger"},
        "spec": {"terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": probe, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}});
    assert!(ns.apply(&stranger.to_string()).status.success());
    wait_for(WAIT, "the stranger pod running", || {
        let p = ns.get_json("pod", "stranger")?;
        (p["status"]["phase"] == "Running").then_some(()).ok_or_else(|| p["status"].to_string())
    });
    let prefill = pods(&ns.name, &format!("pd.inference.dev/deployment={name},pd.inference.dev/role=prefill")).remove(0);
    let (pod, ip) = (prefill["metadata"]["name"].as_str().unwrap().to_owned(), prefill["status"]["podIP"].as_str().unwrap().to_owned());
    let logs = text(&cluster().kubectl(&["logs", "-n", &ns.name, &pod, "-c", "engine"]));
    let rank_port: u16 = logs
        .lines()
        .find(|l| l.contains("rank serves KV"))
        .and_then(|l| l.split("port=").nth(1))
        .and_then(|p| p.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no rank port in the prefill's log:\n{logs}"));
    let register = r#"PUT /route HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"#;
    let health = r#"GET /health HTTP/1.0\r\n\r\n"#;
    // Policy on: the bootstrap server, a rank port and the HTTP port are closed to other pods.
    assert_eq!(http_from_stranger(&ns.name, &ip, 8998, register), None, "the stranger reached PUT /route");
    assert!(!connects_from_stranger(&ns.name, &ip, rank_port), "the stranger reached rank port {rank_port}");
    assert_eq!(http_from_stranger(&ns.name, &ip, 30000, health), None, "the stranger reached the engine's HTTP port");
    // Policy off: the same requests get through (which is why it is on by default).
    let off = r#"{"spec":{"networkPolicy":{"enabled":false}}}"#;
    assert!(cluster().kubectl(&["patch", "pdd", name, "-n", &ns.name, "--type=merge", "-p", off]).status.success());
    wait_for(WAIT, "the bootstrap server to answer the stranger", || {
        http_from_stranger(&ns.name, &ip, 8998, register).ok_or_else(|| "no answer yet".to_owned())
    });
    assert!(connects_from_stranger(&ns.name, &ip, rank_port), "rank port {rank_port} still closed without the policy");
}
