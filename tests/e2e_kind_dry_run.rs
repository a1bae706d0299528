//! The engine dry run on a real kubelet (docs/dry-run.md): the dry-run pod runs a locally built
//! engine image holding SGLang 0.5.22's own code from its PyPI wheel (hack/sglang-cpu-image.sh),
//! the shim in it runs that release's start-up resolution and handshake on exactly the argv the
//! operator renders, and the controller reads the verdict from the container's termination
//! message. Run by `make e2e-kind` (hack/kind-e2e.sh loads the image and sets
//! `PD_KIND_SGLANG_CPU_IMAGE` and `PD_KIND_SGLANG_CPU_CUSTOM_IMAGE`: one image under a tag that
//! names its release and under one that does not). Ignored under `make test`.

use pd_testing as common;

use std::time::Duration;

use common::{RESTRICTED_CONTAINER, TestNamespace, cluster, condition, repo_path, text, wait_for};
use serde_json::{Value, json};

/// The dry-run pod imports torch and SGLang for each process on the kind node's two cores, beside
/// the tier's other tests.
const WAIT: Duration = Duration::from_secs(420);
const NAME: &str = "engine";
/// An option SGLang 0.5.23 has and 0.5.22 does not (src/core/sglang_flags).
const NEWER_FLAG: &str = "--enable-http-worker-reuseport";

fn image(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var}: run through `make e2e-kind`"))
}

/// A Qwen3 pair on SGLang engines, its config.json from a ConfigMap (nothing fetched), the dry
/// run left at its default for `engine.type: sglang` (Required); both templates meet the
/// `restricted` Pod Security Standard, as a tenant of a restricted namespace writes them.
fn objects(image: &str, extra: &[&str]) -> String {
    let config = std::fs::read_to_string(repo_path("tests/parity/configs/Qwen3ForCausalLM.json")).unwrap();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "qwen-config"}, "data": {"config.json": config}});
    let extra = serde_json::to_string(extra).unwrap();
    format!(
        "{cm}\n---\napiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {NAME}}}\nspec:\n  engine: {{type: sglang, image: '{image}'}}\n  model: {{path: Qwen/Qwen3-8B, configMapRef: {{name: qwen-config, key: config.json}}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{replicas: 1, parallelism: {{tp: 1}}, template: {{extraArgs: {extra}, securityContext: {RESTRICTED_CONTAINER}}}}}\n  decode: {{replicas: 1, parallelism: {{tp: 1}}, template: {{securityContext: {RESTRICTED_CONTAINER}}}}}\n  router: {{enabled: false}}\n"
    )
}

fn events(ns: &TestNamespace) -> String {
    let o =
        cluster().kubectl(&["get", "events", "-n", &ns.name, "-o", "jsonpath={range .items[*]}{.reason}: {.note}{.message}{\"\\n\"}{end}"]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A dry-run pod whose container has not ended and which is not being deleted (the controller
/// reads the verdict from the ended container and deletes the pod, which may still say Running).
fn under_way(pod: &Value) -> bool {
    let ended = pod["status"]["containerStatuses"].as_array().is_some_and(|cs| cs.iter().all(|c| c["state"]["terminated"].is_object()));
    pod["metadata"]["deletionTimestamp"].is_null() && !ended && !matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

/// Waits for the verdict of the dry run whose key differs from `old_key`, with `EngineVerified`
/// at `status`; on every look, no engine pod may exist while a dry-run pod is under way. Returns
/// the PDDeployment.
fn verdict(ns: &TestNamespace, old_key: Option<&str>, status: &str) -> Value {
    wait_for(WAIT, &format!("EngineVerified={status} from a new dry run, no engine pod before"), || {
        let engines = ns.role_pods(NAME, "prefill,decode");
        let running: Vec<Value> = ns.role_pods(NAME, "dry-run").into_iter().filter(under_way).collect();
        if !engines.is_empty() && !running.is_empty() {
            panic!("{} engine pods beside a dry run under way: {running:?}\nevents:\n{}", engines.len(), events(ns));
        }
        let v = ns.get_json("pdd", NAME)?;
        let ev = &v["status"]["engineVerification"];
        let c = condition(&v, "EngineVerified").ok_or_else(|| v["status"].to_string())?;
        let fresh = ev["key"].as_str().is_some_and(|k| Some(k) != old_key);
        (fresh && c["status"] == status && ev["pod"].is_null()).then_some(v.clone()).ok_or_else(|| format!("{ev} {c}"))
    })
}

#[test]
#[ignore = "needs the kind tier: make e2e-kind"]
fn sglangs_own_code_in_the_engine_image_refuses_extra_args_before_any_engine_pod_and_passes_the_fix() {
    let ns = TestNamespace::new("kind-dry-run");
    // In a namespace enforcing `restricted`: the dry-run pod runs as the prefill template's user,
    // so Pod Security admits it and SGLang's code in the image runs without root.
    ns.enforce_restricted();
    // A custom build whose release pd-operator cannot tell from its tag: admitted with a warning,
    // judged by 0.5.23's rules, under which the flag exists; the image runs 0.5.22.
    let o = ns.apply(&objects(&image("PD_KIND_SGLANG_CPU_CUSTOM_IMAGE"), &[NEWER_FLAG]));
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("cannot be told from its tag"), "no warning naming what was judged: {out}");
    let refused = verdict(&ns, None, "False");
    let c = condition(&refused, "EngineVerified").unwrap();
    assert_eq!(c["reason"], "EngineRefused", "{c}");
    let message = c["message"].as_str().unwrap();
    let want = format!("prefill node 0 on H100: SGLang refused it at parse: SystemExit: unrecognized arguments: {NEWER_FLAG}");
    assert!(message.contains(&want), "{message}");
    let ev = &refused["status"]["engineVerification"];
    assert_eq!(ev["result"], "EngineRefused", "{ev}");
    assert_eq!(ev["sglangVersion"], "0.5.22", "the image's own code reports its release: {ev}");
    assert!(ev["imageId"].as_str().is_some_and(|i| i.contains("sha256:")), "{ev}");
    wait_for(Duration::from_secs(60), "the EngineRefused Event with SGLang's text", || {
        let e = events(&ns);
        e.lines().any(|l| l.starts_with("EngineRefused:") && l.contains(NEWER_FLAG)).then_some(()).ok_or(e)
    });
    std::thread::sleep(Duration::from_secs(5));
    assert!(ns.role_pods(NAME, "prefill,decode").is_empty(), "a refusal stands: no engine pod");

    // The fix: the image's tag names its release, the flag is gone. SGLang 0.5.22 accepts both
    // processes and the handshake between them, and only then do the engine pods exist.
    let o = ns.apply(&objects(&image("PD_KIND_SGLANG_CPU_IMAGE"), &[]));
    assert!(o.status.success(), "{}", text(&o));
    let passed = verdict(&ns, ev["key"].as_str(), "True");
    let c = condition(&passed, "EngineVerified").unwrap();
    assert_eq!(c["reason"], "Verified", "{c}");
    assert_eq!(passed["status"]["engineVerification"]["sglangVersion"], "0.5.22");
    let engines = wait_for(Duration::from_secs(60), "the engine pods after the verdict", || {
        let p = ns.role_pods(NAME, "prefill,decode");
        (p.len() == 2).then_some(p.clone()).ok_or_else(|| format!("{} engine pods", p.len()))
    });
    for p in &engines {
        let engine = p["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == "engine").cloned();
        assert_eq!(engine.map(|c| c["image"].clone()), Some(json!(image("PD_KIND_SGLANG_CPU_IMAGE"))), "{}", p["spec"]);
    }
    ns.assert_no_pod_security_refusal();
    // They would start SGLang without GPU kernels: delete them before they take the node's CPU.
    let o = cluster().kubectl(&["delete", "pdd", NAME, "-n", &ns.name, "--wait=false"]);
    assert!(o.status.success(), "{}", text(&o));
}
