//! The chaos tier (`make chaos`): control-plane and operator faults on a cluster of its own.
//!
//! Every case runs the operator as two replicas under the chart's RBAC (the chart installed with
//! `replicaCount=0`, the replicas as host processes holding its ServiceAccount's token), leader
//! election on and the chart's webhook registration pointed at replica A. After each fault:
//! reconciling resumes within 30 s, every PDDeployment converges to exactly the children
//! `pd-operator render` prints (none duplicated, none orphaned), and the replicas fall back to
//! writing nothing. Each case prints its time to recover as a `[chaos]` line.
//!
//! Runs only through `hack/chaos.sh`, which starts the cluster these tests kill parts of
//! (`PD_CHAOS_CLUSTER_DIR`); `cargo test` skips this binary (`test = false` in Cargo.toml).

use pd_testing as common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{ControllerProcess, TestNamespace, cluster, free_port, repo_path, text, token_kubeconfig, wait_for};
use serde_json::Value;

/// The bound the issue sets on resuming after a fault.
const RESUME_WITHIN: Duration = Duration::from_secs(30);
const CONVERGE: Duration = Duration::from_secs(120);
/// After convergence the replicas must show a quiet window this long within `QUIET_WITHIN`.
const QUIET_WINDOW: Duration = Duration::from_secs(20);
const QUIET_WITHIN: Duration = Duration::from_secs(60);
const EXAMPLE: &str = "examples/qwen3-gqa.yaml";

fn control_plane(action: &str, component: &str) {
    let dir = std::env::var("PD_CHAOS_CLUSTER_DIR").expect("the chaos tier runs through hack/chaos.sh (PD_CHAOS_CLUSTER_DIR)");
    let o = Command::new(repo_path("hack/cluster.sh")).args([action, component]).env("PD_CLUSTER_DIR", dir).output().unwrap();
    assert!(o.status.success(), "hack/cluster.sh {action} {component}: {}", text(&o));
}

fn apply_example(ns: &TestNamespace, name: &str) {
    let spec = std::fs::read_to_string(repo_path(EXAMPLE)).unwrap().replace("name: qwen3", &format!("name: {name}"));
    let o = ns.apply(&spec);
    assert!(o.status.success(), "{}", text(&o));
}

fn report(case: &str, what: &str, took: Duration) {
    eprintln!("[chaos] {case}: {what} in {:.1}s", took.as_secs_f64());
}

/// The chart's RBAC and webhook registration, and two operator replicas under them.
struct Operator {
    ns: TestNamespace,
    release: String,
    replicas: Vec<ControllerProcess>,
}

impl Operator {
    fn install(prefix: &str) -> Self {
        Self::install_in(TestNamespace::new(prefix))
    }

    fn install_in(ns: TestNamespace) -> Self {
        let release = format!("c{}", &ns.name[ns.name.len() - 6..]);
        let port = free_port();
        let selector = format!("webhook.namespaceSelector={{\"matchLabels\":{{\"kubernetes.io/metadata.name\":\"{}\"}}}}", ns.name);
        let url = format!("webhook.url=https://127.0.0.1:{port}/validate");
        let chart = repo_path("charts/pd-operator");
        let o = cluster().helm(&[
            "install",
            &release,
            chart.to_str().unwrap(),
            "-n",
            &ns.name,
            "--set",
            "replicaCount=0",
            "--set",
            &url,
            "--set-json",
            &selector,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let full = format!("{release}-pd-operator");
        let kubeconfig = token_kubeconfig(&ns.name, &full);
        let replica = |identity: &str, webhook_port: u16| {
            let mut args = common::chart_operator_args(&full, webhook_port);
            args.push("--leader-elect=true".into());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ControllerProcess::launch(&ns.name, &args, &kubeconfig, &[("POD_NAME", identity)])
        };
        let replicas = vec![replica("replica-a", port), replica("replica-b", free_port())];
        replicas.iter().for_each(ControllerProcess::wait_ready);
        let op = Self { ns, release, replicas };
        op.leader();
        op
    }

    /// The index of the one replica that leads; waits for exactly one.
    fn leader(&self) -> usize {
        wait_for(RESUME_WITHIN + Duration::from_secs(15), "exactly one leading replica", || {
            let leads: Vec<Option<bool>> = self.replicas.iter().map(ControllerProcess::leads).collect();
            match leads.iter().filter(|l| **l == Some(true)).count() {
                1 => Ok(leads.iter().position(|l| *l == Some(true)).unwrap()),
                _ => Err(format!("{leads:?}\n{}", self.logs())),
            }
        })
    }

    fn writes(&self) -> u64 {
        self.replicas.iter().map(ControllerProcess::api_writes).sum()
    }

    fn logs(&self) -> String {
        self.replicas.iter().map(|r| format!("--- {}\n{}", r.log.display(), r.log_tail())).collect::<Vec<_>>().join("\n")
    }

    fn apply_example(&self, name: &str) {
        apply_example(&self.ns, name);
    }

    fn scale_decode(&self, name: &str, replicas: u32) {
        let patch = format!("{{\"spec\":{{\"decode\":{{\"replicas\":{replicas}}}}}}}");
        let o = cluster().kubectl(&["patch", "pdd", name, "-n", &self.ns.name, "--type=merge", "-p", &patch]);
        assert!(o.status.success(), "{}", text(&o));
    }

    fn pod_count(&self, pdd: &str) -> usize {
        let o = cluster().kubectl(&["get", "pods", "-n", &self.ns.name, "-l", &format!("pd.inference.dev/deployment={pdd}"), "-o", "name"]);
        String::from_utf8_lossy(&o.stdout).lines().count()
    }

    /// Waits until every PDDeployment's status is current and its children are exactly the
    /// rendered ones; then until the replicas write nothing for `QUIET_WINDOW`.
    fn converged(&self, case: &str, what: &str, since: Instant) {
        wait_for(CONVERGE, "every PDDeployment converged to exactly its rendered children", || self.drift());
        report(case, &format!("every PDDeployment converged {what}"), since.elapsed());
        let quiet_since = Instant::now();
        let mut window = (Instant::now(), self.writes());
        wait_for(QUIET_WITHIN, "the replicas to stop writing", || {
            let writes = self.writes();
            if writes != window.1 {
                window = (Instant::now(), writes);
            }
            (window.0.elapsed() >= QUIET_WINDOW).then_some(()).ok_or_else(|| format!("{writes} writes so far\n{}", self.logs()))
        });
        report(case, "writes back to idle", quiet_since.elapsed());
        assert_eq!(self.drift(), Ok(()), "children changed while idle");
    }

    /// Ok when every PDDeployment's status is current and available and the namespace holds
    /// exactly the rendered children; otherwise what differs.
    fn drift(&self) -> Result<(), String> {
        let o = cluster().kubectl(&["get", "pdd", "-n", &self.ns.name, "-o", "json"]);
        let list: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
        let mut want: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for pdd in list["items"].as_array().cloned().unwrap_or_default() {
            status_current(&pdd)?;
            for (kind, names) in rendered(&pdd, &self.ns.name) {
                want.entry(kind).or_default().extend(names);
            }
        }
        let have = children(&self.ns.name)?;
        (have == want).then_some(()).ok_or_else(|| format!("children differ from render:\nhave {have:?}\nwant {want:?}"))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.replicas.clear();
        let _ = cluster().helm(&["uninstall", &self.release, "-n", &self.ns.name]);
    }
}

fn status_current(pdd: &Value) -> Result<(), String> {
    let name = pdd["metadata"]["name"].as_str().unwrap_or_default();
    let status = &pdd["status"];
    if status["observedGeneration"] != pdd["metadata"]["generation"] {
        return Err(format!("{name}: status of generation {} for {}", status["observedGeneration"], pdd["metadata"]["generation"]));
    }
    for type_ in ["PrefillAvailable", "DecodeAvailable"] {
        let ok = status["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"));
        if !ok {
            return Err(format!("{name}: {type_} not True: {status}"));
        }
    }
    Ok(())
}

const CHILD_KINDS: [&str; 4] = ["Pod", "Service", "ConfigMap", "Deployment"];

/// Names per kind of what `pd-operator render` prints for `pdd` (router pods come from their
/// Deployment and are left out).
fn rendered(pdd: &Value, ns: &str) -> BTreeMap<String, BTreeSet<String>> {
    let file = std::env::temp_dir().join(format!("chaos-{ns}-{}.json", pdd["metadata"]["name"].as_str().unwrap_or_default()));
    let spec = serde_json::json!({"apiVersion": pdd["apiVersion"], "kind": "PDDeployment", "metadata": {"name": pdd["metadata"]["name"]}, "spec": pdd["spec"]});
    std::fs::write(&file, spec.to_string()).unwrap();
    let mut names = common::rendered_names(&file, ns);
    names.retain(|kind, _| CHILD_KINDS.contains(&kind.as_str()));
    names
}

/// Names per kind of the operator's children in `ns` (router pods left out, as in `rendered`).
fn children(ns: &str) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let o = cluster().kubectl(&[
        "get",
        "pods,services,configmaps,deployments",
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/managed-by=pd-operator,pd.inference.dev/role notin (router)",
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for item in list["items"].as_array().cloned().unwrap_or_default() {
        let kind = item["kind"].as_str().unwrap_or_default().to_owned();
        out.entry(kind).or_default().insert(item["metadata"]["name"].as_str().unwrap_or_default().to_owned());
    }
    let router = cluster().kubectl(&["get", "services,deployments", "-n", ns, "-l", "pd.inference.dev/role=router", "-o", "json"]);
    let router: Value = serde_json::from_slice(&router.stdout).map_err(|e| e.to_string())?;
    for item in router["items"].as_array().cloned().unwrap_or_default() {
        let kind = item["kind"].as_str().unwrap_or_default().to_owned();
        out.entry(kind).or_default().insert(item["metadata"]["name"].as_str().unwrap_or_default().to_owned());
    }
    Ok(out)
}

/// A control-plane component crashes and comes back: a PDDeployment created and another scaled
/// right after are reconciled within `RESUME_WITHIN`.
fn component_crash(case: &str, component: &str, down_for: Duration) {
    let op = Operator::install(case);
    op.apply_example("before");
    op.converged(case, "at the start", Instant::now());
    control_plane("kill", component);
    std::thread::sleep(down_for);
    control_plane("restart", component);
    let back = Instant::now();
    op.apply_example("after");
    op.scale_decode("before", 3);
    wait_for(RESUME_WITHIN, "the PDDeployment created after the restart to get pods", || {
        (op.pod_count("after") > 0).then_some(()).ok_or_else(|| op.logs())
    });
    report(case, &format!("reconciling resumed after {component} came back"), back.elapsed());
    op.converged(case, "after the restart", back);
}

#[test]
fn kube_apiserver_killed_and_restarted() {
    component_crash("apiserver", "kube-apiserver", Duration::from_secs(5));
}

#[test]
fn etcd_killed_and_restarted() {
    component_crash("etcd", "etcd", Duration::from_secs(5));
}

/// The leading replica is SIGKILLed while `change` is under way; the standby takes over.
fn leader_killed_during(case: &str, change: impl Fn(&Operator), under_way: impl Fn(&Operator) -> bool) {
    let mut op = Operator::install(case);
    op.apply_example("work");
    op.converged(case, "at the start", Instant::now());
    let leader = op.leader();
    change(&op);
    wait_for(CONVERGE, "the change to be under way", || under_way(&op).then_some(()).ok_or_else(|| op.logs()));
    op.replicas[leader].kill();
    let killed = Instant::now();
    let standby = 1 - leader;
    // The lease runs out 15 s after the dead leader's last renewal.
    wait_for(RESUME_WITHIN, "the standby to lead", || (op.replicas[standby].leads() == Some(true)).then_some(()).ok_or_else(|| op.logs()));
    report(case, "the standby took over", killed.elapsed());
    op.replicas.remove(leader);
    op.converged(case, "after the kill", killed);
}

#[test]
fn operator_killed_mid_rollout() {
    let patch = r#"{"spec":{"decode":{"template":{"extraArgs":["--mem-fraction-static","0.81"]}}}}"#;
    leader_killed_during(
        "rollout",
        |op| {
            let o = cluster().kubectl(&["patch", "pdd", "work", "-n", &op.ns.name, "--type=merge", "-p", patch]);
            assert!(o.status.success(), "{}", text(&o));
        },
        // At least one decode pod replaced, not all: the rollout goes one instance at a time.
        |op| {
            let v = op.ns.get_json("pdd", "work").unwrap_or_default();
            v["status"]["decode"]["updatedReplicas"].as_u64().is_some_and(|n| n >= 1)
        },
    );
}

#[test]
fn operator_killed_mid_scale() {
    leader_killed_during("scale", |op| op.scale_decode("work", 4), |op| op.pod_count("work") > 5);
}

/// An admission policy that refuses renewals of the lease by `identity` (the holder stays).
fn refuse_renewals(ns: &str, identity: &str) -> String {
    let name = format!("chaos-refuse-renewals-{ns}");
    let yaml = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{name: {name}}}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules: [{{apiGroups: [coordination.k8s.io], apiVersions: [v1], operations: [UPDATE], resources: [leases]}}]\n  validations:\n  - expression: \"!(oldObject.spec.holderIdentity == '{identity}' && object.spec.holderIdentity == '{identity}')\"\n    message: chaos refuses renewals by {identity}\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {{name: {name}}}\nspec:\n  policyName: {name}\n  validationActions: [Deny]\n  matchResources: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}\n"
    );
    let o = cluster().kubectl_stdin(&["apply", "-f", "-"], &yaml);
    assert!(o.status.success(), "{}", text(&o));
    name
}

#[test]
fn lease_renewals_refused_hand_over_to_the_standby() {
    let case = "lease";
    let op = Operator::install(case);
    op.apply_example("work");
    op.converged(case, "at the start", Instant::now());
    let old = op.leader();
    let identity = ["replica-a", "replica-b"][old];
    let policy = refuse_renewals(&op.ns.name, identity);
    let refused = Instant::now();
    wait_for(RESUME_WITHIN + Duration::from_secs(15), "the standby to lead", || {
        (op.replicas[1 - old].leads() == Some(true)).then_some(()).ok_or_else(|| op.logs())
    });
    report(case, "the standby took over", refused.elapsed());
    let o = cluster().kubectl(&["delete", "validatingadmissionpolicy,validatingadmissionpolicybinding", &policy]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(op.replicas[old].leads(), Some(false), "the old leader stopped leading");
    // The old leader writes nothing while the new one reconciles a change.
    let old_writes = op.replicas[old].api_writes();
    op.scale_decode("work", 3);
    op.converged(case, "after the hand-over", refused);
    assert_eq!(op.replicas[old].api_writes(), old_writes, "the old leader wrote after losing the lease:\n{}", op.logs());
}

/// A server-side dry run: admission runs (the webhook declares no side effects), nothing is stored.
fn dry_run(ns: &TestNamespace, yaml: &str) -> std::process::Output {
    cluster().kubectl_stdin(&["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"], yaml)
}

#[test]
fn webhook_replica_killed_during_an_admission_burst_denies_never_admits() {
    let case = "webhook";
    let mut op = Operator::install(case);
    let valid = std::fs::read_to_string(repo_path(EXAMPLE)).unwrap();
    let invalid = std::fs::read_to_string(repo_path("examples/qwen-dcp2-mistake.yaml")).unwrap();
    // Valid specs admitted and refused, before the kill, while the replica is down, after it is back.
    let mut tally = [(0, 0); 3];
    let mut killed_at = None;
    let mut restarted_at = None;
    let mut recovered = None;
    let started = Instant::now();
    for i in 0.. {
        let elapsed = started.elapsed();
        if elapsed > Duration::from_secs(6) && killed_at.is_none() {
            op.replicas[0].kill();
            killed_at = Some(Instant::now());
        }
        if elapsed > Duration::from_secs(12) && restarted_at.is_none() {
            restarted_at = Some(Instant::now());
            op.replicas[0].restart();
        }
        let phase = usize::from(killed_at.is_some()) + usize::from(restarted_at.is_some());
        let o = dry_run(&op.ns, &invalid.replace("name: qwen-pd", &format!("name: bad-{i}")));
        assert!(!o.status.success(), "an invalid spec was admitted during the burst (request {i}): {}", text(&o));
        let o = dry_run(&op.ns, &valid.replace("name: qwen3", &format!("name: good-{i}")));
        if o.status.success() {
            tally[phase].0 += 1;
            if let (Some(at), None) = (restarted_at, recovered) {
                recovered = Some(at.elapsed());
            }
        } else {
            tally[phase].1 += 1;
        }
        if recovered.is_some() || elapsed > Duration::from_secs(60) {
            break;
        }
    }
    eprintln!(
        "[chaos] {case}: valid specs (admitted, refused) before the kill {:?}, while down {:?}, after the restart {:?}; every invalid spec denied",
        tally[0], tally[1], tally[2]
    );
    let recovered = recovered.expect("admissions never recovered after the replica restarted");
    assert!(recovered < RESUME_WITHIN, "admissions recovered only after {recovered:?}");
    report(case, "admissions recovered after the replica was started again", recovered);
    assert!(tally[0].0 > 0 && tally[0].1 == 0, "admissions failed before the kill: {tally:?}");
    assert!(
        tally[1].0 == 0 && tally[1].1 > 0,
        "with its only webhook replica dead, a valid spec must be refused (failurePolicy Fail): {tally:?}"
    );
}

/// The CRD of the release users upgrade from (tests/upgrade/README.md).
const PREVIOUS_CRD: &str = "tests/upgrade/pddeployment-crd-ac9762d.yaml";

fn apply_crds(path: &str) {
    let o = cluster().kubectl(&["apply", "--server-side", "--force-conflicts", "-f", repo_path(path).to_str().unwrap()]);
    assert!(o.status.success(), "apply {path}: {}", text(&o));
    cluster().wait_crds_established(&repo_path(path));
}

/// This release's CRDs again, however the upgrade case ends.
struct CurrentCrds;

impl Drop for CurrentCrds {
    fn drop(&mut self) {
        apply_crds("crds");
    }
}

/// An operator upgrade across API changes: a PDDeployment stored under the previous release's
/// CRD (no PDRole kind yet) is read by this release's operator once its CRDs are applied,
/// converges to exactly the children `render` prints, and takes a change afterwards.
#[test]
fn objects_stored_under_the_previous_crd_are_reconciled_after_the_upgrade() {
    let case = "upgrade";
    let _restore = CurrentCrds;
    let o = cluster().kubectl(&["delete", "crd", "pdroles.pd.inference.dev", "--ignore-not-found", "--wait=true"]);
    assert!(o.status.success(), "{}", text(&o));
    apply_crds(PREVIOUS_CRD);
    let ns = TestNamespace::new(case);
    apply_example(&ns, "stored");
    let stored = ns.get_json("pdd", "stored").unwrap();
    assert!(stored["spec"]["scaling"].is_null() && stored["status"].is_null(), "stored under the previous schema: {stored}");

    let upgraded = Instant::now();
    apply_crds("crds");
    let op = Operator::install_in(ns);
    op.converged(case, "after the upgrade", upgraded);
    let changed = Instant::now();
    op.scale_decode("stored", 3);
    op.converged(case, "after a change", changed);
    let o = cluster().kubectl(&[
        "get",
        "pods",
        "-n",
        &op.ns.name,
        "-l",
        "pd.inference.dev/deployment=stored,pd.inference.dev/role=decode",
        "-o",
        "name",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 3, "the change took effect: {}", text(&o));
}
