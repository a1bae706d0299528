//! The engine dry run, the gate before GPUs (docs/dry-run.md), its pure part: the dry-run pod
//! that runs the PDDeployment's own engine image CPU-only with our shim (`dryrun/shim.py`, the
//! parity oracle's code), the key its verdict is cached by, the reading of the verdict from the
//! pod, and whether engine pods may be created.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, KeyToPath, Pod, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::names::shim_config_name;
use crate::pod::Phase;
use crate::render::{self, InstancePods, SHIM_KEY};
use pd_api::conditions::HasStatus;
use pd_api::{DryRunPolicy, EngineVerification, PDDeployment, Role};

const SHIM_DIR: &str = "/pd-dry-run";
const MODEL_DIR: &str = "/pd-dry-run-model";
/// The one writable directory of the dry-run container (its root file system is read-only):
/// `HOME` and `TMPDIR`, where the shim writes the model's config.json per process and torch and
/// Triton keep their caches.
const SCRATCH_DIR: &str = "/tmp";
const SCRATCH_SIZE: &str = "1Gi";
/// The variable that hands the shim its input (the processes).
pub const INPUT_ENV: &str = "PD_DRY_RUN_INPUT";
/// `pd.inference.dev/role` of the dry-run pod.
pub const DRY_RUN_ROLE: &str = "dry-run";
const CONTAINER: &str = "dry-run";
/// The bound on the shim's run once the pod started (`activeDeadlineSeconds`).
pub const DEADLINE_SECONDS: i64 = 600;
/// The bound on the whole dry run from the pod's creation: scheduling and the image pull (an
/// engine image is many GB) included.
pub const TOTAL_SECONDS: i64 = 1200;
/// A dry run that gave no verdict (time-out, crash) runs again this long after, under `Required`.
pub const RETRY_SECONDS: i64 = 300;

/// `status.engineVerification.result`, the `EngineVerified` condition's reasons.
pub const VERIFIED: &str = "Verified";
pub const REFUSED: &str = "EngineRefused";
pub const PENDING: &str = "Pending";
pub const TIMED_OUT: &str = "TimedOut";
pub const NO_VERDICT: &str = "NoVerdict";

#[derive(Debug, Error, PartialEq)]
pub enum DryRunError {
    #[error("could not serialize the dry-run input: {0}")]
    Serialize(String),
    #[error("the PDDeployment has no name")]
    NoName,
}

/// One engine process as the shim gets it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    pub role: Role,
    pub node: u32,
    pub profile: String,
    pub argv: Vec<String>,
    /// Variables with literal values.
    pub env: Vec<(String, String)>,
    /// Variables the pod's environment fills in (secrets, field references).
    pub env_from_pod: Vec<String>,
}

/// The shim's input.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    pub model_config_dir: Option<String>,
    pub processes: Vec<Process>,
}

/// A dry run to make: its key, and the pod that runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct DryRun {
    pub key: String,
    pub pod: Pod,
}

/// Every distinct process the spec renders: each pod of each role's first instance (the other
/// instances differ only in host names), with the engine container's argv and environment.
fn processes(pdd: &PDDeployment, instances: &[InstancePods]) -> (Vec<Process>, Vec<EnvVar>) {
    let (mut out, mut from_pod) = (Vec::new(), Vec::<EnvVar>::new());
    for inst in instances.iter().filter(|i| i.index == 0) {
        let profile = pdd.spec.role(inst.role).accelerator.unwrap_or_default().as_str().to_owned();
        for (node, pod) in (0u32..).zip(&inst.pods) {
            let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == crate::names::ENGINE_CONTAINER)) else {
                continue;
            };
            let (mut env, mut names) = (Vec::new(), Vec::new());
            for e in c.env.iter().flatten() {
                match (&e.value, &e.value_from) {
                    (_, Some(_)) => {
                        names.push(e.name.clone());
                        if !from_pod.iter().any(|f| f.name == e.name) {
                            from_pod.push(e.clone());
                        }
                    }
                    (v, None) => env.push((e.name.clone(), v.clone().unwrap_or_default())),
                }
            }
            let argv = c.args.clone().unwrap_or_default();
            out.push(Process { role: inst.role, node, profile: profile.clone(), argv, env, env_from_pod: names });
        }
    }
    (out, from_pod)
}

/// The dry run of what `instances` (the rendered engine pods) would run; `None` when the spec
/// turns it off or nothing is rendered.
pub fn dry_run(pdd: &PDDeployment, instances: &[InstancePods], opts: &render::RenderOptions) -> Result<Option<DryRun>, DryRunError> {
    let spec = &pdd.spec;
    if spec.engine.dry_run_policy() == DryRunPolicy::Off {
        return Ok(None);
    }
    let name = pdd.metadata.name.as_deref().ok_or(DryRunError::NoName)?;
    let ns = pdd.metadata.namespace.clone().unwrap_or_else(|| opts.default_namespace.clone());
    let (processes, from_pod) = processes(pdd, instances);
    if processes.is_empty() {
        return Ok(None);
    }
    // The spec's configMapRef, or the config.json the operator keeps for a Hub source.
    let config = crate::model_read::config_ref(name, &spec.model);
    let config = config.as_ref();
    let input = Input { model_config_dir: config.map(|_| MODEL_DIR.to_owned()), processes };
    let input_json = serde_json::to_string(&input).map_err(|e| DryRunError::Serialize(e.to_string()))?;
    let image = render::engine_image(spec, opts);
    let key =
        crate::names::short_hash(&serde_json::json!({"image": image, "input": input_json, "config": config, "source": spec.model.source}));
    let mut env = vec![EnvVar { name: INPUT_ENV.into(), value: Some(input_json), ..Default::default() }];
    env.extend(["HOME", "TMPDIR"].map(|n| EnvVar { name: n.into(), value: Some(SCRATCH_DIR.into()), ..Default::default() }));
    env.extend(from_pod);
    let mut mounts = vec![
        VolumeMount { name: "shim".into(), mount_path: SHIM_DIR.into(), read_only: Some(true), ..Default::default() },
        VolumeMount { name: "scratch".into(), mount_path: SCRATCH_DIR.into(), ..Default::default() },
    ];
    let mut volumes = vec![
        Volume {
            name: "shim".into(),
            config_map: Some(ConfigMapVolumeSource { name: shim_config_name(name), ..Default::default() }),
            ..Default::default()
        },
        Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource { size_limit: Some(Quantity(SCRATCH_SIZE.into())), ..Default::default() }),
            ..Default::default()
        },
    ];
    if let Some(r) = config {
        mounts.push(VolumeMount { name: "model-config".into(), mount_path: MODEL_DIR.into(), read_only: Some(true), ..Default::default() });
        let items = vec![KeyToPath { key: r.key.clone(), path: "config.json".into(), ..Default::default() }];
        volumes.push(Volume {
            name: "model-config".into(),
            config_map: Some(ConfigMapVolumeSource { name: r.name.clone(), items: Some(items), ..Default::default() }),
            ..Default::default()
        });
    }
    let shim = format!("{SHIM_DIR}/{SHIM_KEY}");
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image),
        image_pull_policy: spec.engine.image_pull_policy.clone(),
        command: Some(["python3", &shim, "--input-env", INPUT_ENV, "--verdict", "/dev/termination-log"].map(String::from).to_vec()),
        env: Some(env),
        resources: Some(resources()),
        volume_mounts: Some(mounts),
        // No verdict written (the shim died before it could): the log's tail says why.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(security_context(spec.prefill.template.security_context.as_ref())),
        ..Default::default()
    };
    Ok(Some(DryRun { pod: pod(pdd, (name, &ns), &key, container, volumes), key }))
}

/// A CPU-only container: no accelerator request. SGLang's import with torch needs a few GB of
/// memory; the image's layers are the node's, so ephemeral storage covers only the scratch
/// directory and the logs.
fn resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.into());
    ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".into(), q("500m")), ("memory".into(), q("2Gi")), ("ephemeral-storage".into(), q("256Mi"))])),
        limits: Some(BTreeMap::from([("cpu".into(), q("2")), ("memory".into(), q("8Gi")), ("ephemeral-storage".into(), q("2Gi"))])),
        ..Default::default()
    }
}

/// The dry-run container's security settings, admitted by the `restricted` Pod Security
/// Standard where the user's image allows it: no privilege escalation, no capability, the
/// runtime's seccomp profile, a read-only root file system. The user it runs as is the prefill
/// template's (`template.securityContext`: `runAsUser`, `runAsGroup`, `runAsNonRoot`), since
/// SGLang's images run as root by default and `runAsNonRoot` alone would make the kubelet refuse
/// them; what the engines need beyond that (privileged, `IPC_LOCK` for RDMA) the dry run does not.
pub fn security_context(template: Option<&SecurityContext>) -> SecurityContext {
    let t = template.cloned().unwrap_or_default();
    let non_root = t.run_as_non_root.or_else(|| t.run_as_user.map(|u| u != 0).filter(|n| *n));
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        privileged: None,
        read_only_root_filesystem: Some(true),
        run_as_non_root: non_root,
        seccomp_profile: t
            .seccomp_profile
            .filter(|p| p.type_ != "Unconfined")
            .or_else(|| Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() })),
        proc_mount: None,
        ..t
    }
}

/// The dry-run pod's name for a key.
pub fn pod_name(name: &str, key: &str) -> String {
    format!("{name}-dry-run-{key}")
}

/// The dry-run pod: beside the engines, where their image is cached (`crate::pod::beside_engines`).
fn pod(pdd: &PDDeployment, at: (&str, &str), key: &str, container: Container, volumes: Vec<Volume>) -> Pod {
    let (name, ns) = at;
    let mut pod = Pod::default();
    pod.metadata.name = Some(pod_name(name, key));
    pod.metadata.namespace = Some(ns.into());
    pod.metadata.labels = Some(crate::names::common_labels(name, DRY_RUN_ROLE));
    pod.metadata.owner_references = crate::names::owner_refs(pdd);
    let (annotations, spec) = crate::pod::beside_engines(pdd);
    pod.metadata.annotations = annotations;
    pod.spec = Some(PodSpec {
        restart_policy: Some("Never".into()),
        active_deadline_seconds: Some(DEADLINE_SECONDS),
        containers: vec![container],
        volumes: Some(volumes),
        ..spec
    });
    pod
}

/// Where SGLang refused something, and its own text.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Refusal {
    /// A process: `parse`, `resolve`, `check`, `parallel_state`; the handshake:
    /// `decode_handshake` (the decode's checks of the prefill's topology), `prefill_sender` (the
    /// prefill's answer to a decode registration) or `prefill_register`. `done` when it passed.
    #[serde(default)]
    pub stage: Option<String>,
    #[serde(default)]
    pub error_type: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

impl Refusal {
    /// `{what}: SGLang refused it at {stage}: {type}: {text}`.
    fn text(&self, what: String, default_stage: &str) -> String {
        let stage = self.stage.as_deref().unwrap_or(default_stage);
        let kind = self.error_type.as_deref().map(|t| format!("{t}: ")).unwrap_or_default();
        format!("{what}: SGLang refused it at {stage}: {kind}{}", self.error.as_deref().unwrap_or(""))
    }
}

/// ` on {accelerator}`, when the verdict names one.
fn on(profile: &Option<String>) -> String {
    profile.as_deref().map(|a| format!(" on {a}")).unwrap_or_default()
}

/// One process of the shim's verdict.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ProcessVerdict {
    pub role: String,
    pub node: u32,
    #[serde(default)]
    pub profile: Option<String>,
    pub ok: bool,
    #[serde(flatten)]
    pub refusal: Refusal,
}

/// The handshake between the first prefill and decode processes, by SGLang's own KV managers and
/// bootstrap server (`ran: false` with a `note` where the release cannot place ranks).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct HandshakeVerdict {
    pub ok: bool,
    #[serde(default)]
    pub ran: bool,
    #[serde(flatten)]
    pub refusal: Refusal,
    #[serde(default)]
    pub note: Option<String>,
    #[serde(default)]
    pub prefill_profile: Option<String>,
    #[serde(default)]
    pub decode_profile: Option<String>,
}

/// The shim's verdict, as its termination message carries it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Verdict {
    pub ok: bool,
    #[serde(default)]
    pub sglang: Option<String>,
    #[serde(default)]
    pub processes: Vec<ProcessVerdict>,
    /// Absent from shims older than the handshake stage.
    #[serde(default)]
    pub handshake: Option<HandshakeVerdict>,
}

impl Verdict {
    /// SGLang's text per refused process, and the handshake's.
    pub fn refusals(&self) -> String {
        let mut texts: Vec<String> = self
            .processes
            .iter()
            .filter(|p| !p.ok)
            .map(|p| p.refusal.text(format!("{} node {}{}", p.role, p.node, on(&p.profile)), "start-up"))
            .collect();
        if let Some(h) = self.handshake.as_ref().filter(|h| !h.ok) {
            let what = format!("the handshake of decode node 0{} with prefill node 0{}", on(&h.decode_profile), on(&h.prefill_profile));
            texts.push(h.refusal.text(what, "handshake"));
        }
        if texts.is_empty() { "SGLang refused the processes (no process named)".into() } else { texts.join("; ") }
    }

    /// What a passing verdict says: the release, and whether its code judged the handshake too.
    pub fn accepted(&self) -> String {
        let release = self.sglang.as_deref().unwrap_or("?");
        match &self.handshake {
            Some(h) if h.ran => format!("SGLang {release} accepts every process and the handshake of the two roles"),
            Some(h) => format!("SGLang {release} accepts every process; {}", h.note.as_deref().unwrap_or("the handshake was not run")),
            None => format!("SGLang {release} accepts every process"),
        }
    }
}

/// What the dry-run pod says: still running (what it waits for), or its verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Waiting(String),
    Done(EngineVerification),
}

/// What a dry-run pod said without a verdict (its log's tail, a traceback's last lines), cut
/// to the part that names the error and to printable text: the image's own output, whatever its
/// bytes, reaches status only as `remote` shows a remote text.
fn tail(message: &str) -> String {
    const KEEP: usize = 600;
    crate::remote::tail_within(message, KEEP)
}

/// Reads the dry-run pod (`now` and its creation in seconds since the epoch, for the bound).
pub fn read(pod: &Pod, key: &str, now: i64) -> Reading {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let container = status.container_statuses.iter().flatten().find(|c| c.name == CONTAINER);
    let image_id = container.map(|c| c.image_id.clone()).filter(|i| !i.is_empty());
    let done = |result: &str, message: String, sglang_version: Option<String>| {
        Reading::Done(EngineVerification {
            key: key.into(),
            result: result.into(),
            message,
            pod: None,
            image_id: image_id.clone(),
            sglang_version,
        })
    };
    // A deadline kills the container: its exit says nothing more than the pod's reason.
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return done(TIMED_OUT, format!("the dry-run pod {name} ran past {DEADLINE_SECONDS}s"), None);
    }
    if let Some(t) = container.and_then(|c| c.state.as_ref()?.terminated.clone()) {
        return match t.message.as_deref().map(serde_json::from_str::<Verdict>) {
            Some(Ok(v)) if v.ok => done(VERIFIED, v.accepted(), v.sglang.clone()),
            Some(Ok(v)) => done(REFUSED, v.refusals(), v.sglang),
            _ => {
                let said = t.message.as_deref().map(tail).unwrap_or_default();
                let why = format!("exit code {}{}", t.exit_code, t.reason.map(|r| format!(" ({r})")).unwrap_or_default());
                done(NO_VERDICT, format!("the dry-run pod {name} ended without a verdict: {why}; {said}"), None)
            }
        };
    }
    if Phase::of(status.phase.as_deref()) == Phase::Failed {
        let why = status.reason.clone().unwrap_or_default();
        return done(NO_VERDICT, format!("the dry-run pod {name} failed: {why} {}", status.message.clone().unwrap_or_default()), None);
    }
    let created = pod.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0.as_second());
    let waiting = waiting_for(&name, &status, container);
    if now - created > TOTAL_SECONDS {
        return done(TIMED_OUT, format!("no verdict {TOTAL_SECONDS}s after the dry-run pod was created; it was {waiting}"), None);
    }
    Reading::Waiting(waiting)
}

/// What a dry-run pod that has not ended waits for.
fn waiting_for(
    name: &str,
    status: &k8s_openapi::api::core::v1::PodStatus,
    container: Option<&k8s_openapi::api::core::v1::ContainerStatus>,
) -> String {
    let unscheduled = status.conditions.iter().flatten().find(|c| c.type_ == "PodScheduled" && c.is_false());
    if let Some(c) = unscheduled {
        return format!("waiting for the dry-run pod {name} to be scheduled: {}", c.message.clone().unwrap_or_default());
    }
    if let Some(w) = container.and_then(|c| c.state.as_ref()?.waiting.clone()) {
        let reason = w.reason.unwrap_or_default();
        return format!("waiting for the dry-run pod {name}: {reason} {}", w.message.unwrap_or_default()).trim_end().to_owned();
    }
    if container.and_then(|c| c.state.as_ref()?.running.as_ref()).is_some() {
        return format!("waiting for the dry-run pod {name}: SGLang's start-up resolution runs");
    }
    format!("waiting for the dry-run pod {name} to start")
}

/// What a pass does about the dry run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Engine pods may be created.
    Open,
    /// They may not; the verdict stands (until the spec changes).
    Closed,
    /// A dry run is under way: read its pod.
    Wait,
    /// Run a dry run (again).
    Run,
}

/// The gate for `key`, given the verdict known (`since`: seconds since it was reached).
pub fn gate(policy: DryRunPolicy, known: Option<&EngineVerification>, key: &str, since: i64) -> Gate {
    if policy == DryRunPolicy::Off {
        return Gate::Open;
    }
    let Some(v) = known.filter(|v| v.key == key) else { return Gate::Run };
    match v.result.as_str() {
        VERIFIED => Gate::Open,
        REFUSED => Gate::Closed,
        PENDING => Gate::Wait,
        _ if policy == DryRunPolicy::BestEffort => Gate::Open,
        _ if since >= RETRY_SECONDS => Gate::Run,
        _ => Gate::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus};

    fn pdd(yaml: &str) -> PDDeployment {
        let mut pdd: PDDeployment = serde_norway::from_str(yaml).unwrap();
        pdd.metadata.namespace = Some("ns".into());
        pdd
    }

    const SPEC: &str = "
apiVersion: pd.inference.dev/v1alpha1
kind: PDDeployment
metadata: {name: qwen}
spec:
  model: {path: Qwen/Qwen3-8B, configMapRef: {name: qwen-config}}
  prefill:
    replicas: 2
    parallelism: {tp: 2}
    accelerator: B200
    template:
      extraArgs: [--no-such-flag]
      nodeSelector: {pool: gpu}
      env: [{name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}, {name: A, value: b}]
  decode: {replicas: 3, parallelism: {tp: 2}}
";

    fn rendered(p: &PDDeployment) -> render::Rendered {
        let facts = crate::model::resolve(&p.spec.model, None);
        render::render(p, &facts, &render::RenderOptions::default()).unwrap()
    }

    fn run_of(p: &PDDeployment) -> Option<DryRun> {
        dry_run(p, &rendered(p).instances, &render::RenderOptions::default()).unwrap()
    }

    #[test]
    fn the_dry_run_pod_runs_the_engine_image_without_gpus_where_the_prefill_role_lands() {
        let p = pdd(SPEC);
        let run = run_of(&p).unwrap();
        let spec = run.pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        let r = rendered(&p);
        let engine = r.pods().next().unwrap().spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(c.image, engine.image, "the engine's own image");
        assert!(!format!("{:?}", c.resources).contains("nvidia.com/gpu"), "no GPU");
        assert_eq!(spec.node_selector.as_ref().unwrap()["pool"], "gpu");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.active_deadline_seconds, Some(DEADLINE_SECONDS));
        assert_eq!(run.pod.metadata.labels.as_ref().unwrap()[pd_api::labels::LABEL_ROLE], DRY_RUN_ROLE);
        let input: serde_json::Value = serde_json::from_str(c.env.as_ref().unwrap()[0].value.as_ref().unwrap()).unwrap();
        // One process per pod of each role's first instance, with the argv the engine gets.
        let procs = input["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 2);
        assert_eq!(procs[0]["argv"], serde_json::json!(engine.args.unwrap()));
        assert_eq!(procs[0]["profile"], "B200");
        assert_eq!(procs[1]["profile"], "H100");
        assert_eq!(procs[0]["envFromPod"], serde_json::json!(["SGLANG_HOST_IP", "HF_TOKEN"]));
        assert!(procs[0]["env"].as_array().unwrap().contains(&serde_json::json!(["A", "b"])));
        assert_eq!(input["modelConfigDir"], MODEL_DIR);
        let env = c.env.as_ref().unwrap();
        assert!(env.iter().any(|e| e.name == "HF_TOKEN" && e.value_from.is_some()), "the secret comes from the pod");
    }

    #[test]
    fn a_mounted_model_source_is_judged_on_the_config_json_read_from_it() {
        let p = pdd(&SPEC.replace("configMapRef: {name: qwen-config}", "source: {pvc: {claimName: weights, path: qwen3}}"));
        let run = run_of(&p).unwrap();
        let spec = run.pod.spec.as_ref().unwrap();
        let volume = spec.volumes.as_ref().unwrap().iter().find(|v| v.name == "model-config").unwrap();
        assert_eq!(
            volume.config_map.as_ref().unwrap().name,
            crate::model_read::config_map_name("qwen"),
            "the kept copy the reader Job made"
        );
        assert!(spec.volumes.as_ref().unwrap().iter().all(|v| v.name != crate::names::MODEL_VOLUME), "no weights mounted");
        let other = pdd(&SPEC.replace("configMapRef: {name: qwen-config}", "source: {pvc: {claimName: other, path: qwen3}}"));
        assert_ne!(run.key, run_of(&other).unwrap().key, "other weights, another verdict");
    }

    #[test]
    fn a_hub_source_is_judged_on_the_config_json_the_operator_keeps() {
        let p = pdd(&SPEC.replace("configMapRef: {name: qwen-config}", "source: {huggingFace: {repo: Qwen/Qwen3-8B}}"));
        let run = run_of(&p).unwrap();
        let spec = run.pod.spec.as_ref().unwrap();
        let volume = spec.volumes.as_ref().unwrap().iter().find(|v| v.name == "model-config").unwrap();
        assert_eq!(volume.config_map.as_ref().unwrap().name, crate::model_read::config_map_name(p.metadata.name.as_deref().unwrap()));
        let input: serde_json::Value = serde_json::from_str(spec.containers[0].env.as_ref().unwrap()[0].value.as_ref().unwrap()).unwrap();
        assert_eq!(input["modelConfigDir"], MODEL_DIR);
    }

    #[test]
    fn the_key_ignores_scale_and_follows_argv_image_and_accelerator() {
        let base = run_of(&pdd(SPEC)).unwrap().key;
        assert_eq!(run_of(&pdd(&SPEC.replace("replicas: 3", "replicas: 7"))).unwrap().key, base, "a scale runs no dry run");
        assert_ne!(run_of(&pdd(&SPEC.replace("--no-such-flag", "--other"))).unwrap().key, base);
        assert_ne!(run_of(&pdd(&SPEC.replace("B200", "H200"))).unwrap().key, base);
        assert_ne!(
            run_of(&pdd(&SPEC.replace("qwen-config}}", "qwen-config}}\n  engine: {image: 'my/sglang:v0.5.23'}"))).unwrap().key,
            base
        );
        let off = SPEC.replace("qwen-config}}", "qwen-config}}\n  engine: {dryRun: Off}");
        assert!(run_of(&pdd(&off)).is_none());
        let sim = SPEC.replace("qwen-config}}", "qwen-config}}\n  engine: {type: sim}");
        assert!(run_of(&pdd(&sim)).is_none(), "the stand-in runs no SGLang: no dry run unless asked");
    }

    fn ended(message: &str, code: i32) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: CONTAINER.into(),
                image_id: "docker.io/x@sha256:1".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated { exit_code: code, message: Some(message.into()), ..Default::default() }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn the_verdict_is_read_from_the_termination_message_with_sglangs_text() {
        let ok = r#"{"v":1,"ok":true,"sglang":"0.5.23","processes":[{"role":"prefill","node":0,"ok":true}]}"#;
        let Reading::Done(v) = read(&ended(ok, 0), "k", 0) else { panic!() };
        assert_eq!(
            (v.result.as_str(), v.sglang_version.as_deref(), v.image_id.as_deref()),
            (VERIFIED, Some("0.5.23"), Some("docker.io/x@sha256:1"))
        );
        let refused = r#"{"v":1,"ok":false,"processes":[{"role":"prefill","node":0,"profile":"H100","ok":false,"stage":"parse","error_type":"SystemExit","error":"unrecognized arguments: --no-such-flag"}]}"#;
        let Reading::Done(v) = read(&ended(refused, 0), "k", 0) else { panic!() };
        assert_eq!(v.result, REFUSED);
        assert_eq!(v.message, "prefill node 0 on H100: SGLang refused it at parse: SystemExit: unrecognized arguments: --no-such-flag");
        let handshake = r#"{"v":1,"ok":false,"sglang":"0.5.23","processes":[{"role":"prefill","node":0,"ok":true},{"role":"decode","node":0,"ok":true}],"handshake":{"ok":false,"ran":true,"stage":"prefill_sender","error_type":"RuntimeError","error":"Unsupported PD DCP topology: 2 -> 4","prefill_profile":"H100","decode_profile":"H200"}}"#;
        let Reading::Done(v) = read(&ended(handshake, 0), "k", 0) else { panic!() };
        assert_eq!(v.result, REFUSED);
        assert_eq!(
            v.message,
            "the handshake of decode node 0 on H200 with prefill node 0 on H100: SGLang refused it at prefill_sender: RuntimeError: Unsupported PD DCP topology: 2 -> 4"
        );
        let unjudged = r#"{"v":1,"ok":true,"sglang":"0.5.20","processes":[],"handshake":{"ok":true,"ran":false,"note":"SGLang 0.5.20 places no ranks at publish"}}"#;
        let Reading::Done(v) = read(&ended(unjudged, 0), "k", 0) else { panic!() };
        assert_eq!(
            (v.result.as_str(), v.message.as_str()),
            (VERIFIED, "SGLang 0.5.20 accepts every process; SGLang 0.5.20 places no ranks at publish")
        );
        let Reading::Done(v) = read(&ended("python3: not found", 127), "k", 0) else { panic!() };
        assert_eq!(v.result, NO_VERDICT);
        assert!(v.message.contains("exit code 127"), "{}", v.message);
        // A traceback from the log (FallbackToLogsOnError): its last line, the error, is kept.
        let traceback = format!(
            "Traceback (most recent call last):\n{}OSError: [Errno 30] Read-only file system: '/home/nonroot/.cache'\n",
            "  File \"x.py\", line 1, in <module>\n".repeat(40)
        );
        let Reading::Done(v) = read(&ended(&traceback, 1), "k", 0) else { panic!() };
        assert_eq!(v.result, NO_VERDICT);
        assert!(v.message.ends_with("OSError: [Errno 30] Read-only file system: '/home/nonroot/.cache'"), "{}", v.message);
        assert!(v.message.len() < 800, "a bounded excerpt: {}", v.message.len());
        // The image's own bytes reach status printable: no terminal escapes, no bell.
        let Reading::Done(v) = read(&ended("\u{1b}]0;title\u{7}\u{1b}[2Jboom\r\n", 1), "k", 0) else { panic!() };
        assert!(v.message.ends_with("; ]0;title[2Jboom"), "{}", v.message);
    }

    #[test]
    fn a_running_dry_run_says_what_it_waits_for_and_is_bounded() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::from_second(1000).unwrap()));
        assert_eq!(read(&pod, "k", 1010), Reading::Waiting("waiting for the dry-run pod p to start".into()));
        let Reading::Done(v) = read(&pod, "k", 1000 + TOTAL_SECONDS + 1) else { panic!() };
        assert_eq!(v.result, TIMED_OUT);
        let mut killed = ended("", 137);
        let status = killed.status.as_mut().unwrap();
        (status.phase, status.reason) = (Some("Failed".into()), Some("DeadlineExceeded".into()));
        let Reading::Done(v) = read(&killed, "k", 0) else { panic!() };
        assert_eq!(v.result, TIMED_OUT, "{}", v.message);
    }

    #[test]
    fn the_gate_opens_on_a_verdict_for_this_key_only() {
        let v = |result: &str| EngineVerification { key: "k".into(), result: result.into(), ..Default::default() };
        use DryRunPolicy::*;
        assert_eq!(gate(Off, None, "k", 0), Gate::Open);
        assert_eq!(gate(Required, None, "k", 0), Gate::Run);
        assert_eq!(gate(Required, Some(&v(VERIFIED)), "k", 0), Gate::Open);
        assert_eq!(gate(Required, Some(&v(VERIFIED)), "other", 0), Gate::Run, "a new spec runs again");
        assert_eq!(gate(Required, Some(&v(REFUSED)), "k", 10_000), Gate::Closed, "a refusal stands");
        assert_eq!(gate(BestEffort, Some(&v(REFUSED)), "k", 0), Gate::Closed);
        assert_eq!(gate(Required, Some(&v(PENDING)), "k", 0), Gate::Wait);
        assert_eq!(gate(Required, Some(&v(TIMED_OUT)), "k", 0), Gate::Closed);
        assert_eq!(gate(Required, Some(&v(TIMED_OUT)), "k", RETRY_SECONDS), Gate::Run);
        assert_eq!(gate(BestEffort, Some(&v(NO_VERDICT)), "k", 0), Gate::Open);
    }
}
