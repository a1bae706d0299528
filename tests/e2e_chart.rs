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

/// The documents `helm template` renders from `template` with `--set` values `set`.
fn templated(template: &str, set: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["template", "rel", &*Box::leak(chart().into_boxed_str()), "--kube-version", KUBE_VERSION, "--namespace", "ops"];
    args.extend(["--show-only", template]);
    for s in set {
        args.extend(["--set", s]);
    }
    let o = cluster().helm(&args);
    assert!(o.status.success(), "{}", text(&o));
    serde_norway::Deserializer::from_slice(&o.stdout).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

/// Whether an RBAC object's rules grant `verb` on `plural` of `group`.
fn grants(role: &serde_json::Value, group: &str, plural: &str, verb: &str) -> bool {
    let has = |v: &serde_json::Value, x: &str| v.as_array().is_some_and(|a| a.iter().any(|e| e == x || e == "*"));
    let rules = role["rules"].as_array().cloned().unwrap_or_default();
    rules.iter().any(|r| has(&r["apiGroups"], group) && has(&r["resources"], plural) && has(&r["verbs"], verb))
}

/// Every namespaced resource the controller works with: the child kinds, pods, and its own.
fn namespaced_resources() -> Vec<(&'static str, &'static str)> {
    let own = [("", "pods"), ("pd.inference.dev", "pddeployments"), ("", "secrets"), ("events.k8s.io", "events")];
    pd_core::children::KINDS.iter().map(|k| (k.group, k.plural)).chain(own).collect()
}

#[test]
fn the_charts_cluster_role_grants_every_child_kind_what_the_controller_does_with_it() {
    let docs = templated("templates/rbac.yaml", &[]);
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").expect("the chart has a ClusterRole");
    let kinds = pd_core::children::KINDS.iter().map(|k| (k.group, k.plural)).chain([("", "pods")]);
    for (group, plural) in kinds {
        for verb in CHILD_VERBS {
            assert!(grants(role, group, plural, verb), "the chart's ClusterRole does not grant {verb} on {plural} ({group:?})");
        }
    }
    // No Secret anywhere: a Hub source's token reaches only the reading Job's pod, by reference
    // (`model_read`), so a PDDeployment cannot make the operator read a Secret of any namespace.
    for verb in ["get", "list", "watch"] {
        assert!(!grants(role, "", "secrets", verb), "the chart's ClusterRole grants {verb} on Secrets: {role:?}");
    }
}

/// Attack: with `watchNamespace` set the operator held every namespaced right in every
/// namespace (a ClusterRole), so a compromised operator reached tenants it never served.
#[test]
fn with_watch_namespace_no_cluster_role_grants_a_namespaced_resource() {
    let docs = templated("templates/rbac.yaml", &["watchNamespace=ml"]);
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        for (group, plural) in namespaced_resources() {
            for verb in ["get", "list", "watch", "create", "patch", "update", "delete"] {
                assert!(!grants(role, group, plural, verb), "a ClusterRole grants {verb} on {plural} ({group:?}): {role}");
            }
        }
        // What stays cluster-wide: the nodes the placement reads, the webhook's registration.
        assert!(grants(role, "", "nodes", "list"), "{role}");
    }
    let role = docs.iter().find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "ml").expect("a Role in the watched namespace");
    for (group, plural) in pd_core::children::KINDS.iter().map(|k| (k.group, k.plural)).chain([("", "pods")]) {
        for verb in CHILD_VERBS {
            assert!(grants(role, group, plural, verb), "the watched namespace's Role does not grant {verb} on {plural} ({group:?})");
        }
    }
    let binding = docs.iter().find(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == "ml").expect("its RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    // The webhook reviews only the namespace whose ConfigMaps the operator may read.
    let webhook = templated("templates/webhook.yaml", &["watchNamespace=ml"]);
    assert_eq!(webhook[0]["webhooks"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "ml");
}

/// Attack: any pod of the cluster could open connections to the operator's pods on any port.
#[test]
fn the_operators_pods_take_connections_only_on_the_webhook_and_metrics_ports() {
    let docs = templated("templates/networkpolicy.yaml", &[]);
    let spec = &docs[0]["spec"];
    assert_eq!(spec["podSelector"]["matchLabels"]["app.kubernetes.io/instance"], "rel");
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]), "egress stays open (the apiserver cannot be selected portably)");
    let ports: Vec<i64> = spec["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()))
        .collect();
    assert_eq!(ports, [9443, 8080]);
    let off = cluster().helm(&[
        "template",
        "rel",
        &chart(),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "networkPolicy.enabled=false",
        "--show-only",
        "templates/networkpolicy.yaml",
    ]);
    assert!(!off.status.success(), "networkPolicy.enabled=false still renders a policy");
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
    let label = format!("{}: {}", pd_api::labels::LABEL_COMPONENT, pd_api::labels::OPERATOR_COMPONENT);
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

/// Attack: the operator may create Roles and RoleBindings (for its sidecars, fetch Jobs and
/// routers), and RBAC lets it grant all it holds: a compromised operator could hand its Secret
/// reads to any identity. The chart's admission policies let it write only the three shapes.
#[test]
fn the_operator_can_write_only_the_roles_its_pddeployments_need() {
    let ns = TestNamespace::new("chart-vap");
    let rel = helm_install(&ns, &["--set", "replicaCount=0"]);
    let full = format!("{rel}-pd-operator");
    let _uninstall = scopeguard(rel, ns.name.clone());
    let kubeconfig = token_kubeconfig(&ns.name, &full);
    let as_operator = |yaml: String| {
        cluster().kubectl_stdin(&["--kubeconfig", kubeconfig.to_str().unwrap(), "apply", "--server-side", "-n", &ns.name, "-f", "-"], &yaml)
    };
    let role = |name: &str, group: &str, resource: &str, verbs: &str, names: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {name}}}\nrules:\n- {{apiGroups: [\"{group}\"], resources: [{resource}], verbs: [{verbs}]{names}}}\n"
        )
    };
    // RBAC alone lets the operator grant Secret reads (it holds them): the policy refuses.
    wait_for(Duration::from_secs(30), "the policy to refuse a Role granting Secret reads", || {
        let o = as_operator(role("m-router", "", "secrets", "get", ""));
        let t = text(&o);
        (!o.status.success() && t.contains("pd-operator may write only the Roles")).then_some(()).ok_or(t)
    });
    let o = as_operator(role("m-handshake", "", "pods/status", "get, patch", ", resourceNames: [other-pod]"));
    assert!(!o.status.success(), "a sidecar Role naming a pod of another PDDeployment was written: {}", text(&o));
    let binding = |name: &str, kind: &str, role: &str, subject: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {name}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: {kind}, name: {role}}}\nsubjects:\n{subject}\n"
        )
    };
    let user = "- {apiGroup: rbac.authorization.k8s.io, kind: User, name: mallory}";
    let o = as_operator(binding("m-handshake", "Role", "m-handshake", user));
    assert!(!o.status.success(), "a binding to a user was written: {}", text(&o));
    let o =
        as_operator(binding("m-router", "ClusterRole", "view", &format!("- {{kind: ServiceAccount, name: m, namespace: {}}}", ns.name)));
    assert!(!o.status.success(), "a binding to a ClusterRole was written: {}", text(&o));
    // What the operator does render passes.
    let o = as_operator(role("m-handshake", "", "pods/status", "get, patch", ", resourceNames: [m-decode-0-0, m-decode-1-0-s1]"));
    assert!(o.status.success(), "{}", text(&o));
    let o = as_operator(role("m-model-fetch", "batch", "jobs", "get, patch", ", resourceNames: [model-fetch-0123456789]"));
    assert!(o.status.success(), "{}", text(&o));
    let o = as_operator(role("m-router", "", "pods", "get, list, watch", ""));
    assert!(o.status.success(), "{}", text(&o));
    let sa = format!("- {{kind: ServiceAccount, name: m-decode, namespace: {}}}", ns.name);
    let o = as_operator(binding("m-handshake", "Role", "m-handshake", &sa));
    assert!(o.status.success(), "{}", text(&o));
}
