//! The Helm chart: lint, template, schema, install/uninstall, and the operator running under
//! the chart's least-privilege RBAC with the chart's webhook registration routed to it by URL.

use pd_testing as common;

use std::time::Duration;

use common::{ControllerProcess, TestNamespace, cluster, free_port, repo_path, text, token_kubeconfig, wait_for};

const KUBE_VERSION: &str = "1.37.2";

fn chart() -> String {
    repo_path("charts/pd-operator").to_str().unwrap().to_owned()
}

/// The verbs the controller uses on each child kind: a watch (list, watch), server-side apply
/// (get, create, patch) and deleting leftovers.
const CHILD_VERBS: [&str; 6] = ["get", "list", "watch", "create", "patch", "delete"];

#[test]
fn the_charts_cluster_role_grants_every_child_kind_what_the_controller_does_with_it() {
    let o = cluster().helm(&["template", "rel", &chart(), "--kube-version", KUBE_VERSION, "--show-only", "templates/rbac.yaml"]);
    assert!(o.status.success(), "{}", text(&o));
    let docs: Vec<serde_json::Value> =
        serde_norway::Deserializer::from_slice(&o.stdout).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect();
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").expect("the chart has a ClusterRole");
    let rules = role["rules"].as_array().unwrap();
    let grants = |group: &str, plural: &str, verb: &str| {
        let has = |v: &serde_json::Value, x: &str| v.as_array().is_some_and(|a| a.iter().any(|e| e == x));
        rules.iter().any(|r| has(&r["apiGroups"], group) && has(&r["resources"], plural) && has(&r["verbs"], verb))
    };
    let kinds = pd_core::children::KINDS.iter().map(|k| (k.group, k.plural)).chain([("", "pods")]);
    for (group, plural) in kinds {
        for verb in CHILD_VERBS {
            assert!(grants(group, plural, verb), "the chart's ClusterRole does not grant {verb} on {plural} ({group:?})");
        }
    }
    // The Hub token a model source names, read by name only.
    assert!(grants("", "secrets", "get") && !grants("", "secrets", "list"), "{rules:?}");
}

#[test]
fn chart_lints_and_templates_with_default_and_custom_values() {
    let c = cluster();
    for extra in [
        vec![],
        vec![
            "--set",
            "webhook.certManager.enabled=true,replicaCount=3,metrics.serviceMonitor.enabled=true,watchNamespace=ml,logFormat=text",
        ],
    ] {
        let mut args = vec!["lint", "--strict"];
        args.push(&*Box::leak(chart().into_boxed_str()));
        args.extend(extra.iter().copied());
        let o = c.helm(&args);
        assert!(o.status.success(), "{}", text(&o));
        assert!(!text(&o).contains("[WARNING]") && !text(&o).contains("[ERROR]"), "{}", text(&o));
    }
    let o = c.helm(&["template", "rel", &chart(), "--kube-version", KUBE_VERSION, "--namespace", "ops"]);
    assert!(o.status.success(), "{}", text(&o));
    let y = String::from_utf8_lossy(&o.stdout);
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "PodDisruptionBudget",
    ] {
        assert!(y.contains(&format!("kind: {kind}\n")), "default render lacks {kind}");
    }
    assert!(y.contains("replicas: 2") && y.contains("--leader-elect=true") && y.contains("name: rel-pd-operator-webhook"));
    assert!(y.contains("readOnlyRootFilesystem: true") && y.contains("runAsNonRoot: true") && y.contains("drop: [ALL]"));
    // The engines' NetworkPolicy lets the operator's own scrape in by this label.
    let label = format!("{}: {}", pd_core::render::LABEL_COMPONENT, pd_core::render::OPERATOR_COMPONENT);
    assert!(y.contains(&label), "the operator's pods lack {label}");
    let o = c.helm(&[
        "template",
        "rel",
        &chart(),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "webhook.certManager.enabled=true,webhook.url=https://127.0.0.1:9443/validate,metrics.serviceMonitor.enabled=true",
    ]);
    let y = String::from_utf8_lossy(&o.stdout);
    assert!(y.contains("kind: Certificate") && y.contains("cert-manager.io/inject-ca-from") && y.contains("--webhook-cert-dir=/tls"));
    assert!(y.contains("url: \"https://127.0.0.1:9443/validate\"") && y.contains("kind: ServiceMonitor"));
}

#[test]
fn helm_templates_the_chart_without_being_told_a_kubernetes_version() {
    // The project's helm is built with its Kubernetes version (hack/tools.sh); a helm left at its
    // default (v1.20) fails the chart's kubeVersion constraint.
    let o = cluster().helm(&["template", "rel", &chart()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("kind: Deployment\n"));
}

#[test]
fn bad_values_are_refused_by_the_schema_with_a_readable_message() {
    let c = cluster();
    for (set, expect) in [
        ("replicaCount=two", "/replicaCount': got string, want integer"),
        ("webhook.failurePolicy=Sometimes", "/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'"),
        ("webhook.url=http://insecure", "/webhook/url"),
        ("imagePullPolicy=Always", "additional properties 'imagePullPolicy' not allowed"),
    ] {
        let o = c.helm(&["template", "rel", &chart(), "--kube-version", KUBE_VERSION, "--set", set]);
        assert!(!o.status.success(), "{set} was accepted");
        assert!(text(&o).contains(expect), "{set}: {}", text(&o));
    }
}

#[test]
fn the_chart_crd_is_the_top_level_crd() {
    assert_eq!(
        std::fs::read_to_string(repo_path("charts/pd-operator/crds/pddeployment.yaml")).unwrap(),
        std::fs::read_to_string(repo_path("crds/pddeployment.yaml")).unwrap()
    );
}

#[test]
fn rendered_manifests_pass_a_server_side_dry_run() {
    let ns = TestNamespace::new("chart-dry");
    let o = cluster().helm(&["template", "dry", &chart(), "--kube-version", KUBE_VERSION, "--namespace", &ns.name]);
    assert!(o.status.success(), "{}", text(&o));
    let o = cluster().kubectl_stdin(&["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"], &String::from_utf8_lossy(&o.stdout));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("validatingwebhookconfiguration.admissionregistration.k8s.io/dry-pd-operator created (server dry run)"),
        "{}",
        text(&o)
    );
}

fn selector_for(ns: &str) -> String {
    format!("webhook.namespaceSelector={{\"matchLabels\":{{\"kubernetes.io/metadata.name\":\"{ns}\"}}}}")
}

/// Installs the chart into the test namespace, its webhook scoped to that namespace only (so a
/// registration without a live backend never blocks other tests); returns the release name.
fn helm_install(ns: &TestNamespace, extra: &[&str]) -> String {
    let rel = format!("r{}", &ns.name[ns.name.len() - 6..]);
    let selector = selector_for(&ns.name);
    let chart = chart();
    let mut args = vec!["install", rel.as_str(), chart.as_str(), "-n", ns.name.as_str(), "--set-json", selector.as_str()];
    args.extend_from_slice(extra);
    let o = cluster().helm(&args);
    assert!(o.status.success(), "{}", text(&o));
    rel
}

#[test]
fn helm_install_runs_and_uninstall_leaves_only_the_crd() {
    let ns = TestNamespace::new("chart-install");
    let rel = helm_install(&ns, &["--set", "image.tag=e2e", "--wait", "--timeout", "120s"]);
    let full = format!("{rel}-pd-operator");
    let o = cluster().kubectl(&["get", "deployment", &full, "-n", &ns.name, "-o", "jsonpath={.status.readyReplicas}"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "2", "under kwok the operator pods only report Running/Ready");
    let o = cluster().helm(&["uninstall", &rel, "-n", &ns.name, "--wait"]);
    assert!(o.status.success(), "{}", text(&o));
    for (kind, name) in
        [("clusterrole", full.as_str()), ("clusterrolebinding", full.as_str()), ("validatingwebhookconfiguration", full.as_str())]
    {
        let o = cluster().kubectl(&["get", kind, name]);
        assert!(!o.status.success() && text(&o).contains("NotFound"), "{kind}/{name} left behind: {}", text(&o));
    }
    let o = cluster().kubectl(&[
        "get",
        "all,serviceaccount,role,rolebinding,pdb",
        "-n",
        &ns.name,
        "-l",
        &format!("app.kubernetes.io/instance={rel}"),
        "-o",
        "name",
    ]);
    assert!(o.stdout.is_empty(), "left behind: {}", text(&o));
    assert!(cluster().kubectl(&["get", "crd", "pddeployments.pd.inference.dev"]).status.success(), "the CRD stays by design");
}

#[test]
fn the_operator_runs_under_the_charts_rbac_and_its_webhook_registration() {
    let ns = TestNamespace::new("chart-rbac");
    let port = free_port();
    let url = format!("webhook.url=https://127.0.0.1:{port}/validate");
    let rel = helm_install(&ns, &["--set", "replicaCount=0", "--set", &url]);
    let full = format!("{rel}-pd-operator");
    let _uninstall = scopeguard(rel.clone(), ns.name.clone());

    let kubeconfig = token_kubeconfig(&ns.name, &full);
    let sa = format!("system:serviceaccount:{}:{full}", ns.name);
    let o = cluster().kubectl(&["auth", "can-i", "list", "secrets", "--all-namespaces", "--as", &sa]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "no", "the operator must not read every Secret");

    let args = common::chart_operator_args(&full, port);
    let ctl = ControllerProcess::start_as(&ns.name, &args.iter().map(String::as_str).collect::<Vec<_>>(), &kubeconfig);
    // The chart's registration routes real admission requests to the host process.
    let mistake = std::fs::read_to_string(repo_path("examples/qwen-dcp2-mistake.yaml")).unwrap();
    wait_for(Duration::from_secs(45), "the chart's webhook to deny the Qwen dcp: 2 example", || {
        let o = ns.apply(&mistake);
        let t = text(&o);
        if o.status.success() {
            let _ = cluster().kubectl(&["delete", "pdd", "qwen-pd", "-n", &ns.name]);
        }
        (!o.status.success() && t.contains("PD decode DCP requires an MLA or hybrid-MLA KV pool."))
            .then_some(())
            .ok_or(format!("{t}\n{}", ctl.log_tail()))
    });
    // And the controller reconciles under the same least-privilege identity.
    assert!(ns.apply_file(&repo_path("examples/deepseek-v3-dcp.yaml")).status.success());
    wait_for(Duration::from_secs(90), "PrefillAvailable and DecodeAvailable under the chart's RBAC", || {
        let v = ns.get_json("pdd", "dsv3")?;
        let ok = ["PrefillAvailable", "DecodeAvailable"]
            .iter()
            .all(|t| v["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == *t && c["status"] == "True")));
        ok.then_some(()).ok_or_else(|| format!("{}\n{}", v["status"], ctl.log_tail()))
    });
    let log = std::fs::read_to_string(&ctl.log).unwrap_or_default();
    assert!(!log.contains("forbidden"), "an RBAC denial was logged:\n{}", ctl.log_tail());
    let o = cluster().kubectl(&["get", "events", "-n", &ns.name, "-o", "jsonpath={.items[*].reason}"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("InstancesCreated"), "events are published under the chart's RBAC");
}

/// Uninstalls a release when dropped, so a failing test leaves no cluster-scoped objects.
struct Uninstall(String, String);
fn scopeguard(rel: String, ns: String) -> Uninstall {
    Uninstall(rel, ns)
}
impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = cluster().helm(&["uninstall", &self.0, "-n", &self.1]);
    }
}
