//! Controller scale benchmark (not a test): N PDDeployments of 8 pods each on the local control
//! plane; time until every pod exists and every status is current, the controller's CPU seconds
//! and peak RSS, API writes per PDDeployment; and the floor: the same pods created directly by
//! one client with unbounded concurrency. Run with `hack/bench-controller.sh`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use pd_operator::api::{PDDeployment, PDDeploymentSpec};
use pd_operator::render::{RenderOptions, render};

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

/// CPU seconds of each control-plane process of `hack/cluster.sh` (pids under PD_CLUSTER_DIR).
fn control_plane_cpu() -> Vec<(String, f64)> {
    let dir = std::env::var("PD_CLUSTER_DIR").unwrap_or_default();
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        .iter()
        .filter_map(|name| {
            let pid = std::fs::read_to_string(format!("{dir}/pids/{name}")).ok()?.trim().parse().ok()?;
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

struct Row {
    n: usize,
    pods_exist: f64,
    status_current: f64,
    cpu: f64,
    rss_mib: f64,
    writes_per_pdd: f64,
    floor_exist: f64,
    floor_running: f64,
    floor_all_running: f64,
}

async fn through_controller(client: &Client, bin: &str, n: usize) -> (f64, f64, f64, f64, f64) {
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
    while Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{port}/readyz")])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let api: Api<PDDeployment> = Api::namespaced(client.clone(), &ns);
    let costs = Costs::now(client).await;
    let start = Instant::now();
    join_all((0..n).map(|i| {
        let api = api.clone();
        async move { api.create(&PostParams::default(), &PDDeployment::new(&format!("p{i}"), spec())).await.expect("create PDDeployment") }
    }))
    .await;
    let (mut pods_exist, mut pods_running) = (None, None);
    let status_current = loop {
        if pods_exist.is_none() && pod_count(client, &ns, None).await >= n * 8 {
            pods_exist = Some(start.elapsed().as_secs_f64());
        }
        if pods_exist.is_some() && pods_running.is_none() && pod_count(client, &ns, Some("status.phase=Running")).await >= n * 8 {
            pods_running = Some(start.elapsed().as_secs_f64());
        }
        let list = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let current = list.iter().filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == p.metadata.generation && s.prefill.ready == "4/4" && s.decode.ready == "4/4")
        });
        if current.count() == n {
            break start.elapsed().as_secs_f64();
        }
        if start.elapsed() > Duration::from_secs(1800) {
            panic!("N={n}: not converged after 30 minutes");
        }
        tokio::time::sleep(POLL).await;
    };
    let (cpu, hwm_kib) = proc_stats(child.id());
    costs.report(client, &format!("N={n} controller")).await;
    // Where the time after the last pod goes: kwok starting pods, or the controller's statuses.
    eprintln!("[bench] N={n}: every pod Running after {:.1} s", pods_running.unwrap_or(status_current));
    let writes = metric_sum(port, "pd_operator_api_writes_total");
    // Where the writes go, per verb and resource, for the note.
    let out = Command::new("curl").args(["-sf", &format!("http://127.0.0.1:{port}/metrics")]).output().unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("pd_operator_api_writes_total")) {
        eprintln!("[bench] N={n}: {line}");
    }
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    delete_namespace(client, &ns).await;
    (pods_exist.unwrap_or(status_current), status_current, cpu, hwm_kib as f64 / 1024.0, writes / n as f64)
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

/// The floor: the rendered pods created directly (after the decode ServiceAccount they run
/// under), 8 sequential creates per PDDeployment, PDDeployments concurrent. With `everything`,
/// every other rendered object (Services, ConfigMap, Role, RoleBinding) is created first too: the
/// cost of the object set itself, without a controller.
async fn floor(client: &Client, n: usize, everything: bool) -> (f64, f64) {
    let ns = format!("bench-floor{}-{n}", if everything { "-all" } else { "" });
    namespace(client, &ns).await;
    let facts = pd_operator::model::resolve(&spec().model, None);
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
    join_all(batches.into_iter().map(|r| {
        let ns = ns.as_str();
        async move {
            create_each(client, ns, r.service_accounts).await;
            if everything {
                create_each(client, ns, r.services).await;
                create_each(client, ns, r.config_maps).await;
                create_each(client, ns, r.roles).await;
                create_each(client, ns, r.role_bindings).await;
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
    costs.report(client, &format!("N={n} {ns}")).await;
    delete_namespace(client, &ns).await;
    (exist, running)
}

fn main() {
    let bin = std::env::var("PD_BENCH_BIN").unwrap_or_else(|_| "target/release/pd-operator".into());
    let sizes: Vec<usize> =
        std::env::var("PD_BENCH_N").unwrap_or_else(|_| "10,100,500".into()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(8 << 20).build().unwrap();
    rt.block_on(async {
        let client = Client::try_default().await.expect("KUBECONFIG must point at the benchmark cluster");
        let mut rows = Vec::new();
        for n in sizes {
            eprintln!("[bench] N={n}: through the controller");
            let (pods_exist, status_current, cpu, rss_mib, writes_per_pdd) = through_controller(&client, &bin, n).await;
            eprintln!("[bench] N={n}: floor (same pods, created directly)");
            let (floor_exist, floor_running) = floor(&client, n, false).await;
            eprintln!("[bench] N={n}: floor with every rendered object");
            let (_, floor_all_running) = floor(&client, n, true).await;
            rows.push(Row { n, pods_exist, status_current, cpu, rss_mib, writes_per_pdd, floor_exist, floor_running, floor_all_running });
        }
        println!("| N PDDeployments (8 pods each) | pods exist (s) | all statuses current (s) | floor: pods created (s) | floor: pods Running (s) | ratio (status / floor Running) | controller CPU (s) | controller peak RSS (MiB) | API writes per PDDeployment | floor with every rendered object: Running (s) | ratio to it |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x |",
                r.n,
                r.pods_exist,
                r.status_current,
                r.floor_exist,
                r.floor_running,
                r.status_current / r.floor_running,
                r.cpu,
                r.rss_mib,
                r.writes_per_pdd,
                r.floor_all_running,
                r.status_current / r.floor_all_running
            );
        }
    });
}
