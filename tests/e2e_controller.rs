//! The controller against a real control plane, as a host process per test.

use pd_testing as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Background, ControllerProcess, TestNamespace, cluster, repo_path, text, wait_for};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

fn names(ns: &TestNamespace, kind: &str, selector: &str) -> Result<BTreeSet<String>, String> {
    let o =
        cluster().kubectl(&["get", kind, "-n", &ns.name, "-l", selector, "-o", "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}"]);
    if !o.status.success() {
        return Err(text(&o));
    }
    Ok(String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect())
}

fn pods(ns: &TestNamespace, pdd: &str) -> Result<Vec<Value>, String> {
    let o = cluster().kubectl(&[
        "get",
        "pods",
        "-n",
        &ns.name,
        "-l",
        &format!("pd.inference.dev/deployment={pdd},pd.inference.dev/role in (prefill,decode)"),
        "-o",
        "json",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

fn uids(ns: &TestNamespace, pdd: &str) -> BTreeMap<String, String> {
    pods(ns, pdd)
        .unwrap()
        .iter()
        .map(|p| (p["metadata"]["name"].as_str().unwrap().to_owned(), p["metadata"]["uid"].as_str().unwrap().to_owned()))
        .collect()
}

/// Waits until `pdd` has `n` engine pods, every one running.
fn wait_running(ns: &TestNamespace, pdd: &str, n: usize) {
    wait_for(WAIT, &format!("{n} running pods"), || {
        let ps = pods(ns, pdd)?;
        (ps.len() == n && ps.iter().all(running)).then_some(()).ok_or_else(|| format!("{} pods", ps.len()))
    });
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
}

fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn condition(ns: &TestNamespace, pdd: &str, type_: &str) -> Result<(String, String, String), String> {
    let v = ns.get_json("pdd", pdd)?;
    let c = v["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .ok_or_else(|| v["status"].to_string())?;
    Ok((
        c["status"].as_str().unwrap_or_default().into(),
        c["reason"].as_str().unwrap_or_default().into(),
        c["message"].as_str().unwrap_or_default().into(),
    ))
}

fn wait_condition(ns: &TestNamespace, pdd: &str, type_: &str, status: &str) {
    wait_for(WAIT, &format!("{pdd} condition {type_}={status}"), || {
        let c = condition(ns, pdd, type_)?;
        (c.0 == status)
            .then_some(())
            .ok_or_else(|| format!("{c:?}\n{}", ns.get_json("pdd", pdd).map(|v| v["status"].to_string()).unwrap_or_default()))
    });
}

/// Names of each kind `pd-operator render` prints for an example.
fn rendered(example: &str, ns: &str) -> BTreeMap<String, BTreeSet<String>> {
    common::rendered_names(&repo_path(example), ns)
}

#[test]
fn deepseek_example_creates_exactly_what_render_prints_and_reports_availability() {
    let ns = TestNamespace::new("create");
    let _ctl = ControllerProcess::start(&ns.name);
    let want = rendered("examples/deepseek-v3-dcp.yaml", &ns.name);
    assert!(ns.apply_file(&repo_path("examples/deepseek-v3-dcp.yaml")).status.success());
    let sel = "app.kubernetes.io/managed-by=pd-operator,pd.inference.dev/deployment=dsv3";
    wait_for(WAIT, "the rendered objects to exist", || {
        // Every kind of the one list (PodGroups need the gang API, which `render` does not assume).
        let mut got = BTreeMap::new();
        for k in pd_core::children::KINDS.iter().filter(|k| !k.gated) {
            let of_kind = names(&ns, k.plural, sel)?;
            if !of_kind.is_empty() {
                got.insert(k.kind.to_owned(), of_kind);
            }
        }
        got.insert("Pod".to_owned(), names(&ns, "pods", &format!("{sel},pd.inference.dev/role in (prefill,decode)"))?);
        (got == want).then_some(()).ok_or_else(|| format!("want {want:?}\n got {got:?}"))
    });
    // The engine argv in the cluster is the argv render printed.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pd-operator"))
        .args(["render", "-f", repo_path("examples/deepseek-v3-dcp.yaml").to_str().unwrap(), "-n", &ns.name])
        .output()
        .unwrap();
    let rendered_text = String::from_utf8_lossy(&o.stdout);
    for p in pods(&ns, "dsv3").unwrap() {
        let args = p["spec"]["containers"][0]["args"].as_array().unwrap();
        assert!(args.windows(2).any(|w| w[0] == "--dcp-size") || p["metadata"]["labels"]["pd.inference.dev/role"] == "prefill");
        assert!(rendered_text.contains(&format!("name: {}", p["metadata"]["name"].as_str().unwrap())));
    }
    wait_for(WAIT, "every engine pod to run on a kwok GPU node", || {
        let ps = pods(&ns, "dsv3")?;
        let ok = ps.len() == 3 && ps.iter().all(|p| running(p) && p["spec"]["nodeName"].as_str().unwrap_or("").starts_with("kwok-gpu-"));
        ok.then_some(()).ok_or_else(|| {
            format!("{:?}", ps.iter().map(|p| (&p["metadata"]["name"], &p["status"]["phase"], &p["spec"]["nodeName"])).collect::<Vec<_>>())
        })
    });
    wait_condition(&ns, "dsv3", "PrefillAvailable", "True");
    wait_condition(&ns, "dsv3", "DecodeAvailable", "True");
    let status = ns.get_json("pdd", "dsv3").unwrap()["status"].clone();
    assert_eq!(status["prefill"]["readyReplicas"], 1);
    assert_eq!(status["decode"]["readyReplicas"], 2);
    assert_eq!(status["decode"]["ready"], "2/2");
    assert_eq!(status["endpoints"]["prefill"][0]["bootstrap"], format!("dsv3-prefill-0-0.dsv3-engines.{}.svc:8998", ns.name));
    // The page size both roles run with (the example's 64, kept by the Hopper MLA backends).
    assert_eq!(status["pageSize"], 64);
    // The decode pods served only once their gate passed: here the kwok tier's stage plays the
    // sidecar (hack/kwok/pod-stages.yaml), and the pods turned Ready through the gate.
    for p in pods(&ns, "dsv3").unwrap().iter().filter(|p| p["metadata"]["labels"]["pd.inference.dev/role"] == "decode") {
        let gate = p["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "pd.inference.dev/handshake").cloned();
        assert_eq!(gate.map(|c| c["status"].clone()), Some(Value::from("True")), "{}", p["status"]);
    }
    wait_condition(&ns, "dsv3", "HandshakeReady", "True");
    wait_condition(&ns, "dsv3", "Ready", "True");
}

#[test]
fn losing_one_pod_recreates_the_whole_multi_node_instance() {
    let ns = TestNamespace::new("recreate");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply_file(&repo_path("examples/multi-node-prefill.yaml")).status.success());
    wait_running(&ns, "r1", 3);
    let before = uids(&ns, "r1");
    assert!(cluster().kubectl(&["delete", "pod", "r1-prefill-0-1", "-n", &ns.name, "--wait=false"]).status.success());
    wait_for(WAIT, "both pods of prefill instance 0 to be replaced and running", || {
        let ps = pods(&ns, "r1")?;
        let now: BTreeMap<String, String> = ps
            .iter()
            .map(|p| (p["metadata"]["name"].as_str().unwrap().to_owned(), p["metadata"]["uid"].as_str().unwrap().to_owned()))
            .collect();
        let replaced = ["r1-prefill-0-0", "r1-prefill-0-1"].iter().all(|n| now.get(*n).is_some_and(|u| Some(u) != before.get(*n)));
        let decode_kept = now.get("r1-decode-0-0") == before.get("r1-decode-0-0");
        (replaced && decode_kept && ps.len() == 3 && ps.iter().all(running))
            .then_some(())
            .ok_or_else(|| format!("before {before:?}\nnow {now:?}"))
    });
    let o =
        cluster().kubectl(&["get", "events", "-n", &ns.name, "-o", "jsonpath={range .items[*]}{.reason}: {.note}{.message}{\"\\n\"}{end}"]);
    let events = String::from_utf8_lossy(&o.stdout);
    assert!(events.contains("InstanceRecreated: pod r1-prefill-0-1 disappeared"), "{events}");
}

/// Two prefill and one decode instance of two pods each (tp 2, one GPU a pod).
const TWO_NODE: &str = "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: restart}\nspec:\n  model: {path: Qwen/Qwen3-8B}\n  kvTransfer: {pageSize: 64}\n  router: {enabled: false}\n  prefill: {replicas: 2, gpusPerNode: 1, parallelism: {tp: 2}}\n  decode: {replicas: 1, gpusPerNode: 1, parallelism: {tp: 2}}\n";

/// Raises, in `pod`'s status (the status subresource, as a kubelet would), the restart count
/// of its container `name` (an init container when `init`) to `count`.
fn restart_in_place(ns: &TestNamespace, pod: &str, name: &str, init: bool, count: i64) {
    let field = if init { "initContainerStatuses" } else { "containerStatuses" };
    let statuses = ns.get_json("pod", pod).unwrap()["status"][field].clone();
    let i = statuses.as_array().and_then(|s| s.iter().position(|c| c["name"] == name)).unwrap_or_else(|| panic!("{pod}: {statuses}"));
    let patch = serde_json::json!([
        {"op": "replace", "path": format!("/status/{field}/{i}/restartCount"), "value": count},
        {"op": "add", "path": format!("/status/{field}/{i}/lastState"), "value": {"terminated": {"exitCode": 137, "reason": "Error"}}},
    ]);
    let o = cluster().kubectl(&["patch", "pod", pod, "-n", &ns.name, "--subresource=status", "--type=json", "-p", &patch.to_string()]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn an_engine_restart_in_a_multi_node_instance_recreates_that_instance_whole() {
    let ns = TestNamespace::new("restart");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply(TWO_NODE).status.success());
    wait_running(&ns, "restart", 6);
    let before = uids(&ns, "restart");
    // The decode's handshake sidecar restarts harmlessly; prefill 0's engine on node 1 restarted
    // in place while the pod stays Running: its rank can no longer join its group.
    restart_in_place(&ns, "restart-decode-0-1", "handshake", true, 3);
    restart_in_place(&ns, "restart-prefill-0-1", "engine", false, 1);
    let after = wait_replaced(&ns, "restart", &before, &["restart-prefill-0-0", "restart-prefill-0-1"], 6);
    let told = events(&ns);
    let cause = "pod restart-prefill-0-1: container engine restarted (restartCount 1, last exit code 137 (Error))";
    assert!(
        told.contains(&format!("InstanceRecreated: {cause}: recreating prefill instance 0 whole (recreation 1 of 5 in 600s)")),
        "{told}"
    );
    assert_eq!(told.matches("InstanceRecreated").count(), 1, "{told}");
    // The count the budget reads back on the next pass, and on the next controller's.
    let status = ns.get_json("pdd", "restart").unwrap()["status"].clone();
    let recoveries = status["recoveries"].as_array().cloned().unwrap_or_default();
    assert_eq!(recoveries.len(), 1, "{status}");
    let r = &recoveries[0];
    assert_eq!((r["role"].as_str(), r["instance"].as_u64(), r["count"].as_u64()), (Some("prefill"), Some(0), Some(1)), "{r}");
    assert_eq!(r["lastCause"], cause, "{r}");
    // The new pods start at restartCount 0: nothing more happens.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(uids(&ns, "restart"), after);
    assert_eq!(events(&ns).matches("InstanceRecreated").count(), 1);
}

/// Waits until the pods named `replaced` run anew (new uids), every other pod of `before` is
/// kept (failing at once if one is replaced) and `total` pods run; returns their uids.
fn wait_replaced(
    ns: &TestNamespace,
    pdd: &str,
    before: &BTreeMap<String, String>,
    replaced: &[&str],
    total: usize,
) -> BTreeMap<String, String> {
    wait_for(WAIT, &format!("{replaced:?} replaced and running, the other pods kept"), || {
        let ps = pods(ns, pdd)?;
        let uid = |p: &Value| Some((p["metadata"]["name"].as_str()?.to_owned(), p["metadata"]["uid"].as_str()?.to_owned()));
        let now: BTreeMap<String, String> = ps.iter().filter_map(uid).collect();
        let new = replaced.iter().all(|n| now.get(*n).is_some_and(|u| Some(u) != before.get(*n)));
        let kept = before.iter().filter(|(n, _)| !replaced.contains(&n.as_str())).all(|(n, u)| now.get(n) == Some(u));
        assert!(kept, "another instance was replaced:\nbefore {before:?}\nnow {now:?}");
        (new && ps.len() == total && ps.iter().all(running)).then_some(now.clone()).ok_or_else(|| format!("before {before:?}\nnow {now:?}"))
    })
}

/// One two-node prefill instance and one one-node decode, with a recovery budget of one.
const BUDGET_OF_ONE: &str = "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: budget}\nspec:\n  model: {path: Qwen/Qwen3-8B}\n  kvTransfer: {pageSize: 64}\n  router: {enabled: false}\n  prefill: {gpusPerNode: 1, parallelism: {tp: 2}}\n  decode: {parallelism: {tp: 2}}\n  recovery: {maxRestarts: 1}\n";

/// `Degraded` once it is True for a spent recovery budget: its message.
fn wait_left_down(ns: &TestNamespace, pdd: &str) -> String {
    wait_for(WAIT, "Degraded naming the instance left down", || {
        let (status, reason, message) = condition(ns, pdd, "Degraded")?;
        (status == "True" && reason == "RecoveryBudgetExhausted").then_some(message.clone()).ok_or(format!("{status} {reason}: {message}"))
    })
}

#[test]
fn an_instance_past_its_recovery_budget_is_left_down_until_the_spec_changes() {
    let ns = TestNamespace::new("budget");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply(BUDGET_OF_ONE).status.success());
    wait_running(&ns, "budget", 3);
    let prefill = ["budget-prefill-0-0", "budget-prefill-0-1"];
    restart_in_place(&ns, prefill[1], "engine", false, 1);
    let first = wait_replaced(&ns, "budget", &uids(&ns, "budget"), &prefill, 3);
    // The recreated leader's engine restarts too: the budget of one is spent.
    restart_in_place(&ns, prefill[0], "engine", false, 2);
    let message = wait_left_down(&ns, "budget");
    let cause = "pod budget-prefill-0-0: container engine restarted (restartCount 2, last exit code 137 (Error))";
    assert!(message.starts_with(&format!("{cause}; prefill instance 0 is left down: recreated once since ")), "{message}");
    assert!(message.contains("(spec.recovery allows 1 in 600s)"), "{message}");
    // Well past the 10 s backoff nothing was recreated, and one Event told it.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(uids(&ns, "budget"), first, "an instance past its budget is left down");
    let told = events(&ns);
    assert_eq!((told.matches("InstanceRecreated").count(), told.matches("RecoveryBudgetExhausted:").count()), (1, 1), "{told}");
    // A spec change starts the budget afresh: the instance is recreated, and Degraded clears.
    assert!(ns.apply(&BUDGET_OF_ONE.replace("maxRestarts: 1", "maxRestarts: 2")).status.success());
    wait_replaced(&ns, "budget", &first, &prefill, 3);
    wait_condition(&ns, "budget", "Degraded", "False");
}

fn scaled(replicas: u32) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: scale}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 2}}}}\n  decode: {{replicas: {replicas}, parallelism: {{tp: 2}}}}\n  router: {{enabled: false}}\n  rollout: {{drainSeconds: 3}}\n"
    )
}

#[test]
fn scaling_decode_from_four_to_two_removes_exactly_two_instances() {
    let ns = TestNamespace::new("scale");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply(&scaled(4)).status.success());
    wait_for(WAIT, "4 decode instances", || {
        let n = names(&ns, "pods", "pd.inference.dev/role=decode")?;
        (n.len() == 4).then_some(()).ok_or_else(|| format!("{n:?}"))
    });
    let before = uids(&ns, "scale");
    assert!(ns.apply(&scaled(2).replace("drainSeconds: 3", "drainSeconds: 6")).status.success());
    // They leave the router's pool first (serving=false) and stay for the drain period.
    wait_for(WAIT, "decode instances 2 and 3 out of the pool, not yet deleted", || {
        let draining = names(&ns, "pods", "pd.inference.dev/role=decode,pd.inference.dev/serving=false")?;
        let want: BTreeSet<String> = ["scale-decode-2-0", "scale-decode-3-0"].map(String::from).into();
        (draining == want).then_some(()).ok_or_else(|| format!("{draining:?}"))
    });
    assert!(pods(&ns, "scale").unwrap().iter().all(|p| p["metadata"]["deletionTimestamp"].is_null()), "deleted before draining");
    wait_for(WAIT, "decode instances 2 and 3 to be gone", || {
        let ps = pods(&ns, "scale")?;
        let left: BTreeSet<String> = ps
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        let want: BTreeSet<String> = ["scale-decode-0-0", "scale-decode-1-0", "scale-prefill-0-0"].iter().map(|s| s.to_string()).collect();
        (left == want).then_some(()).ok_or_else(|| format!("{left:?}"))
    });
    let after = uids(&ns, "scale");
    for n in ["scale-decode-0-0", "scale-decode-1-0", "scale-prefill-0-0"] {
        assert_eq!(before.get(n), after.get(n), "{n} must survive the scale-down untouched");
    }
    wait_for(WAIT, "status decode 2/2", || {
        let s = ns.get_json("pdd", "scale")?["status"]["decode"].clone();
        (s["replicas"] == 2 && s["readyReplicas"] == 2).then_some(()).ok_or(s.to_string())
    });
    // A decode-only change leaves the handshake ConfigMap alone; scaling prefill updates its addresses.
    assert!(ns.apply(&scaled(2).replace("prefill: {replicas: 1", "prefill: {replicas: 2")).status.success());
    wait_for(WAIT, "the handshake ConfigMap to list two prefills", || {
        let cm = ns.get_json("configmap", "scale-handshake")?;
        let a = cm["data"]["prefill-addresses"].as_str().unwrap_or_default().lines().count();
        (a == 2).then_some(()).ok_or(cm["data"].to_string())
    });
}

/// Prefill and decode instances that exist and are not being deleted.
fn live_instances(ns: &TestNamespace, pdd: &str) -> Result<(BTreeSet<String>, BTreeSet<String>), String> {
    let mut out = (BTreeSet::new(), BTreeSet::new());
    for p in pods(ns, pdd)?.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()) {
        let labels = &p["metadata"]["labels"];
        let instance = labels["pd.inference.dev/instance"].as_str().unwrap_or_default().to_owned();
        match labels["pd.inference.dev/role"].as_str() {
            Some("prefill") => out.0.insert(instance),
            _ => out.1.insert(instance),
        };
    }
    Ok(out)
}

#[test]
fn kubectl_scale_multiplies_the_declared_prefill_decode_unit() {
    let ns = TestNamespace::new("unit");
    let _ctl = ControllerProcess::start(&ns.name);
    // One unit: 1 prefill and 2 decode instances.
    assert!(ns.apply(&scaled(2)).status.success());
    let count = |want: (usize, usize)| {
        wait_for(WAIT, &format!("{want:?} prefill/decode instances and status to follow"), || {
            let (p, d) = live_instances(&ns, "scale")?;
            let s = ns.get_json("pdd", "scale")?["status"].clone();
            let units = want.0 as i64;
            let ok = (p.len(), d.len()) == want && s["replicas"] == units && s["prefill"]["readyReplicas"] == want.0 as i64;
            ok.then_some(()).ok_or_else(|| format!("prefill {p:?} decode {d:?} status {s}"))
        })
    };
    count((1, 2));
    let scale = |n: &str| {
        let o = cluster().kubectl(&["scale", "pdd", "scale", "-n", &ns.name, &format!("--replicas={n}")]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    scale("3");
    count((3, 6));
    // The scale subresource reports what HPA reads: replicas and the engine pods' selector.
    let sub =
        cluster().kubectl(&["get", "--raw", &format!("/apis/pd.inference.dev/v1alpha1/namespaces/{}/pddeployments/scale/scale", ns.name)]);
    let sub: Value = serde_json::from_slice(&sub.stdout).unwrap();
    assert_eq!(sub["spec"]["replicas"], 3, "{sub}");
    assert_eq!(sub["status"]["replicas"], 3, "{sub}");
    let selector = sub["status"]["selector"].as_str().unwrap_or_default().to_owned();
    assert_eq!(names(&ns, "pods", &selector).unwrap().len(), 9, "the selector picks the 9 engine pods: {selector}");
    let survivors = uids(&ns, "scale");
    scale("1");
    count((1, 2));
    let after = uids(&ns, "scale");
    for n in ["scale-prefill-0-0", "scale-decode-0-0", "scale-decode-1-0"] {
        assert_eq!(survivors.get(n), after.get(n), "{n}: the first unit survives the scale-down untouched");
    }
}

/// The HPA test's external metrics API, registered with the aggregator for the test's lifetime.
struct ExternalMetrics {
    dir: PathBuf,
    _server: Background,
}

impl ExternalMetrics {
    /// Serves `external.metrics.k8s.io/v1beta1` from this host's first non-loopback IPv4 address
    /// (the apiserver dials the EndpointSlice's address; loopback is not allowed there).
    fn start(ns: &TestNamespace) -> Self {
        let dir = std::env::temp_dir().join(format!("pd-external-metrics-{}", ns.name));
        let values = dir.join("values");
        std::fs::create_dir_all(&values).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=external-metrics"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", text(&made));
        let ip = host_ipv4();
        let server = Background::spawn(
            "external-metrics",
            Command::new("python3").arg(repo_path("tests/hpa/external_metrics.py")).arg(&values).arg(&cert).arg(&key).arg(&ip),
        );
        let port = wait_for(Duration::from_secs(20), "the metrics server's port", || {
            server.log_text().lines().next().and_then(|l| l.trim().parse::<u16>().ok()).ok_or_else(|| server.log_text())
        });
        let service = serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "external-metrics"},
            "spec": {"ports": [{"name": "https", "port": 443}]}});
        let endpoints = serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "external-metrics", "labels": {"kubernetes.io/service-name": "external-metrics"}},
            "addressType": "IPv4", "endpoints": [{"addresses": [ip]}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]});
        let api = serde_json::json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
            "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "insecureSkipTLSVerify": true,
                "groupPriorityMinimum": 100, "versionPriority": 100,
                "service": {"namespace": ns.name, "name": "external-metrics", "port": 443}}});
        let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [service, endpoints, api]}).to_string();
        assert!(ns.apply(&objects).status.success());
        Self { dir: values, _server: server }
    }

    fn set(&self, metric: &str, value: u32) {
        std::fs::write(self.dir.join(metric), value.to_string()).unwrap();
    }
}

impl Drop for ExternalMetrics {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["delete", "apiservice", "v1beta1.external.metrics.k8s.io", "--ignore-not-found"]);
    }
}

fn host_ipv4() -> String {
    let o = Command::new("hostname").arg("-I").output().unwrap();
    let all = String::from_utf8_lossy(&o.stdout).to_string();
    all.split_whitespace()
        .find(|a| a.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| !ip.is_loopback()))
        .unwrap_or_else(|| panic!("no IPv4 in {all:?}"))
        .to_owned()
}

/// The external metrics API is one APIService for the whole cluster: one test at a time.
static EXTERNAL_METRICS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn an_hpa_scales_the_pddeployment_through_its_scale_subresource() {
    let _one = EXTERNAL_METRICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let ns = TestNamespace::new("hpa");
    let _ctl = ControllerProcess::start(&ns.name);
    let metrics = ExternalMetrics::start(&ns);
    metrics.set("pd_queue_depth", 5);
    wait_for(WAIT, "the external metrics API to answer through the aggregator", || {
        let path = format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/pd_queue_depth", ns.name);
        let o = cluster().kubectl(&["get", "--raw", &path]);
        o.status.success().then_some(()).ok_or_else(|| text(&o))
    });
    assert!(ns.apply(&scaled(2)).status.success());
    // One unit per 10 queued requests, between 1 and 4 units; no stabilization, so the test is short.
    let hpa = serde_json::json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "scale"},
        "spec": {"scaleTargetRef": {"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment", "name": "scale"},
            "minReplicas": 1, "maxReplicas": 4,
            "metrics": [{"type": "External", "external": {"metric": {"name": "pd_queue_depth"}, "target": {"type": "AverageValue", "averageValue": "10"}}}],
            "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0}, "scaleDown": {"stabilizationWindowSeconds": 0}}}});
    assert!(ns.apply(&hpa.to_string()).status.success());
    let units = |want: usize| {
        wait_for(Duration::from_secs(120), &format!("{want} units: {want} prefill and {} decode instances", 2 * want), || {
            let (p, d) = live_instances(&ns, "scale")?;
            let hpa = ns.get_json("hpa", "scale").map(|h| h["status"].to_string()).unwrap_or_default();
            ((p.len(), d.len()) == (want, 2 * want)).then_some(()).ok_or_else(|| format!("prefill {p:?} decode {d:?}; hpa {hpa}"))
        })
    };
    units(1);
    metrics.set("pd_queue_depth", 30);
    units(3);
    assert_eq!(ns.get_json("pdd", "scale").unwrap()["spec"]["replicas"], 3);
    metrics.set("pd_queue_depth", 8);
    units(1);
}

/// kwok nodes of one test: `nvidia.com/gpu: 1` each, labelled `pool=<ns>` and `rack=<rack>`, and
/// tainted so no other test's pods land there. Deleted with the guard.
struct TestNodes {
    names: Vec<String>,
}

impl TestNodes {
    fn add(ns: &TestNamespace, racks: &[&str]) -> Self {
        let mut names = Vec::new();
        for (i, rack) in racks.iter().enumerate() {
            names.push(Self::node(ns, &format!("{}-n{i}", ns.name), rack));
        }
        Self { names }
    }

    fn node(ns: &TestNamespace, name: &str, rack: &str) -> String {
        let capacity =
            serde_json::json!({"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "pods": "110", "nvidia.com/gpu": "1"});
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"type": "kwok", "kubernetes.io/hostname": name, "pool": ns.name, "rack": rack}},
            "spec": {"taints": [{"key": "pool", "value": ns.name, "effect": "NoSchedule"}]},
            "status": {"capacity": capacity, "allocatable": capacity}});
        let o = cluster().kubectl_stdin(&["apply", "-f", "-"], &node.to_string());
        assert!(o.status.success(), "{}", text(&o));
        name.to_owned()
    }

    fn grow(&mut self, ns: &TestNamespace, rack: &str) {
        let name = format!("{}-n{}", ns.name, self.names.len());
        self.names.push(Self::node(ns, &name, rack));
    }
}

impl Drop for TestNodes {
    fn drop(&mut self) {
        let mut args = vec!["delete", "node", "--wait=false", "--ignore-not-found"];
        args.extend(self.names.iter().map(String::as_str));
        let _ = cluster().kubectl(&args);
    }
}

/// Instances of two pods each (tp 2, one GPU a node) pinned to the test's own nodes.
fn placed(ns: &TestNamespace, placement: &str, prefill: u32, decode: u32) -> String {
    let template = format!("template: {{nodeSelector: {{pool: {}}}, tolerations: [{{key: pool, operator: Exists}}]}}", ns.name);
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: gang}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  \
         kvTransfer: {{pageSize: 64}}\n  placement: {placement}\n  router: {{enabled: false}}\n  \
         prefill: {{replicas: {prefill}, gpusPerNode: 1, parallelism: {{tp: 2}}, {template}}}\n  \
         decode: {{replicas: {decode}, gpusPerNode: 1, parallelism: {{tp: 2}}, {template}}}\n"
    )
}

/// Per instance (`role-i`), the nodes its pods are bound to ("" for a pod not bound).
fn bindings(ns: &TestNamespace) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in pods(ns, "gang")? {
        let l = &p["metadata"]["labels"];
        let key =
            format!("{}-{}", l["pd.inference.dev/role"].as_str().unwrap_or(""), l["pd.inference.dev/instance"].as_str().unwrap_or(""));
        out.entry(key).or_default().push(p["spec"]["nodeName"].as_str().unwrap_or("").to_owned());
    }
    Ok(out)
}

#[test]
fn a_gang_instance_binds_all_of_its_pods_or_none_and_without_gang_some() {
    let ns = TestNamespace::new("gang");
    let _ctl = ControllerProcess::start(&ns.name);
    // Four pods (a prefill and a decode instance of two), three one-GPU nodes.
    let mut nodes = TestNodes::add(&ns, &["a", "a", "a"]);
    assert!(ns.apply(&placed(&ns, "{gang: workload}", 1, 1)).status.success());
    let settled = |want_bound: usize| {
        wait_for(WAIT, &format!("{want_bound} pods bound, each instance whole or not at all"), || {
            let b = bindings(&ns)?;
            let bound: usize = b.values().map(|n| n.iter().filter(|n| !n.is_empty()).count()).sum();
            let whole = b.values().all(|n| n.iter().all(|n| n.is_empty()) || n.iter().all(|n| !n.is_empty()));
            (b.len() == 2 && bound == want_bound && whole).then_some(()).ok_or_else(|| format!("{b:?}"))
        })
    };
    settled(2);
    // The waiting instance is held whole and status says why.
    std::thread::sleep(Duration::from_secs(5));
    settled(2);
    assert_eq!(ns.get_json("podgroup", "gang-prefill-0").unwrap()["spec"]["schedulingPolicy"]["gang"]["minCount"], 2);
    let progressing = common::condition(&ns.get_json("pdd", "gang").unwrap(), "Progressing").unwrap();
    assert_eq!(progressing["reason"], "InstancesUnschedulable", "{progressing}");
    assert!(progressing["message"].as_str().unwrap().contains("cannot be scheduled: "), "{progressing}");
    // A fourth node: the waiting instance binds whole.
    nodes.grow(&ns, "a");
    settled(4);

    // The same without gang scheduling binds pods one by one: three of four, an instance split.
    assert!(cluster().kubectl(&["delete", "pdd", "gang", "-n", &ns.name, "--wait=true"]).status.success());
    wait_for(WAIT, "the pods to go", || pods(&ns, "gang").and_then(|p| p.is_empty().then_some(()).ok_or(format!("{} pods", p.len()))));
    let _ = cluster().kubectl(&["delete", "node", &nodes.names.pop().unwrap()]);
    assert!(ns.apply(&placed(&ns, "{gang: none}", 1, 1)).status.success());
    wait_for(WAIT, "three pods bound, one instance split", || {
        let b = bindings(&ns)?;
        let bound: usize = b.values().map(|n| n.iter().filter(|n| !n.is_empty()).count()).sum();
        let split = b.values().any(|n| n.iter().any(|n| n.is_empty()) && n.iter().any(|n| !n.is_empty()));
        (bound == 3 && split).then_some(()).ok_or_else(|| format!("{b:?}"))
    });
}

#[test]
fn each_instance_lands_within_one_rack() {
    let ns = TestNamespace::new("rack");
    let _ctl = ControllerProcess::start(&ns.name);
    let _nodes = TestNodes::add(&ns, &["a", "b", "a", "b"]);
    // No decode: a role runs at least one instance unless its minReplicas allows zero.
    let spec = placed(&ns, "{topologyKey: rack}", 2, 0) + "  scaling: {decode: {minReplicas: 0}}\n";
    assert!(ns.apply(&spec).status.success());
    let racks: BTreeMap<String, String> = (0..4).map(|i| (format!("{}-n{i}", ns.name), ["a", "b", "a", "b"][i].to_owned())).collect();
    wait_for(WAIT, "both prefill instances bound, each within one rack", || {
        let b = bindings(&ns)?;
        let ok = b.len() == 2
            && b.values().all(|nodes| {
                let r: BTreeSet<Option<&String>> = nodes.iter().map(|n| racks.get(n)).collect();
                r.len() == 1 && !r.contains(&None)
            });
        ok.then_some(()).ok_or_else(|| format!("{b:?}"))
    });
}

/// Required colocation holds on the real scheduler: two racks that can each hold every pod, so
/// whichever the first instance lands in, the second must follow (each instance is placed on its
/// own, so a rack too small for the rest would leave them pending: docs/releases-and-rules.md
/// "Placement").
#[test]
fn colocate_required_keeps_prefill_and_decode_in_one_rack() {
    let ns = TestNamespace::new("colocate");
    let _ctl = ControllerProcess::start(&ns.name);
    let layout = ["a", "b", "a", "b", "a", "b", "a", "b"];
    let _nodes = TestNodes::add(&ns, &layout);
    assert!(ns.apply(&placed(&ns, "{topologyKey: rack, colocate: required}", 1, 1)).status.success());
    let racks: BTreeMap<String, &str> = layout.iter().enumerate().map(|(i, r)| (format!("{}-n{i}", ns.name), *r)).collect();
    wait_for(WAIT, "all four pods bound, in one rack", || {
        let b = bindings(&ns)?;
        let used: BTreeSet<Option<&&str>> = b.values().flatten().map(|n| racks.get(n)).collect();
        let bound = b.values().flatten().filter(|n| !n.is_empty()).count();
        (bound == 4 && used.len() == 1).then_some(()).ok_or_else(|| format!("{b:?}"))
    });
}

fn rollout_spec(mem: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: roll}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 2, parallelism: {{tp: 2}}, template: {{extraArgs: [--mem-fraction-static, '{mem}']}}}}\n  decode: {{replicas: 3, parallelism: {{tp: 2}}, template: {{extraArgs: [--mem-fraction-static, '{mem}']}}}}\n  router: {{enabled: false}}\n  rollout: {{drainSeconds: 1}}\n"
    )
}

fn all_updated(ns: &TestNamespace) -> Result<(), String> {
    let v = ns.get_json("pdd", "roll")?;
    let s = &v["status"];
    let ok = s["observedGeneration"] == v["metadata"]["generation"]
        && s["prefill"]["updatedReplicas"] == 2
        && s["decode"]["updatedReplicas"] == 3
        && s["prefill"]["readyReplicas"] == 2
        && s["decode"]["readyReplicas"] == 3;
    let ps = pods(ns, "roll")?;
    let live: Vec<&Value> = ps.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
    (ok && live.len() == 5).then_some(()).ok_or_else(|| format!("{s}\n{} live pods", live.len()))
}

#[test]
fn a_decode_partition_canaries_the_new_revision_on_the_instances_above_it() {
    let ns = TestNamespace::new("canary");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply(&rollout_spec("0.80")).status.success());
    wait_for(WAIT, "the first revision to be ready", || all_updated(&ns));
    let before = uids(&ns, "roll");
    let canary = rollout_spec("0.85").replace("rollout: {drainSeconds: 1}", "rollout: {drainSeconds: 1, decode: {partition: 2}}");
    assert!(ns.apply(&canary).status.success());
    wait_for(Duration::from_secs(180), "prefill rolled, decode 2 only, rollout complete", || {
        let v = ns.get_json("pdd", "roll")?;
        let s = &v["status"];
        let progressing = common::condition(&v, "Progressing").map(|c| c["reason"].clone()).unwrap_or_default();
        let ok = s["observedGeneration"] == v["metadata"]["generation"]
            && s["prefill"]["updatedReplicas"] == 2
            && s["decode"]["updatedReplicas"] == 1
            && s["decode"]["readyReplicas"] == 3
            && progressing == "Complete";
        ok.then_some(()).ok_or_else(|| s.to_string())
    });
    let after = uids(&ns, "roll");
    for kept in ["roll-decode-0-0", "roll-decode-1-0"] {
        assert_eq!(before.get(kept), after.get(kept), "{kept} is below the partition");
    }
    assert_ne!(before.get("roll-decode-2-0"), after.get("roll-decode-2-0"), "decode 2 is the canary");
    let decode = ns.get_json("pdd", "roll").unwrap()["status"]["decode"].clone();
    assert_ne!(decode["currentRevision"], decode["updateRevision"], "two revisions serve: {decode}");
    // Lifting the partition finishes the rollout; the settings themselves roll nothing.
    assert!(ns.apply(&rollout_spec("0.85")).status.success());
    wait_for(Duration::from_secs(180), "every instance on the new revision", || all_updated(&ns));
    let decode = ns.get_json("pdd", "roll").unwrap()["status"]["decode"].clone();
    assert_eq!(decode["currentRevision"], decode["updateRevision"], "{decode}");
}

#[test]
fn a_spec_change_rolls_every_instance_and_survives_a_controller_restart() {
    let ns = TestNamespace::new("rollout");
    let mut ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply(&rollout_spec("0.80")).status.success());
    wait_for(WAIT, "the first revision to be ready", || all_updated(&ns));
    let before = uids(&ns, "roll");
    assert!(ns.apply(&rollout_spec("0.85")).status.success());
    // Kill the controller as soon as the rollout has started, then start it again.
    wait_for(WAIT, "the rollout to start", || {
        let now = uids(&ns, "roll");
        (now != before).then_some(()).ok_or_else(|| "no pod replaced yet".to_owned())
    });
    ctl.kill();
    std::thread::sleep(Duration::from_secs(2));
    ctl.restart();
    wait_for(Duration::from_secs(180), "every instance on the new revision", || all_updated(&ns));
    let after = uids(&ns, "roll");
    assert_eq!(after.len(), 5, "no duplicate or orphaned pods: {after:?}");
    for (name, uid) in &before {
        assert_ne!(after.get(name), Some(uid), "{name} was not rolled");
    }
    let mems: BTreeSet<String> = pods(&ns, "roll")
        .unwrap()
        .iter()
        .map(|p| {
            p["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap()
                .iter()
                .skip_while(|a| *a != "--mem-fraction-static")
                .nth(1)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(mems, BTreeSet::from(["0.85".to_owned()]));
    wait_condition(&ns, "roll", "Progressing", "False");
    // A memory fraction changes nothing either side reports in the handshake: rolled in place.
    let k = &ns.get_json("pdd", "roll").unwrap()["status"]["kvSet"];
    assert_eq!((k["target"].as_u64(), k["routed"].as_u64(), k["strategy"].as_str()), (Some(0), Some(0), Some("InPlace")));
    assert!(events(&ns).contains("RolloutInPlace: the new revisions pass the handshake with KV set 0's running pods both ways"));
}

/// Pods of `role` now in the router's pool: Ready, not terminating, not draining.
fn serving(ps: &[Value], role: &str) -> usize {
    let in_pool = |p: &&Value| p["metadata"]["labels"]["pd.inference.dev/serving"] != "false";
    ps.iter().filter(|p| p["metadata"]["labels"]["pd.inference.dev/role"] == role && running(p) && is_ready(p)).filter(in_pool).count()
}

#[test]
fn a_max_surge_rollout_brings_the_new_instance_up_first_and_never_runs_a_role_short() {
    let ns = TestNamespace::new("maxsurge");
    let _ctl = ControllerProcess::start(&ns.name);
    let spec = |mem: &str| {
        rollout_spec(mem)
            .replace("rollout: {drainSeconds: 1}", "rollout: {drainSeconds: 1, minReadySeconds: 2, maxSurge: 1, maxUnavailable: 0}")
    };
    assert!(ns.apply(&spec("0.80")).status.success());
    wait_for(WAIT, "the first revision to be ready", || all_updated(&ns));
    assert!(!uids(&ns, "roll").contains_key("roll-prefill-2-0"), "no surge instance without a rollout");
    assert!(ns.apply(&spec("0.85")).status.success());
    let (mut fewest, mut surged) = ((usize::MAX, usize::MAX), BTreeSet::new());
    wait_for(Duration::from_secs(240), "every instance on the new revision and the surge instances gone", || {
        let ps = pods(&ns, "roll")?;
        fewest = (fewest.0.min(serving(&ps, "prefill")), fewest.1.min(serving(&ps, "decode")));
        let extra = |n: &&str| ["roll-prefill-2-0", "roll-decode-3-0"].contains(n);
        surged.extend(ps.iter().filter_map(|p| p["metadata"]["name"].as_str()).filter(extra).map(str::to_owned));
        all_updated(&ns)
    });
    assert_eq!(surged, BTreeSet::from(["roll-decode-3-0".to_owned(), "roll-prefill-2-0".to_owned()]), "each role surged one instance");
    assert_eq!(fewest, (2, 3), "maxUnavailable 0: no role ever had fewer instances in the pool than it runs");
}

fn surge_spec(page: u32) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: kv}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  kvTransfer: {{pageSize: {page}}}\n  prefill: {{parallelism: {{tp: 2}}}}\n  decode: {{replicas: 2, parallelism: {{tp: 2}}}}\n  rollout: {{drainSeconds: 1}}\n"
    )
}

fn kv_set(p: &Value) -> &str {
    p["metadata"]["labels"]["pd.inference.dev/kv-set"].as_str().unwrap_or_default()
}

fn events(ns: &TestNamespace) -> String {
    let o =
        cluster().kubectl(&["get", "events", "-n", &ns.name, "-o", "jsonpath={range .items[*]}{.reason}: {.note}{.message}{\"\\n\"}{end}"]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Puts a finalizer of the test's own on the router's one pod, so that it stays, terminating,
/// until the test removes it; returns the pod's name.
fn hold_router_pod(ns: &TestNamespace) -> String {
    let router = wait_for(WAIT, "the router pod", || {
        let found = names(ns, "pods", "pd.inference.dev/role=router")?;
        let mut only = found.iter().cloned();
        match (only.next(), only.next()) {
            (Some(name), None) => Ok(name),
            _ => Err(format!("{found:?}")),
        }
    });
    let hold = r#"[{"op":"add","path":"/metadata/finalizers","value":["pd.inference.dev/test-hold"]}]"#;
    let o = cluster().kubectl(&["patch", "pod", &router, "-n", &ns.name, "--type=json", "-p", hold]);
    assert!(o.status.success(), "{}", text(&o));
    router
}

/// Once the held router pod is on its way out, checks that set 0 still serves, then lets the pod
/// go; returns when.
fn release_the_old_router_pod(ns: &TestNamespace, router_pod: &str) -> std::time::Instant {
    wait_for(Duration::from_secs(120), "the old router pod on its way out", || {
        let p = ns.get_json("pod", router_pod)?;
        p["metadata"]["deletionTimestamp"].as_str().map(drop).ok_or_else(|| p["metadata"].to_string())
    });
    std::thread::sleep(Duration::from_secs(3));
    let ps = pods(ns, "kv").unwrap();
    assert!(
        ps.iter().filter(|p| kv_set(p) == "0" && p["metadata"]["labels"]["pd.inference.dev/serving"] == "true").count() == 3,
        "set 0 left the pool while the old router pod still served it: {ps:?}"
    );
    let released = std::time::Instant::now();
    let release = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
    let o = cluster().kubectl(&["patch", "pod", router_pod, "-n", &ns.name, "--type=json", "-p", release]);
    assert!(o.status.success(), "{}", text(&o));
    released
}

/// The router Deployment's pods' KV set, and whether its rollout is over.
fn router_set(ns: &TestNamespace) -> (String, bool) {
    let d = ns.get_json("deployment", "kv-router").unwrap_or_default();
    let set = d["spec"]["template"]["metadata"]["labels"]["pd.inference.dev/kv-set"].as_str().unwrap_or_default().to_owned();
    let s = &d["status"];
    (set, s["observedGeneration"] == d["metadata"]["generation"] && s["replicas"] == 1 && s["updatedReplicas"] == 1)
}

#[test]
/// Page size 64 → 32 cannot pair old and new pods (SGLang: `Page size mismatch`): the new revision
/// comes up as KV set 1 beside set 0, the router moves to it once it is whole, and only then
/// does set 0 drain and go. Watched every 200 ms, those orders must never be broken.
fn an_incompatible_change_surges_a_new_kv_set_and_moves_the_router_only_to_a_whole_set() {
    let ns = TestNamespace::new("surge");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply(&surge_spec(64)).status.success());
    wait_condition(&ns, "kv", "Ready", "True");
    let old = uids(&ns, "kv");
    assert_eq!(old.len(), 3);
    // The old router pod lingers on its way out (as smg finishes its requests on kind): set 0 must
    // wait for it, and go as soon as it is gone, woken by the pod itself.
    let router_pod = hold_router_pod(&ns);
    assert!(ns.apply(&surge_spec(32)).status.success());
    let released = release_the_old_router_pod(&ns, &router_pod);
    let (mut both_seen, mut moved_seen) = (false, false);
    wait_for(Duration::from_secs(180), "set 1 alone, routed", || {
        let ps = pods(&ns, "kv")?;
        let live = |set: &str| ps.iter().filter(|p| kv_set(p) == set && p["metadata"]["deletionTimestamp"].is_null()).count();
        let ready1 = ps.iter().filter(|p| kv_set(p) == "1" && is_ready(p)).count();
        let (router, settled) = router_set(&ns);
        both_seen |= live("0") == 3 && live("1") > 0;
        if router == "1" && !moved_seen {
            moved_seen = true;
            assert_eq!(ready1, 3, "the router moved to set 1 before it was whole: {ps:?}");
        }
        // Draining starts the old set's way out: by then the router must have left it for good.
        let draining = ps.iter().any(|p| kv_set(p) == "0" && p["metadata"]["labels"]["pd.inference.dev/serving"] == "false");
        if live("0") < 3 || draining {
            assert!(router == "1" && settled, "set 0 started to go before the router had settled on set 1 ({router:?}, {settled})");
        }
        let v = ns.get_json("pdd", "kv")?;
        let k = &v["status"]["kvSet"];
        let done = live("0") == 0 && live("1") == 3 && settled && k["target"] == 1 && k["routed"] == 1;
        done.then_some(()).ok_or_else(|| format!("set 0: {}, set 1: {} ({ready1} ready), router on {router:?}, {k}", live("0"), live("1")))
    });
    assert!(both_seen, "set 1 never ran beside set 0");
    // Draining (1 s) and deletion follow the router pod's going within seconds, not at the resync.
    assert!(released.elapsed() < Duration::from_secs(60), "set 0 went {:?} after the old router pod", released.elapsed());
    let v = ns.get_json("pdd", "kv").unwrap();
    assert_eq!(v["status"]["kvSet"]["strategy"], "InPlace");
    let names: BTreeSet<String> = uids(&ns, "kv").into_keys().collect();
    assert_eq!(names, BTreeSet::from(["kv-prefill-0-0-s1".into(), "kv-decode-0-0-s1".into(), "kv-decode-1-0-s1".into()]));
    let args = ns.get_json("deployment", "kv-router").unwrap()["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("pd.inference.dev/kv-set=1") && !args.contains("kv-set=0"), "{args}");
    let cm = ns.get_json("configmap", "kv-handshake-s1").unwrap();
    assert!(cm["data"]["prefill-addresses"].as_str().unwrap().starts_with("kv-prefill-0-0-s1.kv-engines."), "{cm}");
    wait_for(WAIT, "set 0's ConfigMap to go", || ns.get_json("configmap", "kv-handshake").err().map(drop).ok_or("still there".to_owned()));
    let events = events(&ns);
    let mismatch = "RuntimeError: Page size mismatch: prefill server has page_size=32, but decode server has page_size=64.";
    assert!(
        events.contains("RolloutSurge: the new revisions cannot pair with KV set 0 (running decode with new prefill: ")
            && events.contains(mismatch),
        "{events}"
    );
    assert!(events.contains("RouterMoved: the router pairs KV set 1 now; set 0 drains and goes"), "{events}");

    // Under `strategy: Surge` even a compatible change (a memory fraction) gets a set of its own.
    let patch = r#"{"spec":{"rollout":{"strategy":"Surge"},"prefill":{"template":{"extraArgs":["--mem-fraction-static","0.8"]}}}}"#;
    let o = cluster().kubectl(&["patch", "pdd", "kv", "-n", &ns.name, "--type=merge", "-p", patch]);
    assert!(o.status.success(), "{}", text(&o));
    // Events of one reason within minutes fold into a series that keeps the first note, so the
    // reason is read from the status while the surge runs.
    let mut why = String::new();
    wait_for(Duration::from_secs(180), "set 2 alone, routed", || {
        let ps = pods(&ns, "kv")?;
        let sets: BTreeSet<&str> = ps.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).map(kv_set).collect();
        let k = ns.get_json("pdd", "kv")?["status"]["kvSet"].clone();
        if k["target"] == 2 && k["routed"] == 1 {
            why = k["message"].as_str().unwrap_or_default().to_owned();
        }
        (sets == BTreeSet::from(["2"]) && k["routed"] == 2).then_some(()).ok_or_else(|| format!("{sets:?} {k}"))
    });
    assert!(why.contains("rollout.strategy is Surge"), "the surge's reason in status.kvSet.message: {why:?}");
}

#[test]
/// An engine upgrade from SGLang 0.5.21 to 0.5.23: a running 0.5.21 decode would refuse the new
/// prefill's topology body (its record has no `kv_layout`), so the change surges as a KV set of
/// its own rather than rolling in place, and status says why with SGLang's text.
fn an_engine_upgrade_across_releases_surges_when_the_running_decode_cannot_read_the_new_prefill() {
    let ns = TestNamespace::new("release");
    let _ctl = ControllerProcess::start(&ns.name);
    let spec = |version: &str| surge_spec(64).replace("  model:", &format!("  engine: {{version: \"{version}\"}}\n  model:"));
    assert!(ns.apply(&spec("0.5.21")).status.success());
    wait_condition(&ns, "kv", "Ready", "True");
    assert!(ns.apply(&spec("0.5.23")).status.success());
    let mut why = String::new();
    wait_for(Duration::from_secs(180), "the upgrade to surge as KV set 1", || {
        let k = ns.get_json("pdd", "kv")?["status"]["kvSet"].clone();
        why = k["message"].as_str().unwrap_or_default().to_owned();
        (k["target"] == 1).then_some(()).ok_or_else(|| k.to_string())
    });
    assert!(
        why.starts_with("running decode with new prefill: SGLang 0.5.21's decode cannot build its record from the prefill's (SGLang 0.5.23) topology body (TypeError: PrefillServerInfo.__init__() got an unexpected keyword argument"),
        "{why}"
    );
}

fn sidecar_image(p: &Value) -> String {
    let c = p["spec"]["initContainers"].as_array().into_iter().flatten().find(|c| c["name"] == "handshake");
    c.map(|c| c["image"].as_str().unwrap_or_default().to_owned()).unwrap_or_default()
}

#[test]
/// An operator upgrade (a new operator image) reaches running decode pods in place, one pod at a
/// time: the same pods, the engine container untouched, every decode pod Ready at every sample,
/// the second change at least `sidecar::SETTLE` after the first, an Event per pod.
fn an_operator_upgrade_changes_running_decode_sidecars_in_place_one_at_a_time() {
    let ns = TestNamespace::new("sidecar");
    let mut old = ControllerProcess::start(&ns.name);
    assert!(ns.apply_file(&repo_path("examples/qwen3-gqa.yaml")).status.success());
    wait_condition(&ns, "qwen3", "Ready", "True");
    let before = pods(&ns, "qwen3").unwrap();
    let decodes: Vec<&Value> = before.iter().filter(|p| p["metadata"]["labels"]["pd.inference.dev/role"] == "decode").collect();
    assert!(decodes.len() >= 2 && decodes.iter().all(|p| sidecar_image(p) == "pd-operator:e2e"), "{decodes:?}");
    let engines: BTreeMap<String, Value> =
        before.iter().map(|p| (p["metadata"]["name"].as_str().unwrap().to_owned(), p["spec"]["containers"].clone())).collect();
    old.kill();
    let _new = ControllerProcess::start_with(&ns.name, &["--webhook=false", "--operator-image", "pd-operator:e2e-next"]);
    wait_for(Duration::from_secs(120), "every decode pod's sidecar at the new image", || {
        let ps = pods(&ns, "qwen3")?;
        let decodes: Vec<&Value> = ps.iter().filter(|p| p["metadata"]["labels"]["pd.inference.dev/role"] == "decode").collect();
        for p in &decodes {
            assert!(is_ready(p), "a decode pod turned unready during the sidecar update: {p}");
        }
        let moved = decodes.iter().filter(|p| sidecar_image(p) == "pd-operator:e2e-next").count();
        (moved == decodes.len()).then_some(()).ok_or_else(|| format!("{moved} of {} moved", decodes.len()))
    });
    let after = pods(&ns, "qwen3").unwrap();
    let uid = |ps: &[Value]| -> BTreeMap<String, String> {
        ps.iter().map(|p| (p["metadata"]["name"].as_str().unwrap().to_owned(), p["metadata"]["uid"].as_str().unwrap().to_owned())).collect()
    };
    assert_eq!(uid(&after), uid(&before), "no pod may be replaced");
    for p in &after {
        assert_eq!(p["spec"]["containers"], engines[p["metadata"]["name"].as_str().unwrap()], "the engine container is untouched");
    }
    let mut at: Vec<jiff::Timestamp> = after
        .iter()
        .filter_map(|p| p["metadata"]["annotations"]["pd.inference.dev/sidecar-updated-at"].as_str())
        .map(|t| t.parse().unwrap())
        .collect();
    at.sort();
    assert_eq!(at.len(), decodes.len());
    assert!(at[1].duration_since(at[0]) >= jiff::SignedDuration::from_secs(10), "one pod at a time, settled: {at:?}");
    let events = events(&ns);
    assert!(
        events.contains("SidecarUpdated: decode pod qwen3-decode-0-0: handshake sidecar pd-operator:e2e -> pd-operator:e2e-next in place"),
        "{events}"
    );
}

#[test]
/// With resync shortened to 5 s, the 60 idle seconds hold twelve resyncs: the writes of a
/// controller left idle for an hour at the default period.
fn an_idle_controller_writes_nothing_across_twelve_resyncs() {
    let ns = TestNamespace::new("idle");
    let ctl = ControllerProcess::start_with(&ns.name, &["--webhook=false", "--resync-seconds", "5"]);
    assert!(ns.apply_file(&repo_path("examples/qwen3-gqa.yaml")).status.success());
    wait_condition(&ns, "qwen3", "DecodeAvailable", "True");
    wait_condition(&ns, "qwen3", "Progressing", "False");
    std::thread::sleep(Duration::from_secs(5));
    let before = ctl.api_writes();
    assert!(before > 0, "the metric counts writes: {}", ctl.get("/metrics").unwrap_or_default());
    std::thread::sleep(Duration::from_secs(60));
    let after = ctl.api_writes();
    assert_eq!(before, after, "writes while idle; log:\n{}", ctl.log_tail());
    // The other metrics the issue asks for are recorded, not just registered.
    let metrics = ctl.get("/metrics").unwrap_or_default();
    assert!(metrics.lines().any(|l| l == "pd_operator_managed_pddeployments 1"), "{metrics}");
    let reconciles = metrics
        .lines()
        .find(|l| l.starts_with("pd_operator_reconcile_duration_seconds_count "))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(reconciles.is_some_and(|n| n >= 12), "the resyncs ran: {metrics}");
}

#[test]
fn an_invalid_spec_is_reported_and_creates_nothing() {
    let ns = TestNamespace::new("invalid");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply_file(&repo_path("examples/qwen-dcp2-mistake.yaml")).status.success());
    wait_condition(&ns, "qwen-pd", "Validated", "False");
    let (_, reason, message) = condition(&ns, "qwen-pd", "Validated").unwrap();
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("spec.decode.parallelism.dcp: PD decode DCP requires an MLA or hybrid-MLA KV pool."), "{message}");
    assert!(names(&ns, "pods", "pd.inference.dev/deployment=qwen-pd").unwrap().is_empty());
    assert_eq!(condition(&ns, "qwen-pd", "Ready").unwrap().1, "InvalidSpec");
}

#[test]
fn deleting_the_pddeployment_removes_every_child() {
    let ns = TestNamespace::new("delete");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply_file(&repo_path("examples/deepseek-v3-dcp.yaml")).status.success());
    let sel = "pd.inference.dev/deployment=dsv3";
    wait_for(WAIT, "children", || {
        let n = names(&ns, "pods", sel)?;
        (n.len() >= 3).then_some(()).ok_or_else(|| format!("{n:?}"))
    });
    assert!(cluster().kubectl(&["delete", "pdd", "dsv3", "-n", &ns.name, "--wait=false"]).status.success());
    wait_for(Duration::from_secs(150), "every child to be garbage-collected", || {
        let left: Vec<String> = ["pods", "services", "configmaps", "deployments", "replicasets", "networkpolicies"]
            .iter()
            .flat_map(|k| names(&ns, k, sel).unwrap_or_default())
            .collect();
        left.is_empty().then_some(()).ok_or_else(|| format!("{left:?}"))
    });
}

#[test]
fn switching_the_network_policy_off_deletes_it_and_leaves_the_pods_alone() {
    let ns = TestNamespace::new("netpol");
    let _ctl = ControllerProcess::start(&ns.name);
    assert!(ns.apply_file(&repo_path("examples/deepseek-v3-dcp.yaml")).status.success());
    let sel = "pd.inference.dev/deployment=dsv3";
    // The engines', the router's and the engine dry run's.
    let all: BTreeSet<String> = ["dsv3-engines", "dsv3-router", "dsv3-dry-run"].map(String::from).into();
    wait_for(WAIT, "the three NetworkPolicies and every pod", || {
        let (policies, pods) = (names(&ns, "networkpolicies", sel)?, names(&ns, "pods", sel)?);
        (policies == all && pods.len() >= 3).then_some(()).ok_or_else(|| format!("{policies:?} {pods:?}"))
    });
    let engines = ns.get_json("networkpolicy", "dsv3-engines").unwrap();
    assert_eq!(engines["metadata"]["ownerReferences"][0]["kind"], "PDDeployment", "{engines}");
    let before = uids(&ns, "dsv3");
    let patch = r#"{"spec":{"networkPolicy":{"enabled":false}}}"#;
    assert!(cluster().kubectl(&["patch", "pdd", "dsv3", "-n", &ns.name, "--type=merge", "-p", patch]).status.success());
    wait_for(WAIT, "the NetworkPolicies to go", || {
        let left = names(&ns, "networkpolicies", sel)?;
        left.is_empty().then_some(()).ok_or_else(|| format!("{left:?}"))
    });
    assert_eq!(uids(&ns, "dsv3"), before, "turning the policy off replaced engine pods");
}

fn leader_gauge(c: &ControllerProcess) -> Option<u64> {
    c.get("/metrics")?.lines().find(|l| l.starts_with("pd_operator_leader "))?.rsplit(' ').next()?.parse::<f64>().ok().map(|v| v as u64)
}

#[test]
fn two_replicas_elect_one_leader_and_the_standby_takes_over() {
    let ns = TestNamespace::new("leader");
    let mut a = ControllerProcess::start(&ns.name);
    let b = ControllerProcess::start(&ns.name);
    wait_for(WAIT, "exactly one leader", || {
        let (la, lb) = (leader_gauge(&a), leader_gauge(&b));
        (la.unwrap_or(0) + lb.unwrap_or(0) == 1).then_some(()).ok_or(format!("a={la:?} b={lb:?}"))
    });
    let (mut leader, standby) = if leader_gauge(&a) == Some(1) { (a, b) } else { (b, a) };
    assert!(ns.apply(&scaled(1)).status.success());
    wait_for(WAIT, "the leader to create the pods", || {
        let n = names(&ns, "pods", "pd.inference.dev/deployment=scale")?;
        (n.len() == 2).then_some(()).ok_or(format!("{n:?}"))
    });
    assert!(standby.api_writes() == 0, "the standby must not write");
    leader.kill();
    a = standby;
    wait_for(Duration::from_secs(60), "the standby to take the lease", || {
        (leader_gauge(&a) == Some(1)).then_some(()).ok_or_else(|| a.log_tail())
    });
    assert!(ns.apply(&scaled(3)).status.success());
    wait_for(WAIT, "the new leader to reconcile a scale-up", || {
        let n = names(&ns, "pods", "pd.inference.dev/role=decode")?;
        (n.len() == 3).then_some(()).ok_or(format!("{n:?}"))
    });
    let lease = ns.get_json("lease", "pd-operator-leader").unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease}");
}

/// `(prefill, decode)` live instance counts.
fn counts(ns: &TestNamespace, pdd: &str) -> Result<(usize, usize), String> {
    live_instances(ns, pdd).map(|(p, d)| (p.len(), d.len()))
}

fn wait_counts(ns: &TestNamespace, want: (usize, usize), why: &str) {
    wait_for(WAIT, &format!("{want:?} prefill/decode instances: {why}"), || {
        let got = counts(ns, "scale")?;
        (got == want).then_some(()).ok_or_else(|| format!("{got:?}"))
    });
}

fn kubectl_ok(args: &[&str]) {
    let o = cluster().kubectl(args);
    assert!(o.status.success(), "kubectl {args:?}: {}", text(&o));
}

#[test]
fn each_role_scales_through_its_pdrole_and_a_reapplied_pddeployment_does_not_undo_it() {
    let ns = TestNamespace::new("roles");
    let _ctl = ControllerProcess::start(&ns.name);
    // One unit: 1 prefill and 2 decode instances.
    assert!(ns.apply(&scaled(2)).status.success());
    wait_counts(&ns, (1, 2), "the PDDeployment's unit");
    wait_for(WAIT, "each PDRole reporting its instances, leader selector and owner", || {
        let d = ns.get_json("pdrole", "scale-decode")?;
        let s = &d["status"];
        let ok = d["spec"]["replicas"] == 2
            && s["replicas"] == 2
            && s["replicasOwner"] == "PDDeployment"
            && s["selector"]
                .as_str()
                .is_some_and(|sel| sel.contains("pd.inference.dev/role=decode") && sel.contains("pd.inference.dev/node-rank=0"));
        let p = ns.get_json("pdrole", "scale-prefill")?;
        (ok && p["status"]["replicas"] == 1).then_some(()).ok_or_else(|| format!("{d} {p}"))
    });
    // kubectl scale on the decode role moves decode only.
    kubectl_ok(&["scale", "-n", &ns.name, "pdrole/scale-decode", "--replicas", "3"]);
    wait_counts(&ns, (1, 3), "decode scaled through its PDRole");
    let owner = ns.get_json("pdrole", "scale-decode").unwrap()["status"]["replicasOwner"].clone();
    wait_for(WAIT, "the decode PDRole owned by kubectl", || {
        let o = ns.get_json("pdrole", "scale-decode")?["status"]["replicasOwner"].clone();
        (o != "PDDeployment" && o.is_string()).then_some(()).ok_or_else(|| format!("{o} (was {owner})"))
    });
    // Re-applying the PDDeployment with other per-unit counts moves prefill, not the scaled decode.
    let reapplied = scaled(2).replace("prefill: {replicas: 1", "prefill: {replicas: 2");
    assert!(ns.apply(&reapplied).status.success());
    wait_counts(&ns, (2, 3), "prefill from the re-applied PDDeployment, decode as kubectl left it");
    // So does the PDDeployment's own /scale.
    kubectl_ok(&["scale", "-n", &ns.name, "pdd/scale", "--replicas", "2"]);
    wait_counts(&ns, (4, 3), "two units of prefill; decode still its own");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(counts(&ns, "scale").unwrap(), (4, 3), "nothing undid the decode count");
    assert_eq!(ns.get_json("pdrole", "scale-decode").unwrap()["spec"]["replicas"], 3);

    // A ratio band: at most 1 decode per prefill; decode asked 9 runs 4, with a condition and an Event.
    let banded =
        format!("{reapplied}  scaling: {{ratio: {{min: 0.5, max: 1}}}}\n").replace("metadata: {name: scale}", "metadata: {name: scale}");
    assert!(ns.apply(&banded).status.success(), "banded manifest");
    kubectl_ok(&["scale", "-n", &ns.name, "pdd/scale", "--replicas", "2"]);
    kubectl_ok(&["scale", "-n", &ns.name, "pdrole/scale-decode", "--replicas", "9"]);
    wait_counts(&ns, (4, 4), "decode clamped to the band's max with 4 prefill");
    wait_for(WAIT, "ScalingLimited=True with the band's reason and the PDRole's target", || {
        let (status, reason, message) = condition(&ns, "scale", "ScalingLimited")?;
        let role = ns.get_json("pdrole", "scale-decode")?;
        let ok = status == "True"
            && reason == "AboveRatioBand"
            && message.contains("spec.scaling.ratio.max")
            && role["status"]["targetReplicas"] == 4
            && role["spec"]["replicas"] == 9;
        ok.then_some(()).ok_or_else(|| format!("{status} {reason} {message}; {}", role["status"]))
    });
    wait_for(WAIT, "a ScalingLimited Event on the PDDeployment", || {
        let o = cluster().kubectl(&["get", "events", "-n", &ns.name, "--field-selector", "reason=ScalingLimited", "-o", "json"]);
        let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
        let found = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["note"].as_str().or(e["message"].as_str()).is_some_and(|m| m.contains("decode: 9 instances asked")));
        found.then_some(()).ok_or_else(|| v.to_string())
    });
    // Back in the band: the condition clears.
    kubectl_ok(&["scale", "-n", &ns.name, "pdrole/scale-decode", "--replicas", "3"]);
    wait_for(WAIT, "ScalingLimited=False once the ask fits", || {
        let (status, reason, _) = condition(&ns, "scale", "ScalingLimited")?;
        (status == "False" && counts(&ns, "scale")? == (4, 3)).then_some(()).ok_or_else(|| format!("{status} {reason}"))
    });
    // Removing the role's spec.replicas hands the count back to the PDDeployment (2 units × 2 decode).
    kubectl_ok(&["patch", "-n", &ns.name, "pdrole/scale-decode", "--type=json", "-p", r#"[{"op":"remove","path":"/spec/replicas"}]"#]);
    wait_counts(&ns, (4, 4), "decode following the PDDeployment again");
    wait_for(WAIT, "the PDDeployment owning the decode count again", || {
        let role = ns.get_json("pdrole", "scale-decode")?;
        (role["status"]["replicasOwner"] == "PDDeployment" && role["spec"]["replicas"] == 4).then_some(()).ok_or_else(|| role.to_string())
    });
}

#[test]
fn an_hpa_scales_one_role_through_its_pdrole() {
    let _one = EXTERNAL_METRICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let ns = TestNamespace::new("rolehpa");
    let _ctl = ControllerProcess::start(&ns.name);
    let metrics = ExternalMetrics::start(&ns);
    metrics.set("pd_decode_queue", 5);
    wait_for(WAIT, "the external metrics API to answer through the aggregator", || {
        let path = format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/pd_decode_queue", ns.name);
        let o = cluster().kubectl(&["get", "--raw", &path]);
        o.status.success().then_some(()).ok_or_else(|| text(&o))
    });
    // 1 prefill and 2 decode; decode may not go past 3 (spec.scaling.decode.maxReplicas).
    let spec = format!("{}  scaling: {{decode: {{maxReplicas: 3}}}}\n", scaled(2));
    assert!(ns.apply(&spec).status.success());
    wait_counts(&ns, (1, 2), "the PDDeployment's unit");
    let hpa = serde_json::json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "decode"},
        "spec": {"scaleTargetRef": {"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDRole", "name": "scale-decode"},
            "minReplicas": 1, "maxReplicas": 6,
            "metrics": [{"type": "External", "external": {"metric": {"name": "pd_decode_queue"}, "target": {"type": "AverageValue", "averageValue": "10"}}}],
            "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0}, "scaleDown": {"stabilizationWindowSeconds": 0}}}});
    assert!(ns.apply(&hpa.to_string()).status.success());
    let hpa_state = || ns.get_json("hpa", "decode").map(|h| h["status"].to_string()).unwrap_or_default();
    wait_for(Duration::from_secs(120), "the HPA taking decode to 1, prefill untouched", || {
        let got = counts(&ns, "scale")?;
        (got == (1, 1)).then_some(()).ok_or_else(|| format!("{got:?}; hpa {}", hpa_state()))
    });
    // 50 queued: the HPA asks 5 decode, the role's maximum holds it at 3 and says so.
    metrics.set("pd_decode_queue", 50);
    wait_for(Duration::from_secs(120), "decode at its maximum of 3 with ScalingLimited", || {
        let got = counts(&ns, "scale")?;
        let (status, reason, _) = condition(&ns, "scale", "ScalingLimited")?;
        let asked = ns.get_json("pdrole", "scale-decode")?["spec"]["replicas"].as_i64().unwrap_or_default();
        (got == (1, 3) && asked > 3 && status == "True" && reason == "AboveMaxReplicas")
            .then_some(())
            .ok_or_else(|| format!("{got:?} asked {asked} {status} {reason}; hpa {}", hpa_state()))
    });
    // A re-applied PDDeployment leaves the HPA's count alone.
    assert!(ns.apply(&spec.replace("prefill: {replicas: 1", "prefill: {replicas: 2")).status.success());
    wait_counts(&ns, (2, 3), "prefill from the manifest, decode from the HPA");
}

/// A Hub source's config.json is read by a Job in the namespace, the token given to its pod
/// alone from the Secret, kept in an owned ConfigMap and judged on; a repository the Hub does
/// not hold, or a gated one without a token, is reported with the URL and the HTTP status, and no
/// engine pod (nor dry run) is created. The operator itself makes no request to the Hub. kwok
/// runs no container: the real `pd-operator read-model-config` is run here with the reading
/// Job's arguments against the stand-in Hub, and the stage `pd-model-read-modelled` ends the
/// reading pod with what it said (`common::hub::seeded`).
#[test]
fn a_hub_sources_config_json_is_read_kept_and_gates_the_engine_pods() {
    use common::hub::{GATED_TOKEN, HubStandIn, fixtures, seeded, spec};
    let ns = TestNamespace::new("hubcfg");
    let hub = HubStandIn::start(fixtures());
    let _ctl = ControllerProcess::start(&ns.name);
    let o = cluster().kubectl(&["create", "secret", "generic", "hf", "-n", &ns.name, &format!("--from-literal=token={GATED_TOKEN}")]);
    assert!(o.status.success(), "{}", text(&o));
    for (name, repo, more, token) in [
        ("mla", "acme/dsv3-gated", "tokenSecretRef: {name: hf}", Some(GATED_TOKEN)),
        ("missing", "acme/no-such-model", "", None),
        ("nokey", "acme/dsv3-gated", "", None),
    ] {
        let o = ns.apply(&seeded(&spec(name, &hub.endpoint, repo, more, "{tp: 8, dcp: 2}"), token));
        assert!(o.status.success(), "{name}: {}", text(&o));
    }
    let reads_here = hub.requests().len();
    let url = |repo: &str| format!("{}/{repo}/resolve/main/config.json", hub.endpoint);
    wait_condition(&ns, "mla", "ModelConfigResolved", "True");
    let (_, reason, message) = condition(&ns, "mla", "ModelConfigResolved").unwrap();
    assert_eq!(reason, "Resolved");
    assert!(message.contains(&url("acme/dsv3-gated")) && message.contains("kept in ConfigMap mla-model-config"), "{message}");
    let cm = ns.get_json("configmap", "mla-model-config").unwrap();
    let fixture: Value = serde_json::from_str(&common::hub::config("DeepseekV3ForCausalLM")).unwrap();
    assert_eq!(serde_json::from_str::<Value>(cm["data"]["config.json"].as_str().unwrap()).unwrap(), fixture);
    assert_eq!(cm["metadata"]["ownerReferences"][0]["name"], "mla");
    assert_eq!(cm["metadata"]["annotations"]["pd.inference.dev/model-config-url"], Value::from(url("acme/dsv3-gated")));
    // The reading Job is deleted once its copy is kept, so how it gets the token (by reference,
    // no API token of its own) is checked on the rendered Job: model_read's
    // `a_hub_sources_job_gets_the_url_and_the_token_by_reference_and_no_rights`.
    wait_condition(&ns, "mla", "Validated", "True");
    wait_for(WAIT, "mla's engine pods", || pods(&ns, "mla").and_then(|p| (p.len() == 2).then_some(()).ok_or(format!("{} pods", p.len()))));
    for (name, reason, status) in [("missing", "ConfigNotFound", "HTTP 404"), ("nokey", "Unauthorized", "HTTP 401")] {
        // False/Reading while the reader Job runs, then False with what it found.
        let (_, got, message) = wait_for(WAIT, &format!("{name}'s config.json read and refused"), || {
            let c = condition(&ns, name, "ModelConfigResolved")?;
            (c.0 == "False" && c.1 != "Reading").then_some(c.clone()).ok_or_else(|| format!("{c:?}"))
        });
        assert_eq!(got, reason, "{message}");
        let repo = if name == "missing" { "acme/no-such-model" } else { "acme/dsv3-gated" };
        assert!(message.contains(&format!("GET {}: {status}", url(repo))), "{message}");
        assert_eq!(condition(&ns, name, "Validated").unwrap().0, "Unknown");
    }
    // Nothing runs for what could not be judged: no engine pod, no dry-run pod.
    for name in ["missing", "nokey"] {
        let engines = names(&ns, "pods", &format!("pd.inference.dev/deployment={name},pd.inference.dev/role!=model-read")).unwrap();
        assert_eq!(engines, BTreeSet::new(), "{name}");
    }
    // The operator made no request to the Hub: the reads are this test's, for the reading pods.
    assert_eq!(hub.requests().len(), reads_here, "{:?}", hub.requests());
}

/// `spec.model.configMapRef` naming a ConfigMap that is not there (deleted after admission, or
/// applied where no webhook runs): the controller's finding names it, and no engine pod is made.
#[test]
fn a_config_map_ref_to_nothing_is_a_finding_that_names_it() {
    let ns = TestNamespace::new("cmref");
    let _ctl = ControllerProcess::start(&ns.name);
    let spec = "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: custom}\nspec:\n  model: {path: /models/custom, configMapRef: {name: absent}}\n  kvTransfer: {pageSize: 64}\n  prefill: {parallelism: {tp: 8}}\n  decode: {parallelism: {tp: 8}}\n";
    let o = ns.apply(spec);
    assert!(o.status.success(), "{}", text(&o));
    wait_condition(&ns, "custom", "Validated", "False");
    let (_, _, message) = condition(&ns, "custom", "Validated").unwrap();
    let finding = format!("spec.model.configMapRef: ConfigMap {}/absent does not exist (fix: create the ConfigMap", ns.name);
    assert!(message.contains(&finding), "{message}");
    assert_eq!(names(&ns, "pods", "pd.inference.dev/deployment=custom").unwrap(), BTreeSet::new());
}

/// Fetched once (`huggingFace.cache`): the fetch Job comes first and no engine pod is created
/// until it completes (`ModelReady`); two PDDeployments of one revision naming one claim share
/// one Job; the engines mount the claim read-only where `--model-path` points. kwok runs no
/// container: the stage `pd-model-fetch-modelled` ends the fetch pod with the fetch's report,
/// as the real `pd-operator fetch-model` does (tests/model_fetch.rs runs that one for real).
#[test]
fn a_cached_hub_source_is_fetched_once_before_any_engine_pod() {
    use common::hub::{HubStandIn, fixtures, seeded, spec};
    let ns = TestNamespace::new("fetch");
    let hub = HubStandIn::start(fixtures());
    let _ctl = ControllerProcess::start(&ns.name);
    let cache = "cache: {claimName: weights}";
    for name in ["a", "b"] {
        let o = ns.apply(&seeded(&spec(name, &hub.endpoint, "acme/qwen3-ft", cache, "{tp: 8}"), None));
        assert!(o.status.success(), "{name}: {}", text(&o));
    }
    // The claim does not exist yet: the Job's pod cannot be scheduled, the fetch waits.
    let jobs = || names(&ns, "jobs", "pd.inference.dev/role=model-fetch");
    wait_for(WAIT, "one fetch Job", || jobs().and_then(|j| (j.len() == 1).then_some(()).ok_or(format!("{j:?}"))));
    let job = jobs().unwrap().into_iter().next().unwrap();
    for name in ["a", "b"] {
        wait_condition(&ns, name, "ModelReady", "False");
        let (_, reason, message) = condition(&ns, name, "ModelReady").unwrap();
        assert_eq!(reason, "Fetching", "{message}");
        assert!(message.contains(&job) && message.contains("acme/qwen3-ft@main"), "{message}");
    }
    std::thread::sleep(Duration::from_secs(5));
    for name in ["a", "b"] {
        assert_eq!(pods(&ns, name).unwrap().len(), 0, "{name}: an engine pod before the weights are in the cache");
        let model = &ns.get_json("pdd", name).unwrap()["status"]["model"];
        assert_eq!((model["phase"].as_str(), model["job"].as_str()), (Some("Pending"), Some(job.as_str())), "{model}");
    }
    // The claim appears (a static volume binds it); kwok ends the fetch pod with its report.
    let pv = static_claim(&ns, "weights");
    for name in ["a", "b"] {
        wait_condition(&ns, name, "ModelReady", "True");
        let model = &ns.get_json("pdd", name).unwrap()["status"]["model"];
        assert_eq!(model["phase"], "Fetched", "{model}");
        assert_eq!(
            (model["bytes"].as_i64(), model["totalBytes"].as_i64(), model["files"].as_i64()),
            (Some(4_200_000), Some(4_200_000), Some(4))
        );
        wait_for(WAIT, &format!("{name}'s engine pods"), || {
            pods(&ns, name).and_then(|p| (p.len() == 2).then_some(()).ok_or(format!("{} pods", p.len())))
        });
        for p in pods(&ns, name).unwrap() {
            let spec = &p["spec"];
            let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "model").unwrap();
            assert_eq!(volume["persistentVolumeClaim"], serde_json::json!({"claimName": "weights", "readOnly": true}));
            let args = spec["containers"][0]["args"].as_array().unwrap();
            let at = args.iter().position(|a| a == "--model-path").unwrap();
            assert_eq!(args[at + 1], "/models/acme/qwen3-ft/main");
            let env = spec["containers"][0]["env"].to_string();
            assert!(!env.contains("HF_TOKEN") && !env.contains("HF_ENDPOINT"), "{env}");
        }
    }
    assert_eq!(jobs().unwrap().len(), 1, "shared, not fetched twice");
    let _ = cluster().kubectl(&["delete", "pv", &pv, "--wait=false"]);
}

/// Claim `claim` bound to a static hostPath volume of its own (the volume's name, to delete).
fn static_claim(ns: &TestNamespace, claim: &str) -> String {
    let pv = format!("{}-{claim}", ns.name);
    let volume = format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {pv}}}\nspec:\n  capacity: {{storage: 10Gi}}\n  accessModes: [ReadWriteMany]\n  storageClassName: ''\n  hostPath: {{path: /tmp/{pv}}}\n  claimRef: {{namespace: {ns}, name: {claim}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {claim}, namespace: {ns}}}\nspec:\n  accessModes: [ReadWriteMany]\n  storageClassName: ''\n  volumeName: {pv}\n  resources: {{requests: {{storage: 10Gi}}}}\n",
        ns = ns.name
    );
    let o = ns.apply(&volume);
    assert!(o.status.success(), "{}", text(&o));
    pv
}

/// A model on a volume the catalogue does not know (`source.pvc`): a Job beside the engines
/// reads its config.json, the operator keeps it in an owned ConfigMap and judges on it: the
/// seed's GQA + `dcp: 2` mistake is refused with SGLang's text, an MLA model is admitted and
/// served; a source without the file is reported as not read, never guessed, and nothing runs.
/// kwok runs no container: the stage `pd-model-read-modelled` ends the reading pod with the
/// text the test seeds in the template annotation `kwok.pd.inference.dev/model-config`, as the
/// real `pd-operator read-model-config` does (tests/e2e_kind.rs runs that one on real kubelets).
#[test]
fn a_mounted_sources_config_json_is_read_by_a_job_and_judged() {
    let ns = TestNamespace::new("volread");
    let pv = static_claim(&ns, "weights");
    let _ctl = ControllerProcess::start(&ns.name);
    let compact = |arch: &str| serde_json::from_str::<Value>(&common::hub::config(arch)).unwrap().to_string();
    let (gqa, mla) = (compact("Qwen3ForCausalLM"), compact("DeepseekV3ForCausalLM"));
    let spec = |name: &str, config: Option<&str>, decode: &str| {
        let seeded =
            config.map(|c| format!(", template: {{annotations: {{kwok.pd.inference.dev/model-config: '{c}'}}}}")).unwrap_or_default();
        format!(
            "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  model:\n    path: acme/{name}-ft\n    source: {{pvc: {{claimName: weights, path: {name}}}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}{seeded}}}\n  decode: {{parallelism: {decode}}}\n"
        )
    };
    for (name, config, decode) in
        [("gqa", Some(&gqa), "{tp: 8, dcp: 2}"), ("mla", Some(&mla), "{tp: 8, dcp: 2}"), ("absent", None, "{tp: 8}")]
    {
        let o = ns.apply(&spec(name, config.map(String::as_str), decode));
        assert!(o.status.success(), "{name}: {}", text(&o));
    }
    let origin = |name: &str| format!("PersistentVolumeClaim weights: /models/{name}/config.json");
    for (name, config) in [("gqa", &gqa), ("mla", &mla)] {
        wait_condition(&ns, name, "ModelConfigResolved", "True");
        let (_, _, message) = condition(&ns, name, "ModelConfigResolved").unwrap();
        assert!(message.contains(&origin(name)) && message.contains(&format!("kept in ConfigMap {name}-model-config")), "{message}");
        let cm = ns.get_json("configmap", &format!("{name}-model-config")).unwrap();
        assert_eq!(cm["data"]["config.json"], Value::from(config.as_str()), "the text the reader sent back");
        assert_eq!(cm["metadata"]["ownerReferences"][0]["name"], name);
    }
    wait_condition(&ns, "gqa", "Validated", "False");
    let (_, _, message) = condition(&ns, "gqa", "Validated").unwrap();
    assert!(message.contains("PD decode DCP requires an MLA or hybrid-MLA KV pool."), "{message}");
    wait_condition(&ns, "mla", "Validated", "True");
    wait_for(WAIT, "mla's engine pods", || pods(&ns, "mla").and_then(|p| (p.len() == 2).then_some(()).ok_or(format!("{} pods", p.len()))));
    // Reading, then not read once the Job failed (its retry included).
    let message = wait_for(WAIT, "absent's ModelConfigResolved=False ConfigNotRead", || {
        let (status, reason, message) = condition(&ns, "absent", "ModelConfigResolved")?;
        (status == "False" && reason == "ConfigNotRead").then_some(message.clone()).ok_or(format!("{status} {reason}: {message}"))
    });
    assert!(message.contains(&origin("absent")) && message.contains("no config.json at the source"), "{message}");
    assert_eq!(condition(&ns, "absent", "Validated").unwrap().0, "Unknown");
    for name in ["gqa", "absent"] {
        let engines = names(&ns, "pods", &format!("pd.inference.dev/deployment={name},pd.inference.dev/role in (prefill,decode)")).unwrap();
        assert_eq!(engines, BTreeSet::new(), "{name}: an engine pod for what was refused or not read");
    }
    let _ = cluster().kubectl(&["delete", "pv", &pv, "--wait=false"]);
}

/// A cache the operator claims (`{storageClassName, size}`): the claim is applied with the other
/// children, owned by the PDDeployment, and its fetch gates the engine pods as a named one does.
#[test]
fn a_cache_the_operator_claims_is_owned_and_mounted_by_every_engine_pod() {
    use common::hub::{HubStandIn, fixtures, seeded, spec};
    let ns = TestNamespace::new("claim");
    let hub = HubStandIn::start(fixtures());
    let _ctl = ControllerProcess::start(&ns.name);
    // A static volume of a class of this test's own stands for the class's provisioner.
    let class = format!("{}-cache", ns.name);
    let pv = format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {class}}}\nspec:\n  capacity: {{storage: 5Gi}}\n  accessModes: [ReadWriteMany]\n  storageClassName: {class}\n  hostPath: {{path: /tmp/{class}}}\n"
    );
    let o = cluster().kubectl_stdin(&["apply", "-f", "-"], &pv);
    assert!(o.status.success(), "{}", text(&o));
    let cache = format!("cache: {{storageClassName: {class}, size: 5Gi}}");
    let o = ns.apply(&seeded(&spec("c", &hub.endpoint, "acme/qwen3-ft", &cache, "{tp: 8}"), None));
    assert!(o.status.success(), "{}", text(&o));
    wait_condition(&ns, "c", "ModelReady", "True");
    let claims = names(&ns, "pvc", "pd.inference.dev/deployment=c").unwrap();
    assert_eq!(claims.len(), 1, "{claims:?}");
    let claim = claims.into_iter().next().unwrap();
    assert!(claim.starts_with("c-model-cache-"), "{claim}");
    let pvc = ns.get_json("pvc", &claim).unwrap();
    assert_eq!(pvc["metadata"]["ownerReferences"][0]["name"], "c");
    assert_eq!((pvc["spec"]["accessModes"][0].as_str(), pvc["status"]["phase"].as_str()), (Some("ReadWriteMany"), Some("Bound")));
    wait_for(WAIT, "c's engine pods", || pods(&ns, "c").and_then(|p| (p.len() == 2).then_some(()).ok_or(format!("{} pods", p.len()))));
    for p in pods(&ns, "c").unwrap() {
        let volume = p["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "model").cloned().unwrap();
        assert_eq!(volume["persistentVolumeClaim"]["claimName"].as_str(), Some(claim.as_str()));
    }
    let _ = cluster().kubectl(&["delete", "pv", &class, "--wait=false"]);
}
