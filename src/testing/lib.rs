//! Harness for tests against a real Kubernetes control plane.
//!
//! One cluster per test binary: `PD_E2E_KUBECONFIG` when set (the `make test` cluster, a kind
//! cluster, or a user's own), otherwise `hack/cluster.sh up` into a private state dir, stopped by a
//! watchdog when the test process exits. Each test gets its own namespace, deleted at the end.
//! Also the parity tier's cases (`parity`, and the `parity-cases` binary), and a stand-in
//! Hugging Face Hub (`hub`).

pub mod hub;
pub mod parity;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub struct Cluster {
    pub kubeconfig: PathBuf,
    /// Directory holding kubectl and helm built by hack/tools.sh (empty: use PATH).
    pub bin: Option<PathBuf>,
}

/// The repository's root (this crate lives in `src/testing`).
/// The workspace's root: found at run time from the directory cargo runs the test in (its
/// package's), since this crate's compiled-in path may be another checkout's: cargo reuses a
/// workspace member's artifact built from another path when the sources look unchanged.
fn repo() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).or_else(|| std::env::current_dir().ok());
    start
        .and_then(|dir| dir.ancestors().find(|d| d.join("Cargo.lock").is_file() && d.join("crds").is_dir()).map(Path::to_path_buf))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// A binary of this workspace (`pd-operator`, `pd-sim`), from the target directory the running
/// test was built into, or `PD_BIN_DIR`. Cargo builds only the binaries of the package under test
/// for its tests; `make test` builds every binary first (`cargo build --workspace --bins`).
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("PD_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        // target/<profile>/deps/<test>-<hash>: the binaries are in target/<profile>.
        let exe = std::env::current_exe().expect("the test's own path");
        exe.parent().and_then(Path::parent).expect("a test runs from target/<profile>/deps").to_path_buf()
    });
    let path = dir.join(name);
    assert!(path.is_file(), "{} is not built: run `cargo build --workspace --bins` (make test does) or set PD_BIN_DIR", path.display());
    path
}

// The watchdog is meant to outlive this process, so it is never waited for.
#[allow(clippy::zombie_processes)]
fn start_private_cluster() -> Cluster {
    let dir = std::env::temp_dir().join(format!("pd-e2e-{}", std::process::id()));
    let out = Command::new(repo().join("hack/cluster.sh"))
        .arg("up")
        .env("PD_CLUSTER_DIR", &dir)
        // Tests run in parallel and together need far more than 4 nodes' GPUs.
        .env("PD_GPU_NODES", std::env::var("PD_GPU_NODES").unwrap_or_else(|_| "16".into()))
        .stderr(Stdio::inherit())
        .output()
        .expect("run hack/cluster.sh");
    assert!(out.status.success(), "hack/cluster.sh up failed; see its log lines above");
    // Stop the cluster when this test process ends, however it ends.
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; PD_CLUSTER_DIR='{}' '{}' down",
            std::process::id(),
            dir.display(),
            repo().join("hack/cluster.sh").display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cluster watchdog");
    let bin = std::fs::read_to_string(dir.join("bin")).ok().map(|s| PathBuf::from(s.trim()));
    Cluster { kubeconfig: dir.join("kubeconfig"), bin }
}

pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = match std::env::var_os("PD_E2E_KUBECONFIG") {
            Some(k) => Cluster { kubeconfig: k.into(), bin: std::env::var_os("PD_TOOLS_BIN").map(PathBuf::from) },
            None => start_private_cluster(),
        };
        let out = c.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", repo().join("crds").to_str().unwrap()]);
        assert!(out.status.success(), "installing the CRD failed: {}", String::from_utf8_lossy(&out.stderr));
        c.wait_crds_established(&repo().join("crds"));
        c
    })
}

impl Cluster {
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.as_ref().map(|b| b.join(name)).filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from(name))
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.tool("kubectl")).args(args).env("KUBECONFIG", &self.kubeconfig).output().expect("run kubectl")
    }

    /// `kubectl pd ARGS`: the plugin found by kubectl's own plugin lookup, with this workspace's
    /// `kubectl-pd` first on PATH.
    pub fn kubectl_pd(&self, args: &[&str]) -> Output {
        let plugin_dir = bin("kubectl-pd").parent().expect("a binary has a directory").to_path_buf();
        let path =
            std::env::join_paths(std::iter::once(plugin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())))
                .expect("PATH entries without separators");
        Command::new(self.tool("kubectl"))
            .arg("pd")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", path)
            .output()
            .expect("run kubectl pd")
    }

    /// Waits until every CRD in `path` (a file or a directory) is Established. A CRD created a
    /// moment ago has no conditions yet, which `kubectl wait --for=condition` reports as an error
    /// at once instead of waiting (`hack/lib/wait.sh` has the same wait for the scripts).
    pub fn wait_crds_established(&self, path: &Path) {
        let o = self.kubectl(&["get", "-f", path.to_str().unwrap(), "-o", "name"]);
        assert!(o.status.success(), "the CRDs in {}: {}", path.display(), text(&o));
        for crd in String::from_utf8_lossy(&o.stdout).lines() {
            wait_for(Duration::from_secs(60), &format!("{crd} to be Established"), || {
                let o = self.kubectl(&["get", crd, "-o", r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#]);
                (String::from_utf8_lossy(&o.stdout) == "True").then_some(()).ok_or_else(|| text(&o))
            });
        }
    }

    pub fn helm(&self, args: &[&str]) -> Output {
        Command::new(self.tool("helm")).args(args).env("KUBECONFIG", &self.kubeconfig).output().expect("run helm")
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = Command::new(self.tool("kubectl"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    pub async fn config(&self) -> kube::Config {
        let kc = Kubeconfig::read_from(&self.kubeconfig).expect("read kubeconfig");
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.expect("kubeconfig")
    }

    pub async fn client(&self) -> Client {
        Client::try_from(self.config().await).expect("client")
    }
}

/// A container `securityContext` (as flow YAML) that meets the `restricted` Pod Security
/// Standard: what a tenant of a restricted namespace writes into a PDDeployment's templates.
pub const RESTRICTED_CONTAINER: &str = "{runAsNonRoot: true, runAsUser: 65532, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}";

/// `RESTRICTED_CONTAINER` as JSON, for objects a test builds with `json!`.
pub fn restricted_container() -> serde_json::Value {
    serde_norway::from_str(RESTRICTED_CONTAINER).expect("RESTRICTED_CONTAINER is YAML")
}

/// A namespace of its own for one test; deleted (without waiting) when dropped.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub fn new(prefix: &str) -> Self {
        let name = format!("e2e-{prefix}-{:06x}", rand::random::<u32>() & 0xffffff);
        let out = cluster().kubectl(&["create", "namespace", &name]);
        assert!(out.status.success(), "create namespace {name}: {}", String::from_utf8_lossy(&out.stderr));
        wait_for(Duration::from_secs(60), &format!("ServiceAccount default in {name}"), || {
            let o = cluster().kubectl(&["get", "serviceaccount", "default", "-n", &name]);
            o.status.success().then_some(()).ok_or_else(|| String::from_utf8_lossy(&o.stderr).into_owned())
        });
        Self { name }
    }

    pub fn apply(&self, yaml: &str) -> Output {
        cluster().kubectl_stdin(&["apply", "-n", &self.name, "-f", "-"], yaml)
    }

    /// Makes the namespace enforce the `restricted` Pod Security Standard: from now on the
    /// apiserver refuses every pod in it that does not meet that standard.
    pub fn enforce_restricted(&self) {
        let o = cluster().kubectl(&["label", "namespace", &self.name, "pod-security.kubernetes.io/enforce=restricted"]);
        assert!(o.status.success(), "{}", text(&o));
    }

    /// Fails the test if any Event in the namespace says Pod Security refused a pod.
    pub fn assert_no_pod_security_refusal(&self) {
        let events = cluster().kubectl(&["get", "events", "-n", &self.name, "-o", "jsonpath={.items[*].message}"]);
        assert!(events.status.success(), "{}", text(&events));
        assert!(!text(&events).contains("violates PodSecurity"), "{}", text(&events));
    }

    pub fn apply_file(&self, path: &Path) -> Output {
        cluster().kubectl(&["apply", "-n", &self.name, "-f", path.to_str().unwrap()])
    }

    /// Runs `command` in a pod `pod` of `image` until it ends (within `timeout`) and reads its last
    /// log line as JSON: a load generator's report. A failed pod fails the test with its log.
    pub fn run_to_report(&self, pod: &str, image: &str, command: &[&str], timeout: Duration) -> serde_json::Value {
        self.start_pod(pod, image, command);
        self.pod_report(pod, timeout)
    }

    /// Starts `command` in a pod `pod` of `image` that runs once (`kubectl run --restart Never`).
    pub fn start_pod(&self, pod: &str, image: &str, command: &[&str]) {
        let run = [
            "run",
            pod,
            "-n",
            &self.name,
            "--image",
            image,
            "--image-pull-policy",
            "IfNotPresent",
            "--restart",
            "Never",
            "--command",
            "--",
        ];
        let o = cluster().kubectl(&[&run[..], command].concat());
        assert!(o.status.success(), "{}", text(&o));
    }

    /// The last log line, as JSON, of pod `pod` once it succeeded (within `timeout`).
    pub fn pod_report(&self, pod: &str, timeout: Duration) -> serde_json::Value {
        wait_for(timeout, &format!("pod {pod} to finish"), || {
            let p = self.get_json("pod", pod)?;
            match p["status"]["phase"].as_str() {
                Some("Succeeded") => Ok(()),
                Some("Failed") => panic!("pod {pod} failed: {}", text(&cluster().kubectl(&["logs", "-n", &self.name, pod]))),
                _ => Err(p["status"].to_string()),
            }
        });
        let o = cluster().kubectl(&["logs", "-n", &self.name, pod]);
        let line = String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or_default().to_owned();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("pod {pod} printed {line:?}: {e}"))
    }

    /// The pods of PDDeployment `deployment` in this namespace whose role is one of `roles`
    /// (comma-separated: `prefill,decode`, `dry-run`).
    pub fn role_pods(&self, deployment: &str, roles: &str) -> Vec<serde_json::Value> {
        let sel = format!("pd.inference.dev/deployment={deployment},pd.inference.dev/role in ({roles})");
        let o = cluster().kubectl(&["get", "pods", "-n", &self.name, "-l", &sel, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        v["items"].as_array().cloned().unwrap_or_default()
    }

    pub fn get_json(&self, kind: &str, name: &str) -> Result<serde_json::Value, String> {
        let o = cluster().kubectl(&["get", kind, name, "-n", &self.name, "-o", "json"]);
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // `PD_E2E_KEEP_FAILED=1` leaves a failed test's namespace for a look.
        if std::thread::panicking() && std::env::var("PD_E2E_KEEP_FAILED").is_ok_and(|v| !v.is_empty()) {
            eprintln!("namespace {} kept", self.name);
            return;
        }
        let _ = cluster().kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// Polls `check` until it returns Ok or `timeout` passes; the panic shows the last state seen.
pub fn wait_for<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(last) if start.elapsed() > timeout => panic!("timed out after {timeout:?} waiting for {what}; last state:\n{last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// The condition of `type_` in an object's `status.conditions`.
pub fn condition(v: &serde_json::Value, type_: &str) -> Option<serde_json::Value> {
    v["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

/// SGLang's text when the prefill stand-in advertises page size 32 to a decode launched with 64.
pub const PAGE_SIZE_32_VS_64: &str = "Page size mismatch: prefill server has page_size=32, but decode server has page_size=64. Both servers must use the same --page-size value.";

/// Waits until the PDDeployment reports `HandshakeReady=False` because of a page-size mismatch.
pub fn wait_page_size_mismatch(ns: &TestNamespace, pdd: &str, timeout: Duration) {
    wait_for(timeout, "HandshakeReady=False with SGLang's page-size text", || {
        let v = ns.get_json("pdd", pdd)?;
        let c = condition(&v, "HandshakeReady").ok_or_else(|| v["status"].to_string())?;
        (c["status"] == "False"
            && c["reason"] == "PageSizeMismatch"
            && c["message"].as_str().is_some_and(|m| m.contains(PAGE_SIZE_32_VS_64)))
        .then_some(())
        .ok_or_else(|| c.to_string())
    });
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub fn repo_path(p: &str) -> PathBuf {
    repo().join(p)
}

/// `pd-operator controller` as a host process scoped to one namespace; killed on drop.
pub struct ControllerProcess {
    child: Option<std::process::Child>,
    pub admin_port: u16,
    pub log: PathBuf,
    namespace: String,
    extra: Vec<String>,
    kubeconfig: PathBuf,
    env: Vec<(String, String)>,
}

/// Ports handed out by [`free_port`]: below Linux's default ephemeral range (32768–60999), which
/// the kernel uses for the source ports of outgoing connections. A port taken from that range
/// (bind to port 0) could be given to some test's outgoing connection between the pick and the
/// stand-in's bind; a registrar once lost its port that way and its registered ranks refused.
const FREE_PORTS: std::ops::Range<u16> = 20000..32768;
/// The egress lists the suites' operator runs with: the defaults, and 127.0.0.1 by its address.
pub const LOOPBACK_EGRESS: [&str; 4] = [
    "--allowed-hub-endpoints",
    "https://huggingface.co,http://127.0.0.1",
    "--allowed-prometheus-hosts",
    "*.svc,*.svc.cluster.local,http://127.0.0.1",
];

/// A port nothing listens on, and one this test process has not handed out before (two replicas
/// started together once got the same admin port). Chosen at random in [`FREE_PORTS`], so test
/// binaries running side by side rarely try the same one; a port in use is skipped.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = rand::random_range(FREE_PORTS);
        if given.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.push(port);
        return port;
    }
}

impl ControllerProcess {
    /// The controller alone (no webhook), watching `namespace`.
    pub fn start(namespace: &str) -> Self {
        Self::start_with(namespace, &["--webhook=false"])
    }

    pub fn start_with(namespace: &str, extra: &[&str]) -> Self {
        Self::start_as(namespace, extra, &cluster().kubeconfig)
    }

    /// Runs with another identity, e.g. a ServiceAccount token's kubeconfig.
    pub fn start_as(namespace: &str, extra: &[&str], kubeconfig: &Path) -> Self {
        let p = Self::launch(namespace, extra, kubeconfig, &[]);
        p.wait_ready();
        p
    }

    /// Starts the process without waiting for it to be ready (e.g. two replicas at one instant);
    /// `env` sets e.g. POD_NAME, the replica's leader-election identity.
    pub fn launch(namespace: &str, extra: &[&str], kubeconfig: &Path, env: &[(&str, &str)]) -> Self {
        let admin_port = free_port();
        let log = std::env::temp_dir().join(format!("pd-controller-{namespace}-{admin_port}.log"));
        let mut p = Self {
            child: None,
            admin_port,
            log,
            namespace: namespace.into(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            kubeconfig: kubeconfig.to_owned(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        };
        p.launch_process();
        p
    }

    fn launch_process(&mut self) {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        // The suites' operator image, unless the test names one (an operator upgrade).
        let image: &[&str] =
            if self.extra.iter().any(|a| a == "--operator-image") { &[] } else { &["--operator-image", "pd-operator:e2e"] };
        // The suites' stand-in Hubs and Prometheus listen on this host's loopback: this test
        // platform lists 127.0.0.1 by its exact address, as a platform team may list a host the
        // built-in refusals would keep out (`pd_core::egress`); unless the test sets the lists.
        let egress: &[&str] = if self.extra.iter().any(|a| a.starts_with("--allowed-")) { &[] } else { &LOOPBACK_EGRESS };
        let child = Command::new(bin("pd-operator"))
            .args(["controller", "--namespace", &self.namespace, "--leader-election-namespace", &self.namespace])
            .args(["--admin-addr", &format!("127.0.0.1:{}", self.admin_port)])
            .args(image)
            .args(egress)
            .args(&self.extra)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PD_LOG_LEVEL", "info,pd_operator=debug")
            // A host process is registered by URL: no Service endpoint to leave, nothing to drain
            // for (unless the test says otherwise).
            .env("PD_WEBHOOK_DRAIN", "0s")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start pd-operator controller");
        self.child = Some(child);
    }

    pub fn wait_ready(&self) {
        wait_for(Duration::from_secs(30), "the controller's /readyz", || {
            self.get("/readyz").filter(|b| b == "ok").ok_or_else(|| self.log_tail())
        });
    }

    /// Hard-kills the process (SIGKILL), as a node failure would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.launch_process();
        self.wait_ready();
    }

    /// SIGTERM, as the kubelet stops a pod; the process is left to end on its own.
    pub fn terminate(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
        }
    }

    /// The exit status, once the process has ended within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(std::process::Child::try_wait) {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// An admin endpoint's status code and body, whatever the status.
    pub fn get_any(&self, path: &str) -> Option<(u16, String)> {
        let url = format!("http://127.0.0.1:{}{path}", self.admin_port);
        let o = Command::new("curl").args(["-s", "--max-time", "5", "-w", "\n%{http_code}", &url]).output().ok()?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = out.rsplit_once('\n')?;
        Some((code.parse().ok().filter(|c| *c != 0)?, body.to_owned()))
    }

    pub fn get(&self, path: &str) -> Option<String> {
        let o =
            Command::new("curl").args(["-sf", "--max-time", "5", &format!("http://127.0.0.1:{}{path}", self.admin_port)]).output().ok()?;
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Sum of `pd_operator_api_writes_total` over all verbs and resources.
    pub fn api_writes(&self) -> u64 {
        let text = self.get("/metrics").unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("pd_operator_api_writes_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// `pd_operator_leader`: Some(true) while this replica holds the lease.
    pub fn leads(&self) -> Option<bool> {
        let text = self.get("/metrics")?;
        let value = text.lines().find(|l| l.starts_with("pd_operator_leader "))?.rsplit(' ').next()?.parse::<f64>().ok()?;
        Some(value == 1.0)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM first: the controller shuts down gracefully.
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            for _ in 0..50 {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Any helper process (an engine stand-in, SGLang's server, a sidecar); SIGKILLed on drop.
pub struct Background {
    child: std::process::Child,
    pub log: PathBuf,
}

impl Background {
    pub fn spawn(name: &str, cmd: &mut Command) -> Self {
        let log = std::env::temp_dir().join(format!("pd-{name}-{}-{}.log", std::process::id(), free_port()));
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd.stdout(out.try_clone().unwrap()).stderr(out).spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        Self { child, log }
    }

    /// `pd-operator ARGS` in the background.
    pub fn operator(name: &str, args: &[&str]) -> Self {
        Self::spawn(name, Command::new(bin("pd-operator")).args(args).env("PD_LOG_LEVEL", "info,pd_operator=debug"))
    }

    /// The stand-in (`pd-sim ARGS`), e.g. `["prefill", "--tp-size", "2"]`.
    pub fn sim(name: &str, args: &[&str]) -> Self {
        Self::spawn(name, Command::new(bin("pd-sim")).args(args).env("PD_LOG_LEVEL", "info,pd_sim=debug"))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `port` on 127.0.0.1 accepts connections.
    pub fn wait_port(&self, port: u16) {
        wait_for(Duration::from_secs(30), &format!("port {port}"), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).map(|_| ()).map_err(|e| format!("{e}; log:\n{}", self.log_text()))
        });
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then asserts a clean exit (status 0) within 5 s.
    pub fn terminate_and_wait_success(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "exit after SIGTERM: {status}; log:\n{}", self.log_text());
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("still running 5 s after SIGTERM; log:\n{}", self.log_text());
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `pd-operator ARGS` to completion: (exit code, stdout, stderr).
pub fn operator(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(bin("pd-operator")).args(args).output().expect("run pd-operator");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A kubeconfig that holds only a token of ServiceAccount `ns/account` (valid one hour).
pub fn token_kubeconfig(ns: &str, account: &str) -> PathBuf {
    let o = cluster().kubectl(&["create", "token", account, "-n", ns, "--duration", "1h"]);
    assert!(o.status.success(), "{}", text(&o));
    let token = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let admin: serde_json::Value = serde_norway::from_str(&std::fs::read_to_string(&cluster().kubeconfig).unwrap()).unwrap();
    let server = admin["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let ca = admin["clusters"][0]["cluster"]["certificate-authority"].as_str().unwrap();
    let kubeconfig = std::env::temp_dir().join(format!("sa-{ns}-{account}.kubeconfig"));
    std::fs::write(&kubeconfig, format!("apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{ca}\"}}}}]\nusers: [{{name: sa, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: sa}}}}]\ncurrent-context: c\n")).unwrap();
    kubeconfig
}

/// Names per kind of every object `pd-operator render -f FILE -n NS` prints.
pub fn rendered_names(file: &Path, ns: &str) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let o = Command::new(bin("pd-operator"))
        .args(["render", "-f", file.to_str().unwrap(), "-n", ns, "--operator-image", "pd-operator:e2e"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut out: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for doc in serde_norway::Deserializer::from_slice(&o.stdout) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
        if let (Some(kind), Some(name)) = (v["kind"].as_str(), v["metadata"]["name"].as_str()) {
            out.entry(kind.to_owned()).or_default().insert(name.to_owned());
        }
    }
    out
}

/// The flags that run a host-process operator as the chart's release `full` would: its Lease,
/// its webhook registration and Secret, serving on 127.0.0.1:`port` (registered by URL).
pub fn chart_operator_args(full: &str, port: u16) -> Vec<String> {
    let (addr, secret) = (format!("127.0.0.1:{port}"), format!("{full}-webhook-tls"));
    let args = ["--webhook-addr", &addr, "--webhook-ip-sans", "127.0.0.1", "--webhook-config", full, "--webhook-secret", &secret];
    args.iter().chain(&["--lease-name", full]).map(|s| (*s).to_owned()).collect()
}
