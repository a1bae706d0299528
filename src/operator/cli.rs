//! Command-line interface: parses arguments and dispatches to the library. Exit codes: 0
//! success, 1 a check failed, 2 unreadable input, 3 timeout, 4 a runtime failure (`EXIT_CODES`,
//! which `--help` prints, says which when).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;

use pd_core::egress;
use pd_core::findings::Severity;
use pd_core::offline::{self, Assumed, check_one};
use pd_core::render::{self, RenderOptions};
use pd_core::validate;
use pd_runtime::telemetry::LogArgs;
use pd_runtime::verdict_args::VerdictArgs;

/// What every subcommand's exit status means (`pd-operator --help` prints it).
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  a check failed: validate found violations, render an invalid spec, handshake a failed check
  2  unreadable input: files, flags, stdin
  3  timeout: handshake run --once waited out --timeout
  4  a runtime failure: the Kubernetes API unreachable, a port taken, the output not written, a model fetch stopped";

#[derive(Parser, Debug)]
#[command(name = "pd-operator", version, about = "Prefill/decode disaggregated SGLang on Kubernetes, checked before it reaches a GPU")]
#[command(after_help = EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub logging: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the PDDeployment CustomResourceDefinition (what crds/ holds).
    Crd,
    /// Check PDDeployments against SGLang 0.5.23's rules, offline.
    Validate(ValidateArgs),
    /// Print every object and engine argv the controller would create.
    Render(RenderArgs),
    /// SGLang's decode-side bootstrap handshake.
    #[command(subcommand)]
    Handshake(HandshakeCommand),
    /// Run the controller: reconcile PDDeployments into engine pods, services and a router.
    Controller(Box<ControllerArgs>),
    /// Download a Hugging Face repository at a revision into a directory, resumable and checked
    /// (what the fetch Job of `spec.model.source.huggingFace.cache` runs).
    FetchModel(crate::model_fetch::FetchModelArgs),
    /// Read a model's config.json and write it where the operator reads it (what the Job reading
    /// a `pvc`, `image` or `hostPath` source's config.json runs).
    ReadModelConfig(crate::model_read::ReadModelConfigArgs),
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Address of the admin server (/livez, /readyz, /metrics).
    #[arg(long, env = "PD_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: std::net::SocketAddr,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "PD_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// pd-operator's own image (the handshake sidecar).
    #[arg(long, env = "PD_OPERATOR_IMAGE", default_value_t = render::default_operator_image())]
    pub operator_image: String,
    /// The stand-in's image (`pd-sim`), for `engine.type: sim` with no `engine.image`.
    #[arg(long, env = "PD_SIM_IMAGE", default_value_t = render::default_sim_image())]
    pub sim_image: String,
    /// PDDeployments reconciled at once. Bounds memory and the controller's share of the
    /// apiserver when hundreds change together; 0 means no limit.
    #[arg(long, env = "PD_MAX_CONCURRENT_RECONCILES", default_value_t = 32)]
    pub max_concurrent_reconciles: u16,
    /// Engine pods held rendered at once across all reconciles: each reconcile takes its
    /// PDDeployment's pod count (at most this many) before rendering and gives it back when done,
    /// so the memory of rendered pods stays bounded however many large objects change together.
    #[arg(long, env = "PD_MAX_RENDERED_PODS", default_value_t = pd_core::bounds::DEFAULT_MAX_RENDERED_PODS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rendered_pods: u32,
    /// Seconds between reconciles of an unchanged PDDeployment (a change reconciles at once).
    #[arg(long, env = "PD_RESYNC_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_seconds: u64,
    /// Elect a leader through a Lease so several replicas can run.
    #[arg(long, env = "PD_LEADER_ELECT", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    #[arg(long, default_value = "pd-operator-leader")]
    pub lease_name: String,
    /// Serve the validating admission webhook.
    #[arg(long, env = "PD_WEBHOOK", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub webhook: bool,
    #[arg(long, env = "PD_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: std::net::SocketAddr,
    /// Directory with tls.crt and tls.key (e.g. from cert-manager); re-read when they change.
    /// Without it the operator generates and rotates its own CA and certificate.
    #[arg(long, env = "PD_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// Secret that stores the self-managed CA and serving certificate.
    #[arg(long, default_value = "pd-operator-webhook-tls")]
    pub webhook_secret: String,
    /// Namespace of that Secret (defaults to the leader-election namespace).
    #[arg(long)]
    pub webhook_secret_namespace: Option<String>,
    /// ValidatingWebhookConfiguration whose caBundle the operator keeps current.
    #[arg(long, default_value = "pd-operator")]
    pub webhook_config: String,
    /// DNS names in the serving certificate (default: pd-operator-webhook.<namespace>.svc).
    #[arg(long, value_delimiter = ',')]
    pub webhook_dns_names: Vec<String>,
    /// IP addresses in the serving certificate (for a webhook reached by URL, e.g. 127.0.0.1).
    #[arg(long, value_delimiter = ',')]
    pub webhook_ip_sans: Vec<std::net::IpAddr>,
    /// After SIGTERM the webhook keeps answering this long (not ready meanwhile) while the
    /// apiserver and kube-proxy stop sending to this replica, then closes its connections. Keep
    /// the pod's terminationGracePeriodSeconds above it plus 5 s.
    #[arg(long, env = "PD_WEBHOOK_DRAIN", default_value = "10s", value_parser = parse_duration)]
    pub webhook_drain: std::time::Duration,
    /// Kubernetes' gang scheduling API (PodGroup, scheduling.k8s.io/v1beta1): `discover` asks the
    /// cluster once at start; `off` takes it as not served (placement.gang auto schedules pods one
    /// by one, workload is refused at admission and reported Validated=False).
    #[arg(long, env = "PD_WORKLOAD_API", value_enum, default_value = "discover")]
    pub workload_api: WorkloadApi,
    /// Hub endpoints a spec's model.source.huggingFace.endpoint may name, comma-separated:
    /// `[http://|https://]HOST[:PORT]` or `*.SUFFIX`. Loopback, link-local and metadata hosts
    /// only when listed by their exact name or address. Empty: no Hub source is admitted.
    #[arg(long, env = "PD_ALLOWED_HUB_ENDPOINTS", value_delimiter = ',', default_value = egress::DEFAULT_HUB_ENDPOINTS)]
    pub allowed_hub_endpoints: Vec<String>,
    /// Prometheus hosts a spec's autoscaling.prometheus.url may name, in the same form.
    #[arg(long, env = "PD_ALLOWED_PROMETHEUS_HOSTS", value_delimiter = ',', default_value = egress::DEFAULT_PROMETHEUS_HOSTS)]
    pub allowed_prometheus_hosts: Vec<String>,
    /// Engine pods one PDDeployment may ask for (both roles, every instance and surge instance
    /// times its nodes). A larger spec is denied at admission and reported Validated=False.
    #[arg(long, env = "PD_MAX_PODS_PER_DEPLOYMENT", default_value_t = pd_core::bounds::DEFAULT_MAX_PODS_PER_DEPLOYMENT, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pods_per_deployment: u32,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadApi {
    Discover,
    Off,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub verdict: VerdictArgs,
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct RenderArgs {
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// Namespace for objects that name none.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// pd-operator's own image (the handshake sidecar).
    #[arg(long, env = "PD_OPERATOR_IMAGE", default_value_t = render::default_operator_image())]
    pub operator_image: String,
    /// The stand-in's image (`pd-sim`), for `engine.type: sim` with no `engine.image`.
    #[arg(long, env = "PD_SIM_IMAGE", default_value_t = render::default_sim_image())]
    pub sim_image: String,
    /// The namespace the operator runs in: a planner that scrapes the engines itself is let in
    /// from there by the engines' NetworkPolicy.
    #[arg(long, default_value = render::DEFAULT_OPERATOR_NAMESPACE)]
    pub operator_namespace: String,
    /// Render as for a cluster that serves Kubernetes' gang scheduling API (PodGroups for
    /// `placement.gang: auto`); the controller finds this out from the cluster itself.
    #[arg(long)]
    pub workload_api: bool,
}

#[derive(Subcommand, Debug)]
pub enum HandshakeCommand {
    /// Run the decode's checks and rank mapping against one prefill topology body.
    Check(CheckArgs),
    /// The decode pod's sidecar: handshake against live prefill bootstrap servers.
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Decode topology JSON file (what `render` puts into the `<name>-handshake` ConfigMap).
    #[arg(long)]
    pub decode: PathBuf,
    /// A prefill bootstrap address, `host:port`; repeatable.
    #[arg(long = "prefill")]
    pub prefills: Vec<String>,
    /// File with one prefill bootstrap address per line; re-read every 5 s.
    #[arg(long)]
    pub prefill_file: Option<PathBuf>,
    /// Check once, print a JSON report, exit 0 (passed), 1 (a check failed), 2 (unreadable input),
    /// 3 (timeout) or 4 (the API, the --listen port or stdout failed).
    #[arg(long)]
    pub once: bool,
    /// With --once: how long to wait for prefills that are still starting, e.g. `90s`, `5m`.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
    /// Report to this pod (`NAMESPACE/NAME`): the readiness-gate condition and the rank map.
    #[arg(long)]
    pub pod: Option<String>,
    /// Serve /livez, /readyz and /status here.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let span: jiff::Span = s.parse().map_err(|e| format!("{s:?} is not a duration like 90s or 5m: {e}"))?;
    let d = jiff::SignedDuration::try_from(span).map_err(|e| format!("{s:?}: {e}"))?;
    std::time::Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Decode topology JSON file.
    #[arg(long, required_unless_present = "jsonl")]
    pub decode: Option<PathBuf>,
    /// Prefill topology body (what `GET /route` with four -1 returns).
    #[arg(long, required_unless_present = "jsonl")]
    pub prefill_info: Option<PathBuf>,
    /// Read `{"decode": ..., "prefill_info": ...}` lines from stdin, write one result per line.
    #[arg(long, conflicts_with_all = ["decode", "prefill_info"])]
    pub jsonl: bool,
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd => match pd_api::crd_yaml() {
            Ok(yaml) => write_stdout(&yaml).err().unwrap_or(ExitCode::SUCCESS),
            Err(e) => runtime_error(e),
        },
        Command::Validate(args) => run_validate(args),
        Command::Render(args) => run_render(args),
        Command::Handshake(HandshakeCommand::Check(args)) => run_check(args),
        Command::Handshake(HandshakeCommand::Run(args)) => run_sidecar(args),
        Command::Controller(args) => run_controller(*args),
        Command::FetchModel(args) => crate::model_fetch::run(args),
        Command::ReadModelConfig(args) => crate::model_read::run(&args),
    }
}

/// A multi-threaded runtime; worker stacks are roomy because rendered pods are large structs.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(8 << 20).build()
}

fn run_controller(args: ControllerArgs) -> ExitCode {
    let egress = match egress::EgressPolicy::new(&args.allowed_hub_endpoints, &args.allowed_prometheus_hosts) {
        Ok(p) => p,
        Err(e) => return input_error(e),
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return runtime_error(format!("cannot start the async runtime: {e}")),
    };
    let code = rt.block_on(async move {
        let client = match pd_runtime::kube_client::connect().await {
            Ok(c) => c,
            Err(e) => {
                return runtime_error(format!("cannot reach the Kubernetes API (KUBECONFIG or in-cluster config): {e}"));
            }
        };
        let identity = std::env::var("POD_NAME").unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
        let secret_ns = args.webhook_secret_namespace.clone().unwrap_or_else(|| args.leader_election_namespace.clone());
        let webhook = args.webhook.then(|| crate::webhook::WebhookSettings {
            addr: args.webhook_addr,
            drain: args.webhook_drain,
            max_pods: args.max_pods_per_deployment,
            certs: match args.webhook_cert_dir.clone() {
                Some(dir) => crate::webhook::tls::CertSource::Files { dir },
                None => crate::webhook::tls::CertSource::SelfManaged {
                    dns_names: if args.webhook_dns_names.is_empty() {
                        vec![format!("pd-operator-webhook.{secret_ns}.svc")]
                    } else {
                        args.webhook_dns_names.clone()
                    },
                    namespace: secret_ns,
                    secret: args.webhook_secret.clone(),
                    webhook_config: args.webhook_config.clone(),
                    ips: args.webhook_ip_sans.clone(),
                },
            },
            egress: egress.clone(),
        });
        let settings = crate::controller::Settings {
            webhook,
            admin_addr: args.admin_addr,
            render: RenderOptions {
                operator_image: args.operator_image,
                sim_image: args.sim_image,
                default_namespace: "default".into(),
                operator_namespace: args.leader_election_namespace.clone(),
                workload_api: false,
            },
            namespace: args.namespace,
            max_concurrent_reconciles: args.max_concurrent_reconciles,
            max_rendered_pods: args.max_rendered_pods,
            resync: std::time::Duration::from_secs(args.resync_seconds),
            leader_election: args.leader_elect.then_some(crate::controller::LeaderSettings {
                namespace: args.leader_election_namespace,
                lease: args.lease_name,
                identity,
            }),
            discover_workload_api: args.workload_api == WorkloadApi::Discover,
            egress,
            max_pods: args.max_pods_per_deployment,
        };
        match crate::controller::run(client, settings).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "controller failed");
                runtime_error(e)
            }
        }
    });
    // Background tasks (certificate refresh, lease renewal, open connections) end with the process.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

fn run_sidecar(args: RunArgs) -> ExitCode {
    use crate::handshake::sidecar::{self, SidecarConfig};
    if args.prefills.is_empty() && args.prefill_file.is_none() {
        return input_error("give at least one --prefill HOST:PORT or a --prefill-file");
    }
    let decode = match sidecar::read_decode(&args.decode) {
        Ok(d) => d,
        Err(e) => return input_error(e),
    };
    let pod = match args.pod.as_deref().map(sidecar::parse_pod_ref).transpose() {
        Ok(p) => p,
        Err(e) => return input_error(e),
    };
    let cfg = SidecarConfig { decode, prefills: args.prefills, prefill_file: args.prefill_file, pod, listen: args.listen };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return runtime_error(format!("cannot start the async runtime: {e}")),
    };
    let code = rt.block_on(async move {
        if args.once {
            return match sidecar::run_once(&cfg, args.timeout).await {
                Ok((report, code)) => write_stdout(&format!("{report}\n")).err().unwrap_or(ExitCode::from(code)),
                Err(e) => sidecar_error(e),
            };
        }
        match sidecar::run(cfg, pd_runtime::shutdown::token("the handshake sidecar").cancelled_owned()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => sidecar_error(e),
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_else(|_| "pd-operator".into())
}

/// Exit 2: the input (files, flags) cannot be read or used.
fn input_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

/// Exit 4: the input was fine, but running failed (the Kubernetes API unreachable, a port taken,
/// the output not written).
pub(crate) fn runtime_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(4)
}

/// Exit 4 for output that could not be written (a closed pipe, a full disk): the input was
/// readable, so this is no exit 2, and a run whose output is lost did not succeed.
fn stdout_error(e: std::io::Error) -> ExitCode {
    runtime_error(format!("cannot write to stdout: {e}"))
}

/// Writes `text` to stdout and flushes it (`Err`: the exit code to end with).
fn write_stdout(text: &str) -> Result<(), ExitCode> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(stdout_error)
}

fn sidecar_error(e: crate::handshake::sidecar::SidecarError) -> ExitCode {
    use crate::handshake::sidecar::SidecarError as E;
    match e {
        E::Read { .. } | E::Decode { .. } | E::PodRef(_) => input_error(e),
        E::Kube(_) | E::Listen { .. } => runtime_error(e),
    }
}

fn run_validate(args: ValidateArgs) -> ExitCode {
    let (loaded, config) = match offline::load(&args.verdict.files, &args.verdict.model_config) {
        Ok(v) => v,
        Err(e) => return input_error(e),
    };
    let (out, all_valid) = match offline::report(&loaded, config.as_ref(), args.verdict.assumed(), args.output == OutputFormat::Json) {
        Ok(r) => r,
        Err(e) => return runtime_error(format!("cannot serialize the report: {e}")),
    };
    if let Err(code) = write_stdout(&out) {
        return code;
    }
    if all_valid { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

fn run_render(args: RenderArgs) -> ExitCode {
    let (loaded, config) = match offline::load(&args.files, &args.model_config) {
        Ok(v) => v,
        Err(e) => return input_error(e),
    };
    let opts = RenderOptions {
        operator_image: args.operator_image,
        sim_image: args.sim_image,
        default_namespace: args.namespace,
        operator_namespace: args.operator_namespace,
        workload_api: args.workload_api,
    };
    let mut failed = false;
    let mut out = String::new();
    for d in &loaded.deployments {
        let name = d.object.metadata.name.clone().unwrap_or_default();
        let (findings, facts) = check_one(d, &loaded, config.as_ref(), Assumed::default());
        for f in &findings {
            eprintln!("{}{name}: {f}", if f.severity == Severity::Warning { "warning: " } else { "error: " });
        }
        if !validate::is_valid(&findings) {
            eprintln!("{name}: not rendered: the controller creates nothing for an invalid PDDeployment");
            failed = true;
            continue;
        }
        match render::render(&d.object, &facts, &opts).and_then(|r| r.to_yaml()) {
            Ok(yaml) => out.push_str(&format!("# {name}: {}\n{yaml}", facts.describe(&d.object.spec.model.path))),
            Err(e) => {
                eprintln!("{name}: {e}");
                failed = true;
            }
        }
    }
    if let Err(code) = write_stdout(&out) {
        return code;
    }
    if failed { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

fn read_json(path: &PathBuf) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: invalid JSON: {e}", path.display()))
}

fn run_check(args: CheckArgs) -> ExitCode {
    use pd_core::handshake::core::check_json;
    if args.jsonl {
        let mut out = std::io::stdout().lock();
        let mut all_ok = true;
        for line in std::io::stdin().lock().lines() {
            let result = match line {
                Err(e) => serde_json::json!({"ok": false, "kind": "InputError", "error": format!("cannot read stdin: {e}")}),
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) => match serde_json::from_str::<Value>(&line) {
                    Err(e) => serde_json::json!({"ok": false, "kind": "InputError", "error": format!("invalid JSON line: {e}")}),
                    Ok(v) => match (v.get("decode"), v.get("prefill_info")) {
                        (Some(d), Some(p)) if v.as_object().is_some_and(|o| o.len() == 2) => check_json(d, p).0,
                        _ => {
                            serde_json::json!({"ok": false, "kind": "InputError", "error": "each line must be an object with exactly the keys \"decode\" and \"prefill_info\""})
                        }
                    },
                },
            };
            all_ok &= result["ok"] == true;
            if let Err(e) = writeln!(out, "{result}") {
                return stdout_error(e);
            }
        }
        return if all_ok { ExitCode::SUCCESS } else { ExitCode::from(1) };
    }
    let (Some(d), Some(p)) = (args.decode, args.prefill_info) else {
        return input_error("--decode and --prefill-info are required without --jsonl");
    };
    let (decode, prefill) = match (read_json(&d), read_json(&p)) {
        (Ok(d), Ok(p)) => (d, p),
        (Err(e), _) | (_, Err(e)) => return input_error(e),
    };
    let (result, ok) = check_json(&decode, &prefill);
    if let Err(code) = write_stdout(&format!("{result}\n")) {
        return code;
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
