//! The admission webhook through the real apiserver, registered by URL to the host process.

use pd_testing as common;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;

use common::{ControllerProcess, TestNamespace, cluster, free_port, repo_path, text, wait_for};

/// A ValidatingWebhookConfiguration scoped to one test namespace; deleted on drop.
struct Registration {
    name: String,
}

impl Registration {
    fn new(ns: &str, port: u16) -> Self {
        let name = format!("pd-{ns}");
        let yaml = format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: {name}}}\nwebhooks:\n- name: validate.pd.inference.dev\n  clientConfig: {{url: 'https://127.0.0.1:{port}/validate'}}\n  rules: [{{apiGroups: [pd.inference.dev], apiVersions: [v1alpha1], resources: [pddeployments], operations: [CREATE, UPDATE]}}]\n  namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n  failurePolicy: Fail\n  sideEffects: None\n  admissionReviewVersions: [v1]\n  timeoutSeconds: 5\n"
        );
        let o = cluster().kubectl_stdin(&["apply", "-f", "-"], &yaml);
        assert!(o.status.success(), "{}", text(&o));
        Self { name }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["delete", "validatingwebhookconfiguration", &self.name, "--wait=false"]);
    }
}

fn start(ns: &TestNamespace) -> (Registration, ControllerProcess, u16) {
    start_with(ns, &[])
}

/// `start`, with more flags for the operator.
fn start_with(ns: &TestNamespace, extra: &[&str]) -> (Registration, ControllerProcess, u16) {
    let port = free_port();
    let reg = Registration::new(&ns.name, port);
    let webhook = ["--webhook-addr", &format!("127.0.0.1:{port}"), "--webhook-ip-sans", "127.0.0.1", "--webhook-config", &reg.name];
    let ctl = ControllerProcess::start_with(&ns.name, &[&webhook[..], extra].concat());
    // The operator generated its CA and patched it into the configuration.
    wait_for(Duration::from_secs(30), "the caBundle to be patched", || {
        let o =
            cluster().kubectl(&["get", "validatingwebhookconfiguration", &reg.name, "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}"]);
        (!o.stdout.is_empty()).then_some(()).ok_or_else(|| ctl.log_tail())
    });
    (reg, ctl, port)
}

/// The apiserver picks up a new configuration asynchronously: retry until the denial shows.
fn denied(ns: &TestNamespace, yaml: &str, expect: &str) -> String {
    wait_for(Duration::from_secs(30), &format!("a denial containing {expect:?}"), || {
        let o = ns.apply(yaml);
        if o.status.success() {
            let _ = cluster().kubectl_stdin(&["delete", "-n", &ns.name, "-f", "-", "--wait=true"], yaml);
            return Err(format!("admitted: {}", text(&o)));
        }
        let t = text(&o);
        t.contains(expect).then_some(t.clone()).ok_or(t)
    })
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_path(path)).unwrap()
}

#[test]
fn the_qwen_dcp_mistake_is_denied_with_sglang_text_and_nothing_is_stored() {
    let ns = TestNamespace::new("wh-deny");
    let (_reg, _ctl, _) = start(&ns);
    let err = denied(&ns, &read("examples/qwen-dcp2-mistake.yaml"), "PD decode DCP requires an MLA or hybrid-MLA KV pool.");
    assert!(err.contains("spec.decode.parallelism.dcp"), "{err}");
    assert!(err.contains("admission webhook \"validate.pd.inference.dev\" denied the request"), "{err}");
    assert!(ns.get_json("pdd", "qwen-pd").is_err(), "a denied object must not be stored");
    // The valid DeepSeek example is admitted; different TP on a GQA model is admitted with a warning.
    let o = ns.apply_file(&repo_path("examples/deepseek-v3-dcp.yaml"));
    assert!(o.status.success(), "{}", text(&o));
    let o = ns.apply_file(&repo_path("examples/llama-different-tp.yaml"));
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(
            "Warning: spec.decode.parallelism.tp: Performance is NOT guaranteed when using different TP sizes for non-MLA models."
        ),
        "{stderr}"
    );
    // UPDATE is checked too: breaking a stored object is denied.
    let broken = read("examples/deepseek-v3-dcp.yaml").replace("deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-32B");
    let err = denied(&ns, &broken, "PD decode DCP requires an MLA or hybrid-MLA KV pool.");
    assert!(err.contains("Qwen/Qwen3-32B"), "{err}");
}

/// A Qwen pair asking for gang scheduling (`placement.gang: workload`).
const GANG_WORKLOAD: &str = "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: gang}\nspec:\n  model: {path: Qwen/Qwen3-8B}\n  kvTransfer: {pageSize: 64}\n  prefill: {parallelism: {tp: 8}}\n  decode: {parallelism: {tp: 8}}\n  placement: {gang: workload}\n";

/// Whether this cluster serves Kubernetes' gang scheduling API (`hack/cluster.sh` enables it).
fn serves_gang_api() -> bool {
    let o = cluster().kubectl(&["get", "--raw", "/apis/scheduling.k8s.io/v1beta1"]);
    o.status.success() && String::from_utf8_lossy(&o.stdout).contains("\"podgroups\"")
}

#[test]
/// `gang: workload` where the operator finds no gang scheduling API is denied at admission, with
/// the text, field and fix the controller reports as Validated=False (`validate::gang_api`), and
/// nothing is stored. This cluster serves the API, so the operator is told to take it as absent
/// (`--workload-api=off`); asking the cluster, as by default, the same spec is admitted.
fn gang_workload_is_denied_at_admission_where_the_gang_api_is_not_served() {
    let ns = TestNamespace::new("wh-gang");
    let spec: pd_api::PDDeploymentSpec = serde_json::from_value(serde_json::json!({
        "model": {"path": "Qwen/Qwen3-8B"}, "kvTransfer": {"pageSize": 64},
        "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}}, "placement": {"gang": "workload"},
    }))
    .unwrap();
    let rule = pd_core::validate::gang_api(&spec, false).expect("the rule refuses gang: workload without the API").to_string();
    assert!(rule.starts_with("spec.placement.gang: workload, but this cluster does not serve Kubernetes' gang scheduling API"));
    {
        let (_reg, _ctl, _) = start_with(&ns, &["--workload-api=off"]);
        let err = denied(&ns, GANG_WORKLOAD, &rule);
        assert!(err.contains("admission webhook \"validate.pd.inference.dev\" denied the request"), "{err}");
        assert!(ns.get_json("pdd", "gang").is_err(), "a denied object must not be stored");
    }
    let served = serves_gang_api();
    let (_reg, _ctl, _) = start(&ns);
    if served {
        // The registration now names the new replica's port; the apiserver may still call the old one.
        wait_for(Duration::from_secs(30), "gang: workload admitted where the API is served", || {
            let o = ns.apply(GANG_WORKLOAD);
            o.status.success().then_some(()).ok_or_else(|| text(&o))
        });
    } else {
        denied(&ns, GANG_WORKLOAD, &rule);
    }
}

fn egress_spec(prometheus: &str, source: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: egress}}\nspec:\n  model: {{path: Qwen/Qwen3-8B{source}}}\n  \
         kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {{tp: 8}}}}\n  \
         scaling: {{prefill: {{minReplicas: 1, maxReplicas: 2}}, decode: {{minReplicas: 1, maxReplicas: 2}}}}\n  \
         autoscaling: {{mode: Recommend, prometheus: {{url: '{prometheus}'}}, slo: {{ttftP90Seconds: 1}}}}\n"
    )
}

/// A tenant naming the cloud metadata address, or a host the platform did not list, as its
/// Prometheus or Hub is denied at admission with the field, the platform's list and the fix, and
/// nothing is stored: the operator never queries it (on main it queried it every
/// `intervalSeconds` and copied the answer into the status). An in-cluster Service is admitted.
#[test]
fn addresses_the_platform_did_not_allow_are_denied_at_admission() {
    let ns = TestNamespace::new("wh-egress");
    let (_reg, _ctl, _) = start(&ns);
    let metadata = egress_spec("http://169.254.169.254/latest/meta-data/", "");
    denied(&ns, &metadata, "spec.autoscaling.prometheus.url: host 169.254.169.254 is a link-local address");
    let internal = egress_spec("http://10.0.0.1:9090", "");
    let err = denied(
        &ns,
        &internal,
        "spec.autoscaling.prometheus.url: http://10.0.0.1:9090 is not among the Prometheus hosts this operator may reach (*.svc, *.svc.cluster.local, http://127.0.0.1)",
    );
    assert!(err.contains("(fix: ask the platform team to add it with the chart value egress.prometheusHosts"), "{err}");
    let hub = egress_spec(
        "http://prometheus-operated.monitoring.svc:9090",
        ", source: {huggingFace: {repo: Qwen/Qwen3-8B, endpoint: 'http://metadata.google.internal'}}",
    );
    denied(&ns, &hub, "spec.model.source.huggingFace.endpoint: host metadata.google.internal is a cloud metadata service's name");
    assert!(ns.get_json("pdd", "egress").is_err(), "a denied object must not be stored");
    let allowed = egress_spec("http://prometheus-operated.monitoring.svc:9090", "");
    let o = ns.apply(&allowed);
    assert!(o.status.success(), "an in-cluster Prometheus is admitted: {}", text(&o));
}

fn custom(config_map: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: custom}}\nspec:\n  model: {{path: /models/custom, configMapRef: {{name: {config_map}}}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {{tp: 8, dcp: 2}}}}\n"
    )
}

fn config_map(name: &str, arch: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata:\n  config.json: '{{\"architectures\": [\"{arch}\"], \"num_attention_heads\": 64, \"num_key_value_heads\": 8}}'\n"
    )
}

#[test]
fn the_model_config_map_decides_and_a_missing_one_is_named() {
    let ns = TestNamespace::new("wh-config");
    let (_reg, _ctl, _) = start(&ns);
    assert!(ns.apply(&config_map("dsv3-config", "DeepseekV3ForCausalLM")).status.success());
    assert!(ns.apply(&config_map("llama-config", "LlamaForCausalLM")).status.success());
    let err = denied(&ns, &custom("missing-config"), "ConfigMap");
    assert!(err.contains(&format!("ConfigMap {}/missing-config does not exist", ns.name)), "{err}");
    let err = denied(&ns, &custom("llama-config"), "PD decode DCP requires an MLA or hybrid-MLA KV pool.");
    assert!(err.contains("LlamaForCausalLM, GQA"), "{err}");
    let o = ns.apply(&custom("dsv3-config"));
    assert!(o.status.success(), "DeepseekV3ForCausalLM from config.json turns dcp: 2 valid: {}", text(&o));
}

#[test]
fn malformed_and_oversized_bodies_get_a_400_with_a_reason() {
    let ns = TestNamespace::new("wh-bad");
    let (_reg, ctl, port) = start(&ns);
    let post = |data: &str| {
        let o = std::process::Command::new("curl")
            .args([
                "-sk",
                "--max-time",
                "10",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                data,
            ])
            .arg(format!("https://127.0.0.1:{port}/validate"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let r = post("not json");
    assert!(r.ends_with("\n400") && r.contains("not an AdmissionReview"), "{r}");
    let r = post("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}");
    assert!(r.ends_with("\n400") && r.contains("no request"), "{r}");
    let big = std::env::temp_dir().join(format!("big-{port}.json"));
    std::fs::write(&big, vec![b' '; 4 << 20]).unwrap();
    let r = post(&format!("@{}", big.display()));
    assert!(r.ends_with("\n400") && r.contains("limit"), "{r}");
    // Still serving afterwards.
    assert_eq!(ctl.get("/readyz").as_deref(), Some("ok"));
    let r = post("{}");
    assert!(r.ends_with("\n400"), "{r}");
}

/// Two replicas started at the same instant against an absent Secret, many times over: each
/// round ends with one CA in the Secret and the registration, and both replicas serving a
/// certificate that the registered bundle verifies (the kind tier once saw both mint their own).
#[test]
fn two_replicas_started_together_agree_on_one_ca_every_time() {
    const ROUNDS: usize = 8;
    let ns = TestNamespace::new("wh-race");
    let port = free_port();
    let reg = Registration::new(&ns.name, port);
    let ca_file = std::env::temp_dir().join(format!("{}-ca.pem", ns.name));
    for round in 0..ROUNDS {
        let secret = format!("race-{round}");
        let ports = [port, free_port()];
        let replicas: Vec<ControllerProcess> = ports
            .iter()
            .map(|p| {
                let args = ["--webhook-addr", &format!("127.0.0.1:{p}"), "--webhook-ip-sans", "127.0.0.1"];
                let args = [&args[..], &["--webhook-config", &reg.name, "--webhook-secret", &secret, "--leader-elect=false"]].concat();
                ControllerProcess::launch(&ns.name, &args, &cluster().kubeconfig, &[])
            })
            .collect();
        // Ready means: the registration trusts the served certificate.
        replicas.iter().for_each(ControllerProcess::wait_ready);
        let stored: Secret = serde_json::from_value(ns.get_json("secret", &secret).unwrap()).unwrap();
        let stored = stored.data.unwrap_or_default().remove("ca.crt").expect("ca.crt in the Secret").0;
        let o = cluster().kubectl(&["get", "validatingwebhookconfiguration", &reg.name, "-o", "json"]);
        let vwc: ValidatingWebhookConfiguration = serde_json::from_slice(&o.stdout).unwrap();
        let registered = vwc.webhooks.unwrap()[0].client_config.ca_bundle.clone().expect("a caBundle").0;
        assert_eq!(stored, registered, "round {round}: the registration holds another CA than the Secret");
        std::fs::write(&ca_file, &registered).unwrap();
        for p in ports {
            let o = std::process::Command::new("curl")
                .args(["-sS", "--max-time", "5", "--cacert", ca_file.to_str().unwrap(), &format!("https://127.0.0.1:{p}/healthz")])
                .output()
                .unwrap();
            assert!(o.status.success(), "round {round}: replica on {p} serves a certificate the registration does not trust: {}", text(&o));
        }
        let logs: String = replicas.iter().map(|r| std::fs::read_to_string(&r.log).unwrap_or_default()).collect();
        assert_eq!(logs.matches("generated a new webhook CA").count(), 1, "round {round}: exactly one replica mints the CA:\n{logs}");
    }
}

/// A Hub source's config.json is not read at admission: the webhook makes no request (the
/// stand-in Hub sees none) and admits with a warning that the controller judges it once a Job
/// read it; once the controller keeps it, an update is judged on it (the seed's GQA + `dcp: 2`
/// mistake refused for a fine-tune the catalogue does not know). kwok runs no container: the
/// reading pod ends with what the real reader said (`common::hub::seeded`).
#[test]
fn a_hub_source_is_admitted_unread_with_a_warning_then_judged_on_the_kept_copy() {
    use common::hub::{HubStandIn, fixtures, seeded, spec};
    let ns = TestNamespace::new("wh-hub");
    let hub = HubStandIn::start(fixtures());
    let (_reg, _ctl, _) = start(&ns);
    let gqa = spec("gqa", &hub.endpoint, "acme/qwen3-ft", "", "{tp: 8}");
    let read = seeded(&gqa, None);
    let reads_here = hub.requests().len();
    // The apiserver picks up the registration asynchronously: dry runs until the webhook answers.
    let o = wait_for(Duration::from_secs(30), "the webhook's warning", || {
        let o = cluster().kubectl_stdin(&["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"], &read);
        let t = text(&o);
        (o.status.success() && t.contains("Warning:")).then_some(t.clone()).ok_or(t)
    });
    let applied = ns.apply(&read);
    assert!(applied.status.success(), "{}", text(&applied));
    let url = format!("{}/acme/qwen3-ft/resolve/main/config.json", hub.endpoint);
    assert!(
        o.contains(&format!("Warning: spec.model.source.huggingFace: the config.json has not been read yet: {url} is read in the cluster")),
        "{o}"
    );
    assert_eq!(hub.requests().len(), reads_here, "the webhook made a request: {:?}", hub.requests());
    wait_for(Duration::from_secs(60), "gqa-model-config kept", || ns.get_json("configmap", "gqa-model-config").map(|_| ()));
    let mistake = read.replace("decode: {parallelism: {tp: 8}}", "decode: {parallelism: {tp: 8, dcp: 2}}");
    let err = denied(&ns, &mistake, "PD decode DCP requires an MLA or hybrid-MLA KV pool.");
    assert!(err.contains("spec.decode.parallelism.dcp"), "{err}");
    assert_eq!(hub.requests().len(), reads_here, "{:?}", hub.requests());
}

/// Today's attack on an admission webhook that reads what a spec names: an AdmissionReview
/// posted straight to the webhook's port, its object in namespace `victim` with a Hub source
/// at a host we own and `tokenSecretRef` naming the victim's database password. The webhook
/// reads no Secret and connects nowhere (the listener we own accepts nothing), and denies the
/// review for the namespace it names; the same source in the request's own namespace, even as
/// a server-side dry run through the apiserver, is admitted with the unread warning, still
/// without a connection.
#[test]
fn a_review_naming_another_namespace_and_a_secret_reaches_neither() {
    let ns = TestNamespace::new("wh-attack");
    let victim = TestNamespace::new("wh-victim");
    let o = cluster().kubectl(&["create", "secret", "generic", "db", "-n", &victim.name, "--from-literal=password=hunter2"]);
    assert!(o.status.success(), "{}", text(&o));
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let endpoint = format!("http://{}", trap.local_addr().unwrap());
    let (_reg, _ctl, port) = start(&ns);
    let object = |object_ns: &str| {
        serde_json::json!({"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "steal", "namespace": object_ns},
            "spec": {"model": {"path": "a/b", "source": {"huggingFace": {"repo": "a/b", "endpoint": endpoint,
                "tokenSecretRef": {"name": "db", "key": "password"}}}},
                "kvTransfer": {"pageSize": 64}, "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}}}})
    };
    let review = |object_ns: &str| {
        serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "pd.inference.dev", "version": "v1alpha1", "kind": "PDDeployment"},
                "resource": {"group": "pd.inference.dev", "version": "v1alpha1", "resource": "pddeployments"},
                "name": "steal", "namespace": ns.name, "operation": "CREATE", "userInfo": {}, "object": object(object_ns), "dryRun": true}})
        .to_string()
    };
    let post = |body: String| {
        let o = std::process::Command::new("curl")
            .args(["-sk", "--max-time", "10", "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", "@-"])
            .arg(format!("https://127.0.0.1:{port}/validate"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                std::io::Write::write_all(c.stdin.as_mut().unwrap(), body.as_bytes())?;
                drop(c.stdin.take());
                c.wait_with_output()
            })
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
    };
    let nothing_reached = |when: &str| match trap.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("{when}: the webhook connected to the host the spec named: {other:?}"),
    };
    let r = post(review(&victim.name));
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let message = r["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("metadata.namespace: \"{}\" is not the request's namespace \"{}\"", victim.name, ns.name)), "{r}");
    nothing_reached("the review naming another namespace");
    let r = post(review(&ns.name));
    assert_eq!(r["response"]["allowed"], true, "{r}");
    assert!(r["response"]["warnings"].to_string().contains("the config.json has not been read yet"), "{r}");
    nothing_reached("the review in its own namespace");
    let yaml = serde_json::to_string(&object(&ns.name)).unwrap();
    let o = wait_for(Duration::from_secs(30), "a server-side dry run with the webhook's warning", || {
        let o = cluster().kubectl_stdin(&["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"], &yaml);
        let t = text(&o);
        (o.status.success() && t.contains("has not been read yet")).then_some(t.clone()).ok_or(t)
    });
    assert!(o.contains("Warning: spec.model.source.huggingFace"), "{o}");
    nothing_reached("the dry run through the apiserver");
}

/// After SIGTERM the webhook keeps judging for its drain (`--webhook-drain`), /readyz saying so,
/// so that reviews the apiserver still sends to a terminating replica are answered; then the
/// process exits 0, no sooner than the drain.
#[test]
fn after_sigterm_the_webhook_keeps_judging_through_its_drain_then_exits_cleanly() {
    const DRAIN: Duration = Duration::from_secs(4);
    let ns = TestNamespace::new("wh-drain");
    let (_reg, mut ctl, port) = start_with(&ns, &["--webhook-drain", "4s"]);
    let mistake = read("examples/qwen-dcp2-mistake.yaml");
    denied(&ns, &mistake, "PD decode DCP requires an MLA or hybrid-MLA KV pool.");
    let stopped = std::time::Instant::now();
    ctl.terminate();
    wait_for(DRAIN, "/readyz to say the webhook drains", || match ctl.get_any("/readyz") {
        Some((503, body)) if body.contains("draining") => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let o = ns.apply(&mistake);
    assert!(!o.status.success() && text(&o).contains("PD decode DCP requires an MLA or hybrid-MLA KV pool."), "{}", text(&o));
    // HTTP/1.1, as the apiserver speaks to webhooks: the answer closes the connection.
    let o = std::process::Command::new("curl")
        .args(["-sk", "--http1.1", "--max-time", "5", "-D", "-", "-o", "/dev/null", "-X", "POST", "--data", "{}"])
        .arg(format!("https://127.0.0.1:{port}/validate"))
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&o.stdout).to_lowercase();
    assert!(headers.contains("\r\nconnection: close\r\n"), "a review answered while draining keeps its connection: {headers}");
    let valid = read("examples/qwen3-gqa.yaml");
    let o = cluster().kubectl_stdin(&["apply", "-n", &ns.name, "--dry-run=server", "-f", "-"], &valid);
    assert!(o.status.success(), "a valid object refused while draining: {}", text(&o));
    assert!(stopped.elapsed() < DRAIN, "the checks took past the drain ({:?}); nothing shown", stopped.elapsed());
    let status = ctl.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| panic!("still running 15 s after SIGTERM:\n{}", ctl.log_tail()));
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(stopped.elapsed() >= DRAIN, "stopped after {:?}, before its drain", stopped.elapsed());
}

/// A Qwen pair of two-pod instances (tp 8 over 4-GPU nodes), `replicas` of them on the decode.
fn many_decodes(replicas: u32) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: many}}\nspec:\n  model: {{path: Qwen/Qwen3-32B}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}, gpusPerNode: 4}}\n  decode: {{replicas: {replicas}, parallelism: {{tp: 8}}, gpusPerNode: 4}}\n"
    )
}

/// Today's main admits `replicas: 100000`, and its controller renders every pod in memory until it
/// is killed. The CRD's maximum refuses that count; one within it that still asks for more pods
/// than the operator allows is refused by the webhook, with the count.
#[test]
fn a_spec_asking_for_more_pods_than_the_operator_allows_is_denied_with_the_count() {
    let ns = TestNamespace::new("wh-pods");
    let (_reg, _ctl, _) = start_with(&ns, &["--max-pods-per-deployment", "100"]);
    let o = ns.apply(&many_decodes(100_000));
    assert!(!o.status.success(), "replicas 100000 admitted: {}", text(&o));
    assert!(text(&o).contains("100000"), "{}", text(&o));
    let err = denied(&ns, &many_decodes(1000), "spec asks for 2002 engine pods");
    assert!(err.contains("decode 1000 instances x 2 nodes"), "{err}");
    assert!(err.contains("this operator allows at most 100 per PDDeployment (operator flag --max-pods-per-deployment"), "{err}");
    assert!(ns.get_json("pdd", "many").is_err(), "a denied object must not be stored");
    let o = ns.apply(&many_decodes(40));
    assert!(o.status.success(), "82 pods are within the limit: {}", text(&o));
}

/// A DeepSeek-V3 pair whose prefill passes `prefill_args` in extraArgs, at attention DP `attn_dp`.
fn recipe(attn_dp: u32, prefill_args: &[&str]) -> String {
    let args = serde_json::to_string(prefill_args).unwrap();
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: recipe}}\nspec:\n  model: {{path: deepseek-ai/DeepSeek-V3}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8, attnDp: {attn_dp}}}, template: {{extraArgs: {args}}}}}\n  decode: {{parallelism: {{tp: 8}}}}\n"
    )
}

/// Issue #55: an option of SGLang's PD recipes whose precondition fails (two-batch overlap with
/// neither an EP all-to-all backend nor attention DP) is denied with SGLang's text and field;
/// admitted, the options admission leaves to the engine dry run are named in one warning that
/// reaches the client whole (within the 256 characters the apiserver may cut a warning to).
#[test]
fn recipe_options_are_judged_and_the_ones_left_to_the_dry_run_are_named() {
    use pd_core::validate::{options::MAX_WARNING_CHARS, texts};
    let ns = TestNamespace::new("wh-recipe");
    let (_reg, _ctl, _) = start(&ns);
    let err = denied(&ns, &recipe(1, &["--enable-two-batch-overlap"]), texts::TBO_NEEDS_ATTN_DP);
    assert!(err.contains(&format!("spec.prefill.template.extraArgs[0]: {}", texts::TBO_NEEDS_ATTN_DP)), "{err}");
    assert!(ns.get_json("pdd", "recipe").is_err(), "a denied object must not be stored");
    let many = [
        "--enable-two-batch-overlap",
        "--cuda-graph-max-bs-decode",
        "64",
        "--mem-fraction-static",
        "0.8",
        "--disable-cuda-graph",
        "--enable-torch-compile",
        "--disable-custom-all-reduce",
        "--enable-mixed-chunk",
        "--disable-overlap-schedule",
        "--skip-tokenizer-init",
        "--enable-cache-report",
        "--enable-p2p-check",
        "--enable-memory-saver",
    ];
    let o = ns.apply(&recipe(8, &many));
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let named: Vec<&str> = stderr.lines().filter(|l| l.contains("admission does not judge")).collect();
    assert_eq!(named.len(), 1, "{stderr}");
    let warning = named[0].strip_prefix("Warning: ").unwrap_or(named[0]);
    assert!(
        warning.starts_with("spec.*.template.extraArgs: admission does not judge --cuda-graph-max-bs-decode, --mem-fraction-static, "),
        "{warning}"
    );
    assert!(!warning.contains("--enable-two-batch-overlap"), "judged at admission: {warning}");
    assert!(warning.contains(" more: SGLang ") && warning.ends_with("(fix: see EngineVerified, docs/dry-run.md)"), "{warning}");
    assert!(warning.chars().count() <= MAX_WARNING_CHARS, "{} chars: {warning}", warning.chars().count());
}
