//! Pure rendering of a `PDDeployment` into the objects the controller applies. `pd-operator
//! render` prints exactly this, so what a user reviews is what runs.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort, DownwardAPIProjection, DownwardAPIVolumeFile,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod,
    PodReadinessGate, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements, Service, ServiceAccount,
    ServiceAccountTokenProjection, ServicePort, ServiceSpec, SleepAction, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role as RbacRole, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use thiserror::Error;

use crate::model::ModelFacts;
use crate::model_source;
use crate::names::*;
use crate::pod::restricted_security_context;
use pd_api::Role;
use pd_api::labels::*;
use pd_api::{
    DEFAULT_HTTP_PORT, DEFAULT_ROUTER_IMAGE, EngineType, PDDeployment, PDDeploymentSpec, PDRole, PDRoleSpec, RecoverySpec, RoleSpec,
};

const HANDSHAKE_MOUNT: &str = "/etc/pd-handshake";
/// Where Kubernetes clients look for the in-cluster token; only the sidecar gets one mounted.
const TOKEN_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const GPU_RESOURCE: &str = "nvidia.com/gpu";
const DEFAULT_SHM: &str = "16Gi";

#[derive(Debug, Error, PartialEq)]
pub enum RenderError {
    #[error("{0} has a zero-sized parallel layout or gpusPerNode; run `pd-operator validate` for details")]
    ZeroSize(&'static str),
    #[error("the PDDeployment has no name")]
    NoName,
    #[error("could not serialize {what}: {message}")]
    Serialize { what: &'static str, message: String },
}

/// Inputs that do not come from the PDDeployment itself.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// Image of pd-operator itself: the handshake sidecar.
    pub operator_image: String,
    /// Image of the stand-in (`pd-sim`): the engine when `engine.type: sim` names no image.
    pub sim_image: String,
    /// Namespace used when the object has none (offline `render`).
    pub default_namespace: String,
    /// The namespace the operator runs in (its pods carry `LABEL_COMPONENT: operator`): where the
    /// planner's own scrape of the engines comes from.
    pub operator_namespace: String,
    /// Whether the cluster serves Kubernetes' gang scheduling API (PodGroup,
    /// `scheduling.k8s.io/v1beta1`): `placement.gang: auto` uses it then.
    pub workload_api: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            operator_image: default_operator_image(),
            sim_image: default_sim_image(),
            default_namespace: "default".into(),
            operator_namespace: DEFAULT_OPERATOR_NAMESPACE.into(),
            workload_api: false,
        }
    }
}

/// Where the chart is installed unless told otherwise (README, `make demo`).
pub const DEFAULT_OPERATOR_NAMESPACE: &str = "pd-system";

pub fn default_operator_image() -> String {
    format!("pd-operator:{}", env!("CARGO_PKG_VERSION"))
}

pub fn default_sim_image() -> String {
    format!("pd-sim:{}", env!("CARGO_PKG_VERSION"))
}

macro_rules! rendered {
    (before_pods: [$($(#[$b:meta])* $bf:ident: $bt:ty { $($bx:tt)* }),* $(,)?],
     after_pods: [$($(#[$a:meta])* $af:ident: $at:ty { $($ax:tt)* }),* $(,)?] $(,)?) => {
        /// Everything the controller creates for one `PDDeployment`: the kinds of
        /// `children::child_kinds!` and the engine pods.
        #[derive(Clone, Debug, Default, PartialEq, Serialize)]
        pub struct Rendered {
            $($(#[$b])* pub $bf: Vec<$bt>,)*
            /// Engine pods, one entry per instance of each role.
            pub instances: Vec<InstancePods>,
            /// The instances an in-place rollout may add beside a role's own (`rollout.maxSurge`),
            /// numbered after them; the planner creates them only while the role rolls.
            #[serde(skip)]
            pub surge: Vec<InstancePods>,
            $($(#[$a])* pub $af: Vec<$at>,)*
            /// The page size both roles run with, as SGLang resolves it from the `--page-size` the
            /// operator passes (the spec's, or the one it pins when `kvTransfer.pageSize` is unset).
            #[serde(skip)]
            pub page_size: u32,
        }

        impl Rendered {
            /// All objects as one multi-document YAML stream, in apply order.
            pub fn to_yaml(&self) -> Result<String, RenderError> {
                let mut docs = Vec::new();
                $(for o in &self.$bf {
                    docs.push(yaml_doc(o)?);
                })*
                for p in self.pods() {
                    docs.push(yaml_doc(p)?);
                }
                $(for o in &self.$af {
                    docs.push(yaml_doc(o)?);
                })*
                Ok(docs.iter().map(|d| format!("---\n{d}")).collect())
            }

            /// `(plural, name)` of every object but the engine pods, in the list's order.
            pub fn child_names(&self) -> Vec<(&'static str, String)> {
                let mut names = Vec::new();
                $(names.extend(self.$bf.iter().map(|o| (<$bt as k8s_openapi::Resource>::URL_PATH_SEGMENT, o.metadata.name.clone().unwrap_or_default())));)*
                $(names.extend(self.$af.iter().map(|o| (<$at as k8s_openapi::Resource>::URL_PATH_SEGMENT, o.metadata.name.clone().unwrap_or_default())));)*
                names
            }
        }
    };
}
crate::child_kinds!(rendered);

/// The pods of one engine instance (one SGLang server: `nodes` pods), as the planner needs them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstancePods {
    pub role: Role,
    pub index: u32,
    pub revision: String,
    pub pods: Vec<Pod>,
}

impl Rendered {
    /// Every engine pod, prefill first, in instance and node order.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.instances.iter().flat_map(|i| &i.pods)
    }
}

mod netpol;
pub mod placement;

/// One object as a YAML document, with its apiVersion and kind (k8s-openapi writes them only
/// through its own serializer).
fn yaml_doc<T: Serialize + k8s_openapi::Resource>(o: &T) -> Result<String, RenderError> {
    let err = |message: String| RenderError::Serialize { what: T::KIND, message };
    let mut v = serde_json::to_value(o).map_err(|e| err(e.to_string()))?;
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), T::API_VERSION.into());
        m.insert("kind".into(), T::KIND.into());
    }
    serde_norway::to_string(&v).map_err(|e| err(e.to_string()))
}

/// Each role's scale target (`PDRole` `<name>-<role>`), asking for the instances `spec` runs.
/// The controller hands `spec.replicas` to whoever else owns it (`scaling::yield_replicas`).
fn scale_targets(spec: &PDDeploymentSpec, name: &str, ns: &str, owners: &Option<Vec<OwnerReference>>) -> Vec<PDRole> {
    [Role::Prefill, Role::Decode]
        .map(|role| PDRole {
            metadata: meta(pd_api::role_object_name(name, role), ns, common_labels(name, role.as_str()), owners),
            spec: PDRoleSpec { role, replicas: Some(i32::try_from(spec.instances(role)).unwrap_or(i32::MAX)) },
            status: None,
        })
        .into()
}

/// A short hash of everything that shapes a role's engine pods; a change rolls that role. What
/// belongs to the operator (its image, which the handshake sidecar runs) is not in it: an
/// operator upgrade restarts no engine, and new sidecars come with the next rollout.
pub fn role_revision(spec: &PDDeploymentSpec, role: Role, opts: &RenderOptions) -> String {
    let mut inputs = revision_inputs(spec, role);
    // The stand-in's image is a sim engine's own image.
    if spec.engine.engine_type == EngineType::Sim {
        inputs["simImage"] = opts.sim_image.clone().into();
    }
    short_hash(&inputs)
}

/// The revision pd-operator 0.1.0 gave a role's SGLang pods, whose inputs held the operator's
/// image too. A running pod labelled with it, for the image its PDDeployment's sidecars run, is
/// the current revision under its old name: it is adopted, not restarted. `None` for the
/// stand-in, whose engine image that release took from the operator's.
pub fn legacy_role_revision(spec: &PDDeploymentSpec, role: Role, operator_image: &str) -> Option<String> {
    (spec.engine.engine_type == EngineType::Sglang).then(|| {
        let mut inputs = revision_inputs(spec, role);
        inputs["operatorImage"] = operator_image.into();
        short_hash(&inputs)
    })
}

fn revision_inputs(spec: &PDDeploymentSpec, role: Role) -> serde_json::Value {
    let shaped = RoleSpec { replicas: 0, ..spec.role(role).clone() };
    // The dry run gates pods; it does not shape them.
    let engine = pd_api::EngineSpec { dry_run: None, ..spec.engine.clone() };
    let mut inputs = serde_json::json!({
        "role": role.as_str(), "engine": engine, "model": spec.model, "kv": spec.kv_transfer, "pool": shaped,
    });
    // The probes are fixed in a pod: a changed liveness setting rolls the role. Unset, they add
    // nothing, so a spec without them keeps the revision it had before they existed.
    let r = &spec.recovery;
    if r.hang_seconds.is_some() || r.startup_seconds.is_some() {
        inputs["liveness"] = serde_json::json!({"hangSeconds": r.hang_seconds, "startupSeconds": r.startup_seconds});
    }
    inputs
}

/// The engine's argv after the program name, for one pod of one instance.
pub fn engine_args(spec: &PDDeploymentSpec, role: Role, name: &str, ns: &str, instance: u32, node: u32, set: u32) -> Vec<String> {
    let rs = spec.role(role);
    let p = &rs.parallelism;
    let kv = &spec.kv_transfer;
    let mut a: Vec<String> = Vec::new();
    let mut flag = |f: &str, v: String| {
        a.push(f.to_owned());
        a.push(v);
    };
    flag("--model-path", model_source::model_path(&spec.model));
    if let Some(n) = model_source::served_name(&spec.model) {
        flag("--served-model-name", n);
    }
    if let Some(r) = model_source::revision(&spec.model) {
        flag("--revision", r);
    }
    flag("--disaggregation-mode", role.as_str().into());
    flag("--disaggregation-bootstrap-port", kv.bootstrap_port.to_string());
    flag("--disaggregation-transfer-backend", kv.backend.to_string());
    if let Some(ib) = &kv.ib_device {
        flag("--disaggregation-ib-device", ib.clone());
    }
    let release = crate::release::release_of(spec);
    if release.has_decode_allocation_policy() {
        flag("--disaggregation-decode-allocation-policy", kv.decode_allocation_policy.to_string());
    }
    flag("--tp-size", p.tp.to_string());
    if release.has_attn_dp_size() {
        flag("--dp-size", p.dp.to_string());
        flag("--attn-dp-size", p.attn_dp.to_string());
    } else if p.attn_dp > 1 {
        // Before 0.5.22 the attention-DP width is `--dp-size` under `--enable-dp-attention`
        // (admission refuses replica dp beside it).
        flag("--dp-size", p.attn_dp.to_string());
        a.push("--enable-dp-attention".into());
    } else {
        flag("--dp-size", p.dp.to_string());
    }
    let mut flag = |f: &str, v: String| {
        a.push(f.to_owned());
        a.push(v);
    };
    flag("--pp-size", p.pp.to_string());
    flag("--attn-cp-size", p.attn_cp.to_string());
    if p.attn_cp > 1 {
        a.push("--enable-prefill-cp".into());
        if let Some(s) = p.cp_strategy {
            a.push("--cp-strategy".into());
            a.push(s.to_string());
        }
    }
    let mut flag = |f: &str, v: String| {
        a.push(f.to_owned());
        a.push(v);
    };
    flag("--dcp-size", p.dcp.to_string());
    if let Some(ps) = kv.page_size {
        flag("--page-size", ps.to_string());
    }
    flag("--kv-cache-dtype", kv.kv_cache_dtype.to_string());
    flag("--host", "0.0.0.0".into());
    flag("--port", DEFAULT_HTTP_PORT.to_string());
    let nnodes = rs.nodes_per_instance();
    if nnodes > 1 {
        flag("--dist-init-addr", format!("{}:{DIST_INIT_PORT}", leader_host(name, ns, role, instance, set)));
        flag("--nnodes", nnodes.to_string());
        flag("--node-rank", node.to_string());
    }
    if rs.enable_kv_cache_sharding {
        a.push("--enable-kv-cache-sharding".into());
    }
    if rs.enable_dsa_cache_layer_split {
        a.push("--enable-dsa-cache-layer-split".into());
    }
    a.extend(rs.template.extra_args.iter().cloned());
    a
}

/// Program that runs the engine: SGLang, or the stand-in (`pd-sim`) with the same flags.
pub fn engine_command(spec: &PDDeploymentSpec) -> Vec<String> {
    match spec.engine.engine_type {
        EngineType::Sglang => vec!["python3".into(), "-m".into(), "sglang.launch_server".into()],
        EngineType::Sim => vec!["pd-sim".into(), "engine".into()],
    }
}

pub(crate) fn engine_image(spec: &PDDeploymentSpec, opts: &RenderOptions) -> String {
    spec.engine.image.clone().unwrap_or_else(|| match spec.engine.engine_type {
        EngineType::Sglang => crate::release::default_image(&spec.engine),
        EngineType::Sim => opts.sim_image.clone(),
    })
}

fn meta(name: String, ns: &str, labels: BTreeMap<String, String>, owners: &Option<Vec<OwnerReference>>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(ns.to_owned()),
        labels: Some(labels),
        owner_references: owners.clone(),
        ..Default::default()
    }
}

fn env_value(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn http_probe(path: &str, port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction { path: Some(path.into()), port: IntOrString::String(port.into()), ..Default::default() }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Default::default()
    }
}

/// How often the liveness check asks, and how long one ask may take: SGLang's `/health_generate`
/// answers within its own `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s by default), 503 when the
/// scheduler gave no output in that time.
const LIVENESS_PERIOD_SECONDS: i32 = 30;
const LIVENESS_TIMEOUT_SECONDS: i32 = 25;
const STARTUP_PERIOD_SECONDS: i32 = 10;

/// SGLang's own progress check on the leader engine: `hangSeconds` of failed asks restart it.
/// None when `hangSeconds` is 0.
fn liveness_probe(recovery: &RecoverySpec) -> Option<Probe> {
    let hang = recovery.hang_seconds();
    (hang > 0).then(|| Probe {
        timeout_seconds: Some(LIVENESS_TIMEOUT_SECONDS),
        ..http_probe("/health_generate", "http", LIVENESS_PERIOD_SECONDS, ceil_div(hang, LIVENESS_PERIOD_SECONDS).max(1))
    })
}

/// Holds the readiness and liveness checks off for `startupSeconds` while the engine loads.
fn startup_probe(recovery: &RecoverySpec) -> Probe {
    let failures = ceil_div(recovery.startup_seconds().max(STARTUP_PERIOD_SECONDS), STARTUP_PERIOD_SECONDS);
    http_probe("/health", "http", STARTUP_PERIOD_SECONDS, failures)
}

/// `a / b` rounded up, for a positive `b`.
fn ceil_div(a: i32, b: i32) -> i32 {
    a.saturating_add(b - 1) / b
}

fn port(name: &str, number: u16) -> ContainerPort {
    ContainerPort { name: Some(name.into()), container_port: i32::from(number), ..Default::default() }
}

fn handshake_sidecar(opts: &RenderOptions) -> Container {
    Container {
        name: SIDECAR_CONTAINER.into(),
        image: Some(opts.operator_image.clone()),
        command: Some(vec!["pd-operator".into()]),
        args: Some(vec![
            "handshake".into(),
            "run".into(),
            "--decode".into(),
            format!("{HANDSHAKE_MOUNT}/decode.json"),
            "--prefill-file".into(),
            format!("{HANDSHAKE_MOUNT}/prefill-addresses"),
            "--pod".into(),
            "$(POD_NAMESPACE)/$(POD_NAME)".into(),
            "--listen".into(),
            format!("0.0.0.0:{HANDSHAKE_PORT}"),
        ]),
        env: Some(vec![env_field("POD_NAME", "metadata.name"), env_field("POD_NAMESPACE", "metadata.namespace")]),
        ports: Some(vec![port("handshake", HANDSHAKE_PORT)]),
        // A native sidecar: started before the engine and kept running beside it. No startup
        // (or readiness) probe: the kubelet counts a native sidecar's readiness in the pod's, and
        // a probe would hold a serving decode unready for a period after each in-place image
        // update (`rollout.sidecarUpdate`); without one a restart never shows as unready (kind,
        // measured). Liveness only restarts a hung sidecar.
        restart_policy: Some("Always".into()),
        liveness_probe: Some(http_probe("/livez", "handshake", 10, 3)),
        volume_mounts: Some(vec![
            VolumeMount { name: "handshake".into(), mount_path: HANDSHAKE_MOUNT.into(), read_only: Some(true), ..Default::default() },
            VolumeMount { name: "handshake-token".into(), mount_path: TOKEN_MOUNT.into(), read_only: Some(true), ..Default::default() },
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), Quantity("10m".into())), ("memory".into(), Quantity("16Mi".into()))])),
            limits: Some(BTreeMap::from([("memory".into(), Quantity("64Mi".into()))])),
            ..Default::default()
        }),
        security_context: Some(restricted_security_context()),
        ..Default::default()
    }
}

/// The in-cluster credentials of the sidecar alone: a short-lived token, the cluster CA and the
/// namespace, laid out as the automounted ones are.
fn token_volume() -> Volume {
    Volume {
        name: "handshake-token".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(3607),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath { key: "ca.crt".into(), path: "ca.crt".into(), ..Default::default() }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector { field_path: "metadata.namespace".into(), ..Default::default() }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The sidecar's permissions: get and patch `pods/status` of exactly this PDDeployment's decode
/// pods (the readiness-gate condition and the rank map annotation; a restarted sidecar reads the
/// gate it inherits), nothing else.
fn handshake_rbac(
    spec: &PDDeploymentSpec,
    name: &str,
    ns: &str,
    set: u32,
    owners: &Option<Vec<OwnerReference>>,
) -> (Option<ServiceAccount>, RbacRole, RoleBinding) {
    let labels = common_labels(name, "decode");
    let account = decode_service_account(spec, name);
    let own_account = spec.decode.template.service_account_name.is_none().then(|| ServiceAccount {
        metadata: meta(account.clone(), ns, labels.clone(), owners),
        automount_service_account_token: Some(false),
        ..Default::default()
    });
    let mut pods: Vec<String> = Vec::new();
    for i in 0..spec.instances(Role::Decode) {
        for node in 0..spec.decode.nodes_per_instance() {
            pods.push(pod_name(name, Role::Decode, i, node, set));
        }
    }
    let role = RbacRole {
        metadata: meta(handshake_rbac_name(name), ns, labels.clone(), owners),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["pods/status".into()]),
            verbs: vec!["get".into(), "patch".into()],
            // An empty list would mean every pod; with no decode pod, grant nothing.
            resource_names: Some(if pods.is_empty() { vec![format!("{name}-decode-none")] } else { pods }),
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(handshake_rbac_name(name), ns, labels, owners),
        role_ref: RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: "Role".into(), name: handshake_rbac_name(name) },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account,
            namespace: Some(ns.to_owned()),
            ..Default::default()
        }]),
    };
    (own_account, role, binding)
}

/// Lets the sidecar of each of `pods` (decode pods of an older KV set, still running) patch its
/// own gate too.
pub fn grant_decode_pods(rendered: &mut Rendered, name: &str, pods: impl IntoIterator<Item = String>) {
    let wanted = handshake_rbac_name(name);
    let Some(role) = rendered.roles.iter_mut().find(|r| r.metadata.name.as_deref() == Some(wanted.as_str())) else { return };
    if let Some(names) = role.rules.as_mut().and_then(|r| r.first_mut()).and_then(|r| r.resource_names.as_mut()) {
        names.extend(pods);
    }
}

/// Where one engine pod sits: which PDDeployment, role, instance and node, at which revision.
struct PodSlot<'a> {
    spec: &'a PDDeploymentSpec,
    role: Role,
    name: &'a str,
    ns: &'a str,
    instance: u32,
    node: u32,
    set: u32,
    revision: &'a str,
    /// The KV contract of this role's pods (`KV_CONTRACT`).
    contract: &'a str,
    owners: &'a Option<Vec<OwnerReference>>,
    opts: &'a RenderOptions,
}

impl PodSlot<'_> {
    fn template(&self) -> &pd_api::RoleTemplate {
        &self.spec.role(self.role).template
    }

    fn env(&self) -> Vec<EnvVar> {
        let mut env = vec![env_field("SGLANG_HOST_IP", "status.podIP")];
        if self.spec.kv_transfer.all_cp_ranks_transfer {
            env.push(env_value("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "true"));
        }
        env.extend(model_source::env(&self.spec.model));
        env.extend(self.template().env.iter().cloned());
        env
    }

    /// The template's resources, plus the role's GPUs for the real engine.
    fn resources(&self) -> ResourceRequirements {
        let rs = self.spec.role(self.role);
        let mut resources = rs.template.resources.clone().unwrap_or_default();
        if self.spec.engine.engine_type == EngineType::Sglang {
            let gpus = Quantity(rs.gpus_per_pod().to_string());
            resources.limits.get_or_insert_with(BTreeMap::new).insert(GPU_RESOURCE.into(), gpus.clone());
            if let Some(req) = resources.requests.as_mut() {
                req.insert(GPU_RESOURCE.into(), gpus);
            }
        }
        resources
    }

    fn engine_container(&self) -> Container {
        let (spec, role, node) = (self.spec, self.role, self.node);
        let mut ports = vec![port("http", DEFAULT_HTTP_PORT)];
        if role == Role::Prefill && node == 0 {
            ports.push(port("bootstrap", spec.kv_transfer.bootstrap_port));
        }
        if spec.role(role).nodes_per_instance() > 1 {
            ports.push(port("dist-init", DIST_INIT_PORT));
        }
        let mut mounts = vec![VolumeMount { name: "dshm".into(), mount_path: "/dev/shm".into(), ..Default::default() }];
        mounts.extend(model_source::volume(self.name, &spec.model).map(|(_, mount)| mount));
        mounts.extend(self.template().volume_mounts.iter().cloned());
        // Only the leader of a multi-node instance serves HTTP.
        let leader = node == 0;
        Container {
            name: ENGINE_CONTAINER.into(),
            image: Some(engine_image(spec, self.opts)),
            image_pull_policy: spec.engine.image_pull_policy.clone(),
            command: Some(engine_command(spec)),
            args: Some(engine_args(spec, role, self.name, self.ns, self.instance, node, self.set)),
            env: Some(self.env()),
            ports: Some(ports),
            resources: Some(self.resources()),
            readiness_probe: leader.then(|| http_probe("/health", "http", 10, 3)),
            // Model loading can take long; the startup probe holds liveness checks off until then.
            startup_probe: leader.then(|| startup_probe(&spec.recovery)),
            liveness_probe: leader.then(|| liveness_probe(&spec.recovery)).flatten(),
            volume_mounts: Some(mounts),
            security_context: self.template().security_context.clone(),
            ..Default::default()
        }
    }

    fn volumes(&self) -> Vec<Volume> {
        let t = self.template();
        let mut volumes = vec![Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(t.shm_size.clone().unwrap_or_else(|| Quantity(DEFAULT_SHM.into()))),
                ..Default::default()
            }),
            ..Default::default()
        }];
        volumes.extend(model_source::volume(self.name, &self.spec.model).map(|(volume, _)| volume));
        volumes.extend(t.volumes.iter().cloned());
        volumes
    }

    fn pod(&self) -> Pod {
        let t = self.template();
        let mut labels = t.labels.clone();
        labels.extend(common_labels(self.name, self.role.as_str()));
        labels.insert(LABEL_INSTANCE.into(), self.instance.to_string());
        labels.insert(LABEL_NODE_RANK.into(), self.node.to_string());
        labels.insert(LABEL_REVISION.into(), self.revision.into());
        labels.insert(LABEL_SERVING.into(), "true".into());
        labels.insert(LABEL_KV_SET.into(), self.set.to_string());
        labels.insert(LABEL_ENGINE.into(), "true".into());
        let pod_name = pod_name(self.name, self.role, self.instance, self.node, self.set);
        let mut metadata = meta(pod_name.clone(), self.ns, labels, self.owners);
        let mut annotations = t.annotations.clone();
        annotations.insert(KV_CONTRACT.into(), self.contract.to_owned());
        if self.role == Role::Prefill && self.node == 0 {
            // Where the router's discovery learns the bootstrap port it stamps into requests.
            annotations.insert(BOOTSTRAP_PORT_ANNOTATION.into(), self.spec.kv_transfer.bootstrap_port.to_string());
        }
        metadata.annotations = Some(annotations);
        let mut spec = PodSpec {
            hostname: Some(pod_name),
            subdomain: Some(engines_name(self.name)),
            // A multi-node engine cannot survive a lost rank: the controller recreates the instance.
            restart_policy: Some("Never".into()),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(60),
            host_network: t.host_network.then_some(true),
            dns_policy: t.host_network.then(|| "ClusterFirstWithHostNet".into()),
            node_selector: (!t.node_selector.is_empty()).then(|| t.node_selector.clone()),
            tolerations: (!t.tolerations.is_empty()).then(|| t.tolerations.clone()),
            affinity: t.affinity.clone(),
            service_account_name: t.service_account_name.clone(),
            // SGLang calls no Kubernetes API: its pod carries no token unless the template asks.
            automount_service_account_token: Some(t.automount_service_account_token == Some(true)),
            priority_class_name: t.priority_class_name.clone(),
            scheduler_name: t.scheduler_name.clone(),
            containers: vec![self.engine_container()],
            volumes: Some(self.volumes()),
            ..Default::default()
        };
        if self.role == Role::Decode {
            self.add_handshake(&mut spec);
        }
        placement::place(self.spec, self.name, (self.role, self.instance, self.set), self.opts, &mut spec);
        Pod { metadata, spec: Some(spec), status: None }
    }

    /// A decode pod's handshake: the sidecar, its readiness gate, its ConfigMap and token, and
    /// (unless the template names one) the ServiceAccount that exists for the sidecar alone.
    fn add_handshake(&self, spec: &mut PodSpec) {
        spec.init_containers = Some(vec![handshake_sidecar(self.opts)]);
        spec.readiness_gates = Some(vec![PodReadinessGate { condition_type: pd_api::labels::HANDSHAKE_CONDITION.into() }]);
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        volumes.push(Volume {
            name: "handshake".into(),
            config_map: Some(ConfigMapVolumeSource { name: handshake_config_name(self.name, self.set), ..Default::default() }),
            ..Default::default()
        });
        volumes.push(token_volume());
        if spec.service_account_name.is_none() {
            // Our ServiceAccount exists for the sidecar alone: the engine gets no token, even
            // when the template asks for one.
            spec.service_account_name = Some(decode_service_account(self.spec, self.name));
            spec.automount_service_account_token = Some(false);
        }
    }
}

/// One headless Service for both roles' engine pods: it gives each its DNS name
/// (`{pod}.{name}-engines.{ns}.svc`, through the pods' hostname and subdomain). One per role cost
/// the cluster a second Service and its Endpoints and EndpointSlice per PDDeployment.
fn headless_service(pdd_spec: &PDDeploymentSpec, name: &str, ns: &str, owners: &Option<Vec<OwnerReference>>) -> Service {
    let ports = vec![
        ServicePort { name: Some("http".into()), port: i32::from(DEFAULT_HTTP_PORT), ..Default::default() },
        ServicePort { name: Some("bootstrap".into()), port: i32::from(pdd_spec.kv_transfer.bootstrap_port), ..Default::default() },
    ];
    let selector = BTreeMap::from([(LABEL_DEPLOYMENT.to_owned(), name.to_owned()), (LABEL_ENGINE.to_owned(), "true".to_owned())]);
    Service {
        metadata: meta(engines_name(name), ns, common_labels(name, ENGINES), owners),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Ranks must find their leader by DNS before anything is Ready.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    }
}

/// The annotation smg's Kubernetes discovery reads a prefill pod's bootstrap port from (fixed in
/// smg 1.13.0; no flag renames it).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";
/// Where the router serves Prometheus metrics (`smg_*`; smg's own default port, made explicit).
pub const ROUTER_METRICS_PORT: u16 = 29000;
/// How long a router pod on its way out keeps serving before SIGTERM, while endpoints update.
const ROUTER_PRE_STOP_SECONDS: i64 = 5;
/// How long a router pod may take, after SIGTERM, to finish the requests in flight.
const ROUTER_GRACE_SECONDS: i64 = 120;
/// What runs the router: SGLang's model gateway, for both engine types.
const ROUTER_COMMAND: [&str; 3] = ["python3", "-m", "smg.launch_router"];

/// Name of the router's ServiceAccount, Role and RoleBinding (as of its Deployment and Service).
pub fn router_rbac_name(name: &str) -> String {
    router_name(name)
}

/// The labels smg's discovery selects one role's serving pods by: the leader (node 0) of each
/// instance, the only pod of a multi-node instance that serves HTTP, while it is in the pool (an
/// instance being drained leaves it before its pods are deleted), of the one KV set it pairs.
fn discovery_selector(name: &str, role: Role, set: u32) -> Vec<String> {
    vec![
        format!("{LABEL_DEPLOYMENT}={name}"),
        format!("{LABEL_ROLE}={}", role.as_str()),
        format!("{LABEL_NODE_RANK}=0"),
        format!("{LABEL_SERVING}=true"),
        format!("{LABEL_KV_SET}={set}"),
    ]
}

/// smg's argv: PD mode, workers found by watching this namespace's pods (only Ready ones are
/// routed, so a decode joins once its handshake gate passes, and scaling needs no restart);
/// prefill bootstrap ports come from the pods' `sglang.ai/bootstrap-port` annotation.
pub fn router_args(spec: &PDDeploymentSpec, name: &str, ns: &str, set: u32) -> Vec<String> {
    let r = &spec.router;
    let mut args: Vec<String> =
        ["--pd-disaggregation", "--discovery-provider", "kubernetes", "--service-discovery-namespace", ns].map(String::from).into();
    args.extend(["--service-discovery-port".into(), DEFAULT_HTTP_PORT.to_string()]);
    args.push("--prefill-selector".into());
    args.extend(discovery_selector(name, Role::Prefill, set));
    args.push("--decode-selector".into());
    args.extend(discovery_selector(name, Role::Decode, set));
    args.extend(["--host".into(), "0.0.0.0".into(), "--port".into(), r.port.to_string(), "--policy".into(), r.policy.to_string()]);
    args.extend(["--prometheus-host".into(), "0.0.0.0".into(), "--prometheus-port".into(), ROUTER_METRICS_PORT.to_string()]);
    args.extend(r.extra_args.iter().cloned());
    args
}

/// The router's own identity: read (get, list, watch) the pods of its namespace, which smg's
/// discovery watches; nothing else. Returns the ServiceAccount, Role and RoleBinding.
fn router_rbac(name: &str, ns: &str, owners: &Option<Vec<OwnerReference>>) -> (ServiceAccount, RbacRole, RoleBinding) {
    let labels = common_labels(name, ROUTER_ROLE);
    let rbac = router_rbac_name(name);
    let account = ServiceAccount { metadata: meta(rbac.clone(), ns, labels.clone(), owners), ..Default::default() };
    let role = RbacRole {
        metadata: meta(rbac.clone(), ns, labels.clone(), owners),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["pods".into()]),
            verbs: ["get", "list", "watch"].map(String::from).into(),
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(rbac.clone(), ns, labels, owners),
        role_ref: RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: "Role".into(), name: rbac.clone() },
        subjects: Some(vec![Subject { kind: "ServiceAccount".into(), name: rbac, namespace: Some(ns.to_owned()), ..Default::default() }]),
    };
    (account, role, binding)
}

fn router_container(spec: &PDDeploymentSpec, name: &str, ns: &str, set: u32) -> Container {
    let r = &spec.router;
    Container {
        name: "router".into(),
        image: Some(r.image.clone().unwrap_or_else(|| DEFAULT_ROUTER_IMAGE.into())),
        image_pull_policy: spec.engine.image_pull_policy.clone(),
        command: Some(ROUTER_COMMAND.map(String::from).into()),
        args: Some(router_args(spec, name, ns, set)),
        ports: Some(vec![port("http", r.port), port("metrics", ROUTER_METRICS_PORT)]),
        // smg's `/readiness` answers 200 only with a healthy prefill and decode to pair: a router
        // pod that takes over another set's traffic is sent none before it can serve it.
        readiness_probe: Some(http_probe("/readiness", "http", 2, 3)),
        liveness_probe: Some(http_probe("/liveness", "http", 10, 3)),
        // Out of the Service's endpoints before smg starts its graceful shutdown (it finishes the
        // requests in flight within the grace period).
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler { sleep: Some(SleepAction { seconds: ROUTER_PRE_STOP_SECONDS }), ..Default::default() }),
            ..Default::default()
        }),
        resources: r.resources.clone(),
        security_context: Some(restricted_security_context()),
        ..Default::default()
    }
}

fn router_objects(spec: &PDDeploymentSpec, name: &str, ns: &str, set: u32, owners: &Option<Vec<OwnerReference>>) -> (Deployment, Service) {
    let r = &spec.router;
    let labels = common_labels(name, ROUTER_ROLE);
    // The set it pairs, on its pods only: a Deployment's selector cannot change.
    let mut pod_labels = labels.clone();
    pod_labels.insert(LABEL_KV_SET.into(), set.to_string());
    let pod_spec = PodSpec {
        containers: vec![router_container(spec, name, ns, set)],
        service_account_name: Some(router_rbac_name(name)),
        // The token stays mounted (the default): smg's Kubernetes discovery watches the
        // namespace's pods with it, under `router_rbac`.
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(ROUTER_GRACE_SECONDS),
        ..Default::default()
    };
    let deployment = Deployment {
        // The set on the Deployment too: the controller's cache of Deployments drops the template.
        metadata: meta(router_name(name), ns, pod_labels.clone(), owners),
        spec: DeploymentSpec {
            replicas: Some(r.replicas),
            selector: LabelSelector { match_labels: Some(labels.clone()), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels), ..Default::default() }),
                spec: Some(pod_spec),
            },
            ..Default::default()
        },
        status: None,
    };
    let service = Service {
        metadata: meta(router_name(name), ns, labels.clone(), owners),
        spec: Some(ServiceSpec {
            selector: Some(labels),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(r.port),
                target_port: Some(IntOrString::String("http".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    (deployment, service)
}

/// Which KV sets one render is for: `target` gets the engine pods, their handshake ConfigMap and
/// gangs; the router pairs the pods of `routed` (the same set, except while a new set comes up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvSets {
    pub target: u32,
    pub routed: u32,
}

/// What a spec's engine pods would be, worked out once per reconcile: the spec with the page size
/// both roles run with (`resolve::with_page_size`), and per role its revision and KV contract.
/// The KV-set decision and the render both read it.
#[derive(Clone, Debug)]
pub struct Intent {
    pub pinned: PDDeploymentSpec,
    revisions: [String; 2],
    contracts: [String; 2],
}

impl Intent {
    pub fn new(spec: &PDDeploymentSpec, facts: &ModelFacts, opts: &RenderOptions) -> Result<Self, RenderError> {
        let pinned = crate::resolve::with_page_size(spec, facts);
        let revisions = [Role::Prefill, Role::Decode].map(|role| role_revision(spec, role, opts));
        let contracts = [kv_contract(&pinned, facts, Role::Prefill)?, kv_contract(&pinned, facts, Role::Decode)?];
        Ok(Self { pinned, revisions, contracts })
    }
    pub fn revision(&self, role: Role) -> &str {
        &self.revisions[role as usize]
    }
    pub fn contract(&self, role: Role) -> &str {
        &self.contracts[role as usize]
    }
}

/// What the pods of `role` report in the handshake, and the model they serve (`KV_CONTRACT`).
/// `pinned` is the spec with the page size both roles use.
pub fn kv_contract(pinned: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Result<String, RenderError> {
    let mut model = serde_json::json!({"path": pinned.model.path, "revision": pinned.model.revision});
    // Only a spec with a source carries one: contracts of specs without stay as they were.
    if let Some(source) = model_source::identity(&pinned.model) {
        model["source"] = source;
    }
    let release = crate::release::release_of(pinned);
    let side = match role {
        // The body this release's prefill registers, and the release, so a decode of another
        // release is judged by what its own record accepts (`sets::incompatibility`).
        Role::Prefill => crate::resolve::prefill_info(pinned, facts).to_release_body(release),
        Role::Decode => serde_json::to_value(crate::resolve::decode_topology(pinned, facts))
            .map_err(|e| RenderError::Serialize { what: "decode topology", message: e.to_string() })?,
    };
    let mut contract = serde_json::json!({"model": model, role.as_str(): side});
    if role == Role::Prefill {
        contract["release"] = release.as_str().into();
    }
    Ok(contract.to_string())
}

/// Renders every child object of `pdd` for KV set 0 (what `pd-operator render` prints).
pub fn render(pdd: &PDDeployment, facts: &ModelFacts, opts: &RenderOptions) -> Result<Rendered, RenderError> {
    render_sets(pdd, facts, &Intent::new(&pdd.spec, facts, opts)?, opts, KvSets::default())
}

/// The engine pods of KV set `set`, one entry per instance slot of each role (surge included).
fn engine_instances(
    intent: &Intent,
    at: (&str, &str, u32),
    owners: &Option<Vec<OwnerReference>>,
    opts: &RenderOptions,
) -> Vec<InstancePods> {
    let (name, ns, set) = at;
    let pinned = &intent.pinned;
    let mut out = Vec::new();
    for role in [Role::Prefill, Role::Decode] {
        let rs = pinned.role(role);
        let (revision, contract) = (intent.revision(role), intent.contract(role));
        for instance in 0..pinned.instance_slots(role) {
            let pods = (0..rs.nodes_per_instance())
                .map(|node| {
                    let slot = PodSlot { spec: pinned, role, name, ns, instance, node, set, revision, contract, owners, opts };
                    slot.pod()
                })
                .collect();
            out.push(InstancePods { role, index: instance, revision: revision.to_owned(), pods });
        }
    }
    out
}

/// Renders every child object of `pdd`; `facts` is the resolved model (see `model::resolve`).
/// `intent` is `Intent::new` of `pdd.spec`.
pub fn render_sets(
    pdd: &PDDeployment,
    facts: &ModelFacts,
    intent: &Intent,
    opts: &RenderOptions,
    sets: KvSets,
) -> Result<Rendered, RenderError> {
    let name = pdd.metadata.name.as_deref().ok_or(RenderError::NoName)?;
    let ns = pdd.metadata.namespace.clone().unwrap_or_else(|| opts.default_namespace.clone());
    let spec = &pdd.spec;
    for (role, rs) in [("prefill", &spec.prefill), ("decode", &spec.decode)] {
        let p = &rs.parallelism;
        if [p.tp, p.dp, p.attn_dp, p.pp, p.attn_cp, p.dcp, rs.gpus_per_node].contains(&0) {
            return Err(RenderError::ZeroSize(role));
        }
    }
    let owners = owner_refs(pdd);
    let mut out = Rendered::default();
    out.services.push(headless_service(spec, name, &ns, &owners));
    let set = sets.target;
    let prefill_addresses: Vec<String> =
        (0..spec.instances(Role::Prefill)).map(|i| bootstrap_address(name, &ns, i, spec.kv_transfer.bootstrap_port, set)).collect();
    // Engines and the sidecar get the page size the operator passes to both roles (the spec's,
    // or the one both resolve when it is unset); the revision stays the spec's.
    let decode = crate::resolve::decode_topology(&intent.pinned, facts);
    out.page_size = u32::try_from(decode.page_size).unwrap_or_default();
    let decode_json =
        serde_json::to_string_pretty(&decode).map_err(|e| RenderError::Serialize { what: "decode topology", message: e.to_string() })?;
    let mut labels = common_labels(name, "decode");
    labels.insert(LABEL_KV_SET.into(), set.to_string());
    out.config_maps.push(ConfigMap {
        metadata: meta(handshake_config_name(name, set), &ns, labels, &owners),
        data: Some(BTreeMap::from([
            ("decode.json".into(), decode_json),
            ("prefill-addresses".into(), prefill_addresses.join("\n") + "\n"),
        ])),
        ..Default::default()
    });
    if spec.engine.dry_run_policy() != pd_api::DryRunPolicy::Off {
        out.config_maps.push(shim_config_map(name, &ns, &owners));
    }
    let (account, role, binding) = handshake_rbac(spec, name, &ns, set, &owners);
    out.service_accounts.extend(account);
    out.roles.push(role);
    out.role_bindings.push(binding);
    if let Some(fetch) = crate::model_fetch::objects(name, &ns, &spec.model, &owners, &opts.operator_image) {
        out.jobs.push(fetch.job);
        out.persistent_volume_claims.extend(fetch.claim);
        out.service_accounts.push(fetch.account);
        out.roles.push(fetch.role);
        out.role_bindings.push(fetch.binding);
    }
    let (instances, surge) =
        engine_instances(intent, (name, &ns, set), &owners, opts).into_iter().partition(|i| i.index < spec.instances(i.role));
    (out.instances, out.surge) = (instances, surge);
    out.network_policies = netpol::policies(spec, (name, &ns), &owners, &opts.operator_namespace);
    out.pod_groups = placement::pod_groups(spec, name, &ns, set, &owners, opts);
    out.pd_roles = scale_targets(spec, name, &ns, &owners);
    if spec.router.enabled {
        let (deployment, service) = router_objects(spec, name, &ns, sets.routed, &owners);
        let (account, role, binding) = router_rbac(name, &ns, &owners);
        out.service_accounts.push(account);
        out.roles.push(role);
        out.role_bindings.push(binding);
        out.services.push(service);
        out.deployments.push(deployment);
    }
    Ok(out)
}

/// The shim the dry-run pod runs, shipped in its ConfigMap.
pub const SHIM: &str = include_str!("dryrun/shim.py");
/// The shim's key in its ConfigMap, and its file name where the dry-run pod mounts it.
pub const SHIM_KEY: &str = "shim.py";

/// The shim's ConfigMap (one per PDDeployment, rendered with its other children).
pub fn shim_config_map(name: &str, ns: &str, owners: &Option<Vec<OwnerReference>>) -> ConfigMap {
    let mut cm = ConfigMap { data: Some(BTreeMap::from([(SHIM_KEY.into(), SHIM.into())])), ..Default::default() };
    cm.metadata.name = Some(shim_config_name(name));
    cm.metadata.namespace = Some(ns.into());
    cm.metadata.labels = Some(common_labels(name, DRY_RUN_ROLE));
    cm.metadata.owner_references.clone_from(owners);
    cm
}
