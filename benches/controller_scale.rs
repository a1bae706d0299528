//! Controller scale benchmark (not a test): N PDDeployments of 8 pods each on the local control
//! plane; time until every pod exists and every status is current, the controller's CPU seconds
//! and peak RSS, API writes per PDDeployment; and the floor: the same pods created directly by
//! one client with unbounded concurrency; and the same work as LeaderWorkerSets (one per role)
//! under the LWS controller. Run with `hack/bench-controller.sh`; `PD_BENCH_PARTS` picks the runs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use pd_api::{PDDeployment, PDDeploymentSpec};
use pd_core::render::{RenderOptions, render};

fn spec() -> PDDeploymentSpec {
    serde_json::from_value(serde_json::json!({
        "engine": {"type": "sim"},
        "model": {"path": "deepseek-ai/DeepSeek-V3"},
        "kvTransfer": {"pageSize": 64},
        "prefill": {"replicas": 4, "parallelism": {"tp": 1}},
        "decode": {"replicas": 4, "parallelism": {"tp": 1}},
        "router": {"enabled": false}
    }))
    .unwrap()
}

/// How often convergence is checked, in both runs.
const POLL: Duration = Duration::from_millis(500);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn proc_stats(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kib = status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
    (ticks / 100.0, hwm_kib)
}

fn metric_sum(port: u16, name: &str) -> f64 {
    let out = Command::new("curl").args(["-sf", &format!("http://127.0.0.1:{port}/metrics")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    let _ = api.create(&PostParams::default(), &ns).await;
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    while sa.get_opt("default").await.ok().flatten().is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn delete_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::background()).await;
    while api.get_opt(name).await.ok().flatten().is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How many pods `ns` holds (only those matching `fields`, if given). Metadata-only: full lists of
/// 4000 pods twice a second would cost the apiserver more than some of the work being measured.
async fn pod_count(client: &Client, ns: &str, fields: Option<&str>) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = fields.map_or_else(ListParams::default, |f| ListParams::default().fields(f));
    pods.list_metadata(&lp).await.map(|l| l.items.len()).unwrap_or(0)
}

/// CPU seconds of each control-plane process of `hack/cluster.sh` (kwokctl's pid files under
/// PD_CLUSTER_DIR).
fn control_plane_cpu() -> Vec<(String, f64)> {
    let dir = std::env::var("PD_CLUSTER_DIR").unwrap_or_default();
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller"]
        .iter()
        .filter_map(|name| {
            let pid = std::fs::read_to_string(format!("{dir}/kwok/clusters/pd/pids/{name}.pid")).ok()?.trim().parse().ok()?;
            Some((name.to_string(), proc_stats(pid).0))
        })
        .collect()
}

/// The apiserver's count of write requests by verb and resource (`apiserver_request_total`).
async fn apiserver_writes(client: &Client) -> std::collections::BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label = |k: &str| line.split(&format!("{k}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or("").to_owned();
        let verb = label("verb");
        if !["POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE"].contains(&verb.as_str()) {
            continue;
        }
        let sub = label("subresource");
        let key = format!("{verb} {}{}{}", label("resource"), if sub.is_empty() { "" } else { "/" }, sub);
        *out.entry(key).or_insert(0.0) += line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    }
    out
}

/// Prints what a run cost the rest of the machine: control-plane CPU and apiserver writes.
struct Costs {
    cpu: Vec<(String, f64)>,
    writes: std::collections::BTreeMap<String, f64>,
}

impl Costs {
    async fn now(client: &Client) -> Costs {
        Costs { cpu: control_plane_cpu(), writes: apiserver_writes(client).await }
    }

    async fn report(&self, client: &Client, run: &str) {
        let after = Costs::now(client).await;
        for ((name, cpu), (_, before)) in after.cpu.iter().zip(&self.cpu) {
            eprintln!("[bench] {run}: {name} CPU {:.1} s", cpu - before);
        }
        for (key, count) in &after.writes {
            let delta = count - self.writes.get(key).copied().unwrap_or(0.0);
            if delta >= 100.0 {
                eprintln!("[bench] {run}: apiserver {key} {delta:.0}");
            }
        }
    }
}

/// What one run measured: seconds from the first create until every pod exists, every pod is
/// Running and every status is current; the controller's CPU seconds and peak RSS.
#[derive(Clone, Copy, Default)]
struct Run {
    pods_exist: f64,
    pods_running: f64,
    status_current: f64,
    cpu: f64,
    rss_mib: f64,
}

#[derive(Default)]
struct Row {
    n: usize,
    controller: Option<Run>,
    writes_per_pdd: f64,
    floor: Option<Floor>,
    floor_all: Option<Floor>,
    lws: Option<Run>,
}

/// The decode pods' handshake sidecar, modelled: kwok runs no containers, and its stages model the
/// sidecar only for non-`sim` engines (hack/kwok/pod-stages.yaml), so a `sim` decode pod would
/// never pass its readiness gate. Like a passing sidecar, this patches the gate condition True on
/// each Running decode pod of `ns`, once (one status patch per decode pod, as the real sidecar
/// sends); the kwok stages then turn the pod Ready. Both the controller and the LWS run get it.
fn sidecar_model(client: &Client, ns: &str) -> tokio::task::JoinHandle<()> {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let cfg = watcher::Config::default().labels("pd.inference.dev/role=decode");
        let mut done = std::collections::HashSet::new();
        let mut stream = std::pin::pin!(watcher(pods.clone(), cfg).default_backoff().applied_objects());
        while let Ok(Some(pod)) = stream.try_next().await {
            let st = pod.status.as_ref();
            let running = st.and_then(|s| s.phase.as_deref()) == Some("Running");
            let gated = st.and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "pd.inference.dev/handshake"));
            let name = pod.metadata.name.clone().unwrap_or_default();
            if !running || gated || !done.insert(name.clone()) {
                continue;
            }
            let pods = pods.clone();
            tokio::spawn(async move {
                let now = jiff::Timestamp::now().to_string();
                let patch = serde_json::json!({"status": {"conditions": [{"type": "pd.inference.dev/handshake", "status": "True", "reason": "HandshakePassed", "lastTransitionTime": now}]}});
                let _ = pods.patch_status(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(patch)).await;
            });
        }
    })
}

/// Seconds from `start` until `want` pods of `ns` are Ready, watched (a list every poll would
/// itself load the apiserver the run measures).
fn ready_watch(client: &Client, ns: &str, want: usize, start: Instant) -> tokio::task::JoinHandle<f64> {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut ready = std::collections::HashSet::new();
        let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff().applied_objects());
        while let Ok(Some(pod)) = stream.try_next().await {
            let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
            if conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")) {
                ready.insert(pod.metadata.name.clone().unwrap_or_default());
                if ready.len() >= want {
                    return start.elapsed().as_secs_f64();
                }
            }
        }
        f64::NAN
    })
}

/// Which runs to do (`PD_BENCH_PARTS`, comma-separated; default all).
fn part(name: &str) -> bool {
    std::env::var("PD_BENCH_PARTS").ok().is_none_or(|p| p.split(',').any(|x| x.trim() == name))
}

/// Waits until `http://127.0.0.1:{port}{path}` answers 2xx.
async fn wait_http(port: u16, path: &str) {
    while Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{port}{path}")])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls until every pod of `ns` exists, every pod is Running and `current()` says every status is
/// current; returns the three times from `start`.
async fn converge<F, Fut>(client: &Client, ns: &str, pods: usize, start: Instant, current: F) -> (f64, f64, f64)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (mut pods_exist, mut pods_running) = (None, None);
    let status_current = loop {
        if pods_exist.is_none() && pod_count(client, ns, None).await >= pods {
            pods_exist = Some(start.elapsed().as_secs_f64());
        }
        if pods_exist.is_some() && pods_running.is_none() && pod_count(client, ns, Some("status.phase=Running")).await >= pods {
            pods_running = Some(start.elapsed().as_secs_f64());
        }
        if current().await {
            break start.elapsed().as_secs_f64();
        }
        if start.elapsed() > Duration::from_secs(2400) {
            panic!("{ns}: not converged after 40 minutes");
        }
        tokio::time::sleep(POLL).await;
    };
    (pods_exist.unwrap_or(status_current), pods_running.unwrap_or(status_current), status_current)
}

async fn through_controller(client: &Client, bin: &str, n: usize) -> (Run, f64) {
    let ns = format!("bench-ctl-{n}");
    namespace(client, &ns).await;
    let port = free_port();
    let mut child: Child = Command::new(bin)
        .args(["controller", "--namespace", &ns, "--webhook=false", "--leader-elect=false", "--admin-addr", &format!("127.0.0.1:{port}")])
        .env("PD_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the controller");
    wait_http(port, "/readyz").await;
    let api: Api<PDDeployment> = Api::namespaced(client.clone(), &ns);
    let sidecars = sidecar_model(client, &ns);
    let costs = Costs::now(client).await;
    let start = Instant::now();
    join_all((0..n).map(|i| {
        let api = api.clone();
        async move { api.create(&PostParams::default(), &PDDeployment::new(&format!("p{i}"), spec())).await.expect("create PDDeployment") }
    }))
    .await;
    let current = || async {
        let list = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let current = list.iter().filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == p.metadata.generation && s.prefill.ready == "4/4" && s.decode.ready == "4/4")
        });
        current.count() == n
    };
    let (pods_exist, pods_running, status_current) = converge(client, &ns, n * 8, start, current).await;
    sidecars.abort();
    let (cpu, hwm_kib) = proc_stats(child.id());
    costs.report(client, &format!("N={n} controller")).await;
    eprintln!("[bench] N={n}: every pod Running after {pods_running:.1} s");
    let writes = metric_sum(port, "pd_operator_api_writes_total");
    // Where the writes go, per verb and resource, for the note.
    let out = Command::new("curl").args(["-sf", &format!("http://127.0.0.1:{port}/metrics")]).output().unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("pd_operator_api_writes_total")) {
        eprintln!("[bench] N={n}: {line}");
    }
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    delete_namespace(client, &ns).await;
    let run = Run { pods_exist, pods_running, status_current, cpu, rss_mib: hwm_kib as f64 / 1024.0 };
    (run, writes / n as f64)
}

/// Creates `objects` in `ns` one after another.
async fn create_each<K>(client: &Client, ns: &str, objects: Vec<K>)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    for o in objects {
        api.create(&PostParams::default(), &o).await.unwrap_or_else(|e| panic!("create {}: {e}", K::kind(&())));
    }
}

/// What a floor run measured, in seconds from its first create.
struct Floor {
    exist: f64,
    running: f64,
    /// Every pod Ready, the decode pods' gates passed by the modelled sidecar (`everything` only).
    ready: Option<f64>,
}

/// The floor: the rendered pods created directly (after the decode ServiceAccount they run
/// under), 8 sequential creates per PDDeployment, PDDeployments concurrent. With `everything`,
/// every other rendered object (Service, ConfigMap, Role, RoleBinding, NetworkPolicy) is created
/// first too: the cost of the object set itself, without a controller; and the sidecar model
/// passes the decode pods' gates, as in the controller run, to time every pod Ready as well.
async fn floor(client: &Client, n: usize, everything: bool) -> Floor {
    let ns = format!("bench-floor{}-{n}", if everything { "-all" } else { "" });
    namespace(client, &ns).await;
    let facts = pd_core::model::resolve(&spec().model, None);
    let opts = RenderOptions { default_namespace: ns.clone(), ..RenderOptions::default() };
    let batches: Vec<_> = (0..n)
        .map(|i| {
            let mut pdd = PDDeployment::new(&format!("p{i}"), spec());
            pdd.metadata.namespace = Some(ns.clone());
            render(&pdd, &facts, &opts).unwrap()
        })
        .collect();
    let costs = Costs::now(client).await;
    let start = Instant::now();
    let gates = everything.then(|| (sidecar_model(client, &ns), ready_watch(client, &ns, n * 8, start)));
    join_all(batches.into_iter().map(|r| {
        let ns = ns.as_str();
        async move {
            create_each(client, ns, r.service_accounts).await;
            if everything {
                create_each(client, ns, r.services).await;
                create_each(client, ns, r.config_maps).await;
                create_each(client, ns, r.roles).await;
                create_each(client, ns, r.role_bindings).await;
                create_each(client, ns, r.network_policies).await;
            }
            create_each(client, ns, r.instances.into_iter().flat_map(|i| i.pods).collect()).await;
        }
    }))
    .await;
    let exist = start.elapsed().as_secs_f64();
    let running = loop {
        let running = pod_count(client, &ns, Some("status.phase=Running")).await;
        if running >= n * 8 {
            break start.elapsed().as_secs_f64();
        }
        tokio::time::sleep(POLL).await;
    };
    let ready = match gates {
        Some((sidecars, ready)) => {
            let at = ready.await.ok();
            sidecars.abort();
            at
        }
        None => None,
    };
    costs.report(client, &format!("N={n} {ns}")).await;
    delete_namespace(client, &ns).await;
    Floor { exist, running, ready }
}

fn lws_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"), "leaderworkersets")
}

/// One LeaderWorkerSet for one role of a rendered PDDeployment: as many groups as the role has
/// instances, each group as many pods as an instance, the pod template the rendered pod of
/// instance 0 (its per-pod labels, hostname and subdomain left to LWS; restartPolicy Always, the
/// only one a StatefulSet accepts).
fn lws_object(name: &str, instances: &[&pd_core::render::InstancePods]) -> DynamicObject {
    let pods = &instances[0].pods;
    let pod = &pods[0];
    let mut spec = pod.spec.clone().expect("rendered pod spec");
    spec.hostname = None;
    spec.subdomain = None;
    spec.restart_policy = Some("Always".into());
    let per_pod = ["pd.inference.dev/instance", "pd.inference.dev/node-rank", "pd.inference.dev/revision"];
    let labels: std::collections::BTreeMap<_, _> =
        pod.metadata.labels.clone().unwrap_or_default().into_iter().filter(|(k, _)| !per_pod.contains(&k.as_str())).collect();
    let template = serde_json::json!({"metadata": {"labels": labels}, "spec": spec});
    serde_json::from_value(serde_json::json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": instances.len(),
            "leaderWorkerTemplate": {"size": pods.len(), "workerTemplate": template},
        }
    }))
    .unwrap()
}

/// What a user of LWS applies for one PDDeployment: the rendered support objects the pods need
/// (decode ServiceAccount, handshake ConfigMap, Role, RoleBinding, NetworkPolicy) and one LWS per
/// role. LWS makes its own headless Service per LWS (two per PDDeployment; the controller makes one).
struct LwsBatch {
    rendered: pd_core::render::Rendered,
    sets: Vec<DynamicObject>,
}

fn lws_batch(ns: &str, i: usize) -> LwsBatch {
    let facts = pd_core::model::resolve(&spec().model, None);
    let opts = RenderOptions { default_namespace: ns.to_owned(), ..RenderOptions::default() };
    let mut pdd = PDDeployment::new(&format!("p{i}"), spec());
    pdd.metadata.namespace = Some(ns.to_owned());
    let rendered = render(&pdd, &facts, &opts).unwrap();
    let sets = [pd_api::Role::Prefill, pd_api::Role::Decode]
        .iter()
        .map(|role| {
            let of_role: Vec<_> = rendered.instances.iter().filter(|x| x.role == *role).collect();
            lws_object(&format!("p{i}-{}", role.as_str()), &of_role)
        })
        .collect();
    LwsBatch { rendered, sets }
}

/// Starts the LWS controller (hack/bench-controller.sh wrote its config and registered its
/// webhooks at 127.0.0.1) and waits until it is ready and its webhooks admit a LeaderWorkerSet.
async fn start_lws(client: &Client, ns: &str) -> Child {
    let bin = std::env::var("PD_LWS_BIN").expect("PD_LWS_BIN: run through hack/bench-controller.sh");
    let config = std::env::var("PD_LWS_CONFIG").expect("PD_LWS_CONFIG");
    let health: u16 = std::env::var("PD_LWS_HEALTH_PORT").expect("PD_LWS_HEALTH_PORT").parse().unwrap();
    let child = Command::new(bin)
        .args(["--config", &config, "--zap-log-level=error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the LWS controller");
    wait_http(health, "/readyz").await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &lws_resource());
    let mut probe = lws_batch(ns, 0).sets.remove(0);
    probe.metadata.name = Some("webhook-probe".into());
    probe.data["spec"]["replicas"] = serde_json::json!(0);
    while api.create(&PostParams::default(), &probe).await.is_err() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = api.delete("webhook-probe", &DeleteParams::default()).await;
    child
}

/// Every LeaderWorkerSet of `ns` has all its groups ready and is Available.
async fn lws_current(api: &Api<DynamicObject>, sets: usize) -> bool {
    let list = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let current = list.iter().filter(|o| {
        let st = &o.data["status"];
        let available = st["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Available" && c["status"] == "True"));
        available && st["readyReplicas"] == o.data["spec"]["replicas"]
    });
    current.count() == sets
}

/// The same pods as N PDDeployments, as 2N LeaderWorkerSets under the LWS controller.
async fn through_lws(client: &Client, n: usize) -> Run {
    let ns = format!("bench-lws-{n}");
    namespace(client, &ns).await;
    let mut child = start_lws(client, &ns).await;
    let batches: Vec<_> = (0..n).map(|i| lws_batch(&ns, i)).collect();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &lws_resource());
    let sidecars = sidecar_model(client, &ns);
    let costs = Costs::now(client).await;
    let start = Instant::now();
    join_all(batches.into_iter().map(|b| {
        let (ns, api) = (ns.as_str(), &api);
        async move {
            let r = b.rendered;
            create_each(client, ns, r.service_accounts).await;
            create_each(client, ns, r.config_maps).await;
            create_each(client, ns, r.roles).await;
            create_each(client, ns, r.role_bindings).await;
            create_each(client, ns, r.network_policies).await;
            for set in b.sets {
                api.create(&PostParams::default(), &set).await.expect("create LeaderWorkerSet");
            }
        }
    }))
    .await;
    let (pods_exist, pods_running, status_current) = converge(client, &ns, n * 8, start, || lws_current(&api, 2 * n)).await;
    sidecars.abort();
    let (cpu, hwm_kib) = proc_stats(child.id());
    costs.report(client, &format!("N={n} lws")).await;
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    delete_namespace(client, &ns).await;
    Run { pods_exist, pods_running, status_current, cpu, rss_mib: hwm_kib as f64 / 1024.0 }
}

fn cell(v: Option<f64>, suffix: &str) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.1}{suffix}"))
}

fn print_tables(rows: &[Row]) {
    println!(
        "| N PDDeployments (8 pods each) | pods exist (s) | every pod Running (s) | all statuses current (s) | controller CPU (s) | controller peak RSS (MiB) | API writes per PDDeployment | floor: pods created (s) | floor: pods Running (s) | floor, every object: Running (s) | ratio to it | every object, gates passed: Ready (s) | ratio to it |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let c = r.controller;
        let all = r.floor_all.as_ref();
        let ratio = |f: Option<f64>| c.zip(f).map(|(c, f)| format!("{:.2}x", c.status_current / f)).unwrap_or_else(|| "–".into());
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.n,
            cell(c.map(|c| c.pods_exist), ""),
            cell(c.map(|c| c.pods_running), ""),
            cell(c.map(|c| c.status_current), ""),
            cell(c.map(|c| c.cpu), ""),
            cell(c.map(|c| c.rss_mib), ""),
            r.writes_per_pdd,
            cell(r.floor.as_ref().map(|f| f.exist), ""),
            cell(r.floor.as_ref().map(|f| f.running), ""),
            cell(all.map(|f| f.running), ""),
            ratio(all.map(|f| f.running)),
            cell(all.and_then(|f| f.ready), ""),
            ratio(all.and_then(|f| f.ready)),
        );
    }
    println!();
    println!(
        "| N | PDDeployments: Running (s) | statuses current (s) | pd-operator CPU (s) | RSS (MiB) | LeaderWorkerSets: Running (s) | statuses current (s) | lws CPU (s) | RSS (MiB) | Running, LWS / PDD |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| r.lws.is_some()) {
        let (c, l) = (r.controller, r.lws.unwrap());
        let ratio = c.map(|c| format!("{:.2}x", l.pods_running / c.pods_running)).unwrap_or_else(|| "–".into());
        println!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio} |",
            r.n,
            cell(c.map(|c| c.pods_running), ""),
            cell(c.map(|c| c.status_current), ""),
            cell(c.map(|c| c.cpu), ""),
            cell(c.map(|c| c.rss_mib), ""),
            l.pods_running,
            l.status_current,
            l.cpu,
            l.rss_mib
        );
    }
}

/// The runs of one N, in a fixed order: controller, floors, LWS.
async fn one_size(client: &Client, bin: &str, n: usize) -> Row {
    let mut row = Row { n, ..Row::default() };
    if part("controller") {
        eprintln!("[bench] N={n}: through the controller");
        let (run, writes) = through_controller(client, bin, n).await;
        (row.controller, row.writes_per_pdd) = (Some(run), writes);
    }
    if part("floor") {
        eprintln!("[bench] N={n}: floor (same pods, created directly)");
        row.floor = Some(floor(client, n, false).await);
    }
    if part("floor-all") {
        eprintln!("[bench] N={n}: floor with every rendered object");
        row.floor_all = Some(floor(client, n, true).await);
    }
    if part("lws") {
        eprintln!("[bench] N={n}: LeaderWorkerSets");
        let run = through_lws(client, n).await;
        eprintln!(
            "[bench] N={n}: LWS pods Running {:.1} s, statuses current {:.1} s, CPU {:.1} s, RSS {:.1} MiB",
            run.pods_running, run.status_current, run.cpu, run.rss_mib
        );
        row.lws = Some(run);
    }
    row
}

fn main() {
    let bin = std::env::var("PD_BENCH_BIN").unwrap_or_else(|_| "target/release/pd-operator".into());
    let sizes: Vec<usize> =
        std::env::var("PD_BENCH_N").unwrap_or_else(|_| "10,100,500".into()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(8 << 20).build().unwrap();
    rt.block_on(async {
        // The operator's own client (HTTP/2): the floors pay no more per request than the controller does.
        let client = pd_runtime::kube_client::connect().await.expect("KUBECONFIG must point at the benchmark cluster");
        let mut rows = Vec::new();
        for n in sizes {
            rows.push(one_size(&client, &bin, n).await);
            print_tables(&rows);
        }
    });
}
