//! The `PDDeployment` custom resource (`pd.inference.dev/v1alpha1`).
//!
//! Settings both roles must agree on (model, KV transfer, page size, KV dtype, allocation policy)
//! live once at the top of the spec, so the two sides cannot disagree by construction.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, EnvVar, ResourceRequirements, SecurityContext, Toleration, Volume, VolumeMount};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod autoscaling;
pub mod conditions;
pub mod labels;
pub mod limits;
mod recovery;
mod scaling;
pub use autoscaling::{
    AutoscalingMode, AutoscalingSpec, AutoscalingStatus, LoadThresholds, Observed, PrometheusSource, RoleRecommendation, SloTargets,
};
use limits::{MAX_GPUS_PER_NODE, MAX_INSTANCES, MAX_PAGE_SIZE, MAX_PARALLEL_SIZE, MAX_ROUTER_REPLICAS};
pub use recovery::{InstanceRecovery, RecoverySpec};
pub use scaling::{PDRole, PDRoleSpec, PDRoleStatus, RatioBand, RoleLimits, ScalingSpec, role_object_name};

/// The group and version are written once, as macros, so `API_VERSION` can be joined at compile time.
macro_rules! group {
    () => {
        "pd.inference.dev"
    };
}
macro_rules! version {
    () => {
        "v1alpha1"
    };
}
pub const GROUP: &str = group!();
pub const VERSION: &str = version!();
/// `apiVersion` of every kind of ours.
pub const API_VERSION: &str = concat!(group!(), "/", version!());

/// SGLang 0.5.23's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
/// SGLang's default `--port`.
pub const DEFAULT_HTTP_PORT: u16 = 30000;
pub const DEFAULT_ROUTER_PORT: u16 = 8000;
pub const DEFAULT_GPUS_PER_NODE: u32 = 8;
/// SGLang's own images, one tag per release (`v0.5.23`).
pub const DEFAULT_SGLANG_REPOSITORY: &str = "lmsysorg/sglang";
pub const DEFAULT_SGLANG_IMAGE: &str = "lmsysorg/sglang:v0.5.23";
/// The PD router for both engine types: SGLang's model gateway (PyPI `smg`) on Debian's Python,
/// built by hack/gateway-image.sh (which reads the smg version from this tag).
pub const DEFAULT_ROUTER_IMAGE: &str = "pd-operator-gateway:smg-1.13.0";

/// A prefill/decode disaggregated SGLang deployment: prefill and decode engine pools that share
/// one model and one KV-transfer configuration, plus the PD router in front of them.
// kube-derive repeats `type_` across printcolumn entries, which clippy misreads as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "pd.inference.dev",
    version = "v1alpha1",
    kind = "PDDeployment",
    plural = "pddeployments",
    singular = "pddeployment",
    shortname = "pdd",
    category = "pd",
    namespaced,
    status = "PDDeploymentStatus",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.replicas", label_selector_path = ".status.selector"),
    derive = "PartialEq",
    printcolumn(name = "Prefill", type_ = "string", json_path = ".status.prefill.ready", description = "ready/desired prefill instances"),
    printcolumn(name = "Decode", type_ = "string", json_path = ".status.decode.ready", description = "ready/desired decode instances"),
    printcolumn(name = "Handshake", type_ = "string", json_path = ".status.conditions[?(@.type==\"HandshakeReady\")].status"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PDDeploymentSpec {
    /// How many times the declared prefill:decode unit runs: each role runs `replicas` times its
    /// own `replicas` instances. The `/scale` subresource's replicas (`kubectl scale`, HPA, KEDA).
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = MAX_INSTANCES))]
    pub replicas: i32,
    /// Which engine runs the pods. `sim` runs pd-operator's GPU-free stand-in instead of SGLang.
    #[serde(default)]
    pub engine: EngineSpec,
    /// The model both roles serve.
    pub model: ModelSpec,
    /// KV-cache transfer settings shared by both roles.
    #[serde(default)]
    pub kv_transfer: KvTransferSpec,
    /// The prefill pool.
    pub prefill: RoleSpec,
    /// The decode pool.
    pub decode: RoleSpec,
    /// The PD router in front of both pools.
    #[serde(default)]
    pub router: RouterSpec,
    /// How spec changes roll through the instances.
    #[serde(default)]
    pub rollout: RolloutSpec,
    /// Who may reach the engines and the router: NetworkPolicies the operator renders.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    /// Where the engine pods land: all-or-nothing instances and topology.
    #[serde(default)]
    pub placement: PlacementSpec,
    /// Bounds on each role's instance count: the decode:prefill ratio band and per-role minimum
    /// and maximum (see docs/scaling.md). Each role is also scaled on its own through its
    /// `PDRole` (`<name>-prefill`, `<name>-decode`).
    #[serde(default)]
    pub scaling: ScalingSpec,
    /// The planner: each role's count from SGLang's metrics (see docs/scaling.md). Unset: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// How often a broken instance is recreated: the budget and its backoff (docs/controller.md).
    #[serde(default)]
    pub recovery: RecoverySpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// `sglang` (the real engine) or `sim` (GPU-free stand-in speaking SGLang's bootstrap protocol).
    #[serde(default, rename = "type")]
    pub engine_type: EngineType,
    /// Engine image. Defaults to `lmsysorg/sglang:v<version>` (`v0.5.23` when no version is
    /// given) for `sglang` and to the operator's own image for `sim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// The SGLang release the image runs (e.g. `0.5.21`): the rules, the option table and the
    /// flags rendered are that release's. Unset: read from the image tag (`…:v0.5.21`); an image
    /// whose tag names no supported release is judged with the nearest one, with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The engine dry run, the gate before GPUs (docs/dry-run.md): before the engine pods of a new
    /// revision are created, the engine image runs in one short CPU-only pod that resolves every
    /// rendered process's argv and environment with SGLang's own start-up code on the named
    /// accelerator. `Required`: no engine pod is created until it passes. `BestEffort`: a refusal
    /// stops the pods, a dry run that gives no verdict (time-out, no shim output) does not. `Off`:
    /// none. Unset: `Required` for `sglang`, `Off` for `sim` (the stand-in runs no SGLang code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRunPolicy>,
}

impl EngineSpec {
    /// The dry run this spec gets (`dryRun`, or the engine type's default).
    pub fn dry_run_policy(&self) -> DryRunPolicy {
        self.dry_run.unwrap_or(match self.engine_type {
            EngineType::Sglang => DryRunPolicy::Required,
            EngineType::Sim => DryRunPolicy::Off,
        })
    }
}

/// `spec.engine.dryRun`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DryRunPolicy {
    Required,
    BestEffort,
    Off,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum EngineType {
    #[default]
    #[serde(rename = "sglang")]
    Sglang,
    #[serde(rename = "sim")]
    Sim,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// What `--model-path` gets: a Hugging Face id or a path inside the pod.
    pub path: String,
    /// HF `architectures[0]`, e.g. `DeepseekV3ForCausalLM`. Inferred from `path` when it is a
    /// well-known model id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Attention kind override; wins over the catalogue and the config map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionKind>,
    /// A ConfigMap holding the model's HF `config.json`; read by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,
    /// `--served-model-name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// `--revision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Where the weights come from. Set, `path` is the id the engines serve
    /// (`--served-model-name`, unless `servedName` is given) and `--model-path` points at the
    /// weights: mounted read-only at `/models` in every engine pod of both roles (`pvc`,
    /// `image`, `hostPath`), or the Hub repository (`huggingFace`). Unset, `path` goes to
    /// `--model-path` as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ModelSource>,
}

/// Exactly one of its fields.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("[has(self.huggingFace), has(self.pvc), has(self.image), has(self.hostPath)].filter(x, x).size() == 1").message("give exactly one model source: huggingFace, pvc, image or hostPath"))]
pub struct ModelSource {
    /// A Hugging Face Hub repository (or a mirror of the Hub's API): fetched by each engine pod,
    /// or, with `cache`, once into a volume every engine pod mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugging_face: Option<HuggingFaceSource>,
    /// A PersistentVolumeClaim holding the weights, mounted read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcModelSource>,
    /// An OCI image holding the weights, mounted read-only as a Kubernetes image volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageModelSource>,
    /// A directory already on every node the engines run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathModelSource>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct HuggingFaceSource {
    /// `org/name` on the Hub: `--model-path`.
    #[schemars(length(min = 1))]
    pub repo: String,
    /// A branch, tag or commit: `--revision` (wins over `model.revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// A Secret key holding the access token: `HF_TOKEN` of every engine container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
    /// The Hub's URL, for a mirror: `HF_ENDPOINT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Fetch the weights once, into this volume, instead of in every engine pod: a Job of the
    /// operator's image downloads the repository at the revision (resumable, each file's size and
    /// the Hub's sha256 checked) into `<repo>/<revision>/` of the volume; the engine pods of both
    /// roles mount it read-only at `/models` and are created only once it is complete
    /// (`status.model`, condition `ModelReady`). PDDeployments naming the same claim share the
    /// files. Unset, each engine pod downloads the model itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<ModelCache>,
}

/// Where fetched weights are kept: a PersistentVolumeClaim you name, or one the operator claims.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.claimName) != has(self.size)").message("give either claimName (a PersistentVolumeClaim you made) or size (the operator claims one, from storageClassName)"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.storageClassName) || has(self.size)").message("storageClassName goes with size: it is the class of the claim the operator makes"))]
pub struct ModelCache {
    /// A PersistentVolumeClaim of the PDDeployment's namespace; engine pods on several nodes need
    /// it `ReadWriteMany` (or a volume every node sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub claim_name: Option<String>,
    /// The storage class of the claim the operator makes (`ReadWriteMany`, owned by the
    /// PDDeployment); the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// The size of the claim the operator makes, e.g. `20Gi` (more than the repository's files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1))]
    pub name: String,
    /// Defaults to `token`.
    #[serde(default = "default_token_key")]
    pub key: String,
}

pub fn default_token_key() -> String {
    "token".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PvcModelSource {
    #[schemars(length(min = 1))]
    pub claim_name: String,
    /// The model's directory inside the volume (relative; default: its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ImageModelSource {
    /// The image holding the weights, e.g. `registry.example/models/qwen3-8b:1`.
    #[schemars(length(min = 1))]
    pub reference: String,
    /// The model's directory inside the image (relative; default: its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostPathModelSource {
    /// An absolute directory on the node.
    #[schemars(length(min = 1))]
    pub path: String,
}

impl ModelSpec {
    /// The id the model catalogue knows the model by: the Hub repository of a Hugging Face
    /// source, else `path`.
    pub fn catalogue_id(&self) -> &str {
        self.source.as_ref().and_then(|s| s.hugging_face.as_ref()).map_or(&self.path, |h| &h.repo)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    pub name: String,
    /// Key inside the ConfigMap; defaults to `config.json`.
    #[serde(default = "default_config_key")]
    pub key: String,
}

pub fn default_config_key() -> String {
    "config.json".into()
}

/// Attention kind of the model, which decides the KV pool kind SGLang's handshake looks at.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AttentionKind {
    /// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, ...).
    #[serde(rename = "MLA")]
    Mla,
    /// Linear attention over an MLA sub-pool (Kimi-Linear, ...).
    #[serde(rename = "HybridMLA")]
    HybridMla,
    /// Grouped-query attention (Llama 3, Qwen 2.5/3, Mistral, ...).
    #[serde(rename = "GQA")]
    Gqa,
    /// Plain multi-head attention.
    #[serde(rename = "MHA")]
    Mha,
}

impl std::fmt::Display for AttentionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Mla => "MLA",
            Self::HybridMla => "HybridMLA",
            Self::Gqa => "GQA",
            Self::Mha => "MHA",
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvTransferSpec {
    /// `--disaggregation-transfer-backend`.
    #[serde(default)]
    pub backend: TransferBackend,
    /// `--disaggregation-ib-device`: one device, a comma list, or a per-GPU JSON map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ib_device: Option<String>,
    /// `--page-size`, one value for both roles. Required: SGLang resolves it per backend and GPU
    /// otherwise, and a mismatch fails the handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_PAGE_SIZE))]
    pub page_size: Option<u32>,
    /// `--kv-cache-dtype`.
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
    /// `--disaggregation-bootstrap-port`.
    #[serde(default = "default_bootstrap_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub bootstrap_port: u16,
    /// `--disaggregation-decode-allocation-policy`.
    #[serde(default)]
    pub decode_allocation_policy: AllocationPolicy,
    /// `SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER` on both roles.
    #[serde(default)]
    pub all_cp_ranks_transfer: bool,
}

fn default_bootstrap_port() -> u16 {
    DEFAULT_BOOTSTRAP_PORT
}

impl Default for KvTransferSpec {
    fn default() -> Self {
        Self {
            backend: TransferBackend::default(),
            ib_device: None,
            page_size: None,
            kv_cache_dtype: KvCacheDtype::default(),
            bootstrap_port: DEFAULT_BOOTSTRAP_PORT,
            decode_allocation_policy: AllocationPolicy::default(),
            all_cp_ranks_transfer: false,
        }
    }
}

macro_rules! flag_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? } default $default:ident) => {
        $(#[$m])*
        #[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
        pub enum $name {
            $(
                #[serde(rename = $text)]
                #[allow(non_camel_case_types)]
                $variant,
            )+
        }
        impl $name {
            #[allow(unreachable_patterns)]
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text,)+ }
            }
        }
        impl Default for $name { fn default() -> Self { Self::$default } }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

flag_enum!(
    /// `--disaggregation-transfer-backend` values SGLang 0.5.23 accepts.
    TransferBackend {
        Mooncake => "mooncake",
        Nixl => "nixl",
        Ascend => "ascend",
        Mori => "mori",
        MooncakeTcp => "mooncake_tcp",
        Fake => "fake",
    } default Mooncake
);

flag_enum!(
    /// `--kv-cache-dtype` values SGLang 0.5.23 accepts. Compared as plain strings at handshake
    /// time: `bf16` and `bfloat16` do not match.
    KvCacheDtype {
        Auto => "auto",
        Fp8E5m2 => "fp8_e5m2",
        Fp8E4m3 => "fp8_e4m3",
        Mxfp8 => "mxfp8",
        Bf16 => "bf16",
        Bfloat16 => "bfloat16",
        Nvfp4 => "nvfp4",
        Fp4MxBlock16 => "fp4_mx_block16",
    } default Auto
);

flag_enum!(
    /// `--disaggregation-decode-allocation-policy`.
    AllocationPolicy {
        Early => "early",
        PrefillComplete => "prefill_complete",
    } default Early
);

flag_enum!(
    /// `--cp-strategy` for prefill context parallelism.
    CpStrategy {
        Zigzag => "zigzag",
        Interleave => "interleave",
    } default Zigzag
);

flag_enum!(
    /// The model gateway's (`smg --policy`) load-balancing policy.
    RouterPolicy {
        CacheAware => "cache_aware",
        RoundRobin => "round_robin",
        Random => "random",
        PowerOfTwo => "power_of_two",
    } default CacheAware
);

/// The two engine roles of a PD deployment, as the API spells them (`prefill`, `decode`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
    /// `spec.<role>.<rest>`, the field path used in messages.
    pub fn field(self, rest: &str) -> String {
        format!("spec.{}.{rest}", self.as_str())
    }
}

impl PDDeploymentSpec {
    pub fn role(&self, role: Role) -> &RoleSpec {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// Instance indices the role may use: its instances, then the surge instances of a rollout.
    pub fn instance_slots(&self, role: Role) -> u32 {
        self.instances(role).saturating_add(self.rollout.max_surge(role))
    }

    /// Instances the role runs: its `replicas` per unit times the units (`spec.replicas`).
    pub fn instances(&self, role: Role) -> u32 {
        let per_unit = u32::try_from(self.role(role).replicas).unwrap_or(0);
        per_unit.saturating_mul(u32::try_from(self.replicas).unwrap_or(0))
    }
}

impl RoleSpec {
    /// Pods one instance of the role spans (`tp*pp*dp / gpusPerNode`, at least 1).
    pub fn nodes_per_instance(&self) -> u32 {
        let per_node = u64::from(self.gpus_per_node.max(1));
        u32::try_from(self.parallelism.gpus().div_ceil(per_node).max(1)).unwrap_or(u32::MAX)
    }

    /// GPUs one pod of the role requests.
    pub fn gpus_per_pod(&self) -> u64 {
        self.parallelism.gpus().min(u64::from(self.gpus_per_node.max(1)))
    }
}

/// One role's pool: `replicas` engine instances of one parallel layout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    /// Number of engine instances (one SGLang server each).
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = MAX_INSTANCES))]
    pub replicas: i32,
    #[serde(default)]
    pub parallelism: Parallelism,
    /// GPUs on one node; an instance spans `tp*pp/gpusPerNode` pods when larger.
    #[serde(default = "default_gpus_per_node")]
    #[schemars(range(min = 1, max = MAX_GPUS_PER_NODE))]
    pub gpus_per_node: u32,
    /// `--enable-kv-cache-sharding` (prefill only in SGLang).
    #[serde(default)]
    pub enable_kv_cache_sharding: bool,
    /// `--enable-dsa-cache-layer-split` (DSA models with prefill CP, Mooncake only).
    #[serde(default)]
    pub enable_dsa_cache_layer_split: bool,
    /// The GPU this role's pods run on. SGLang resolves defaults per accelerator (attention
    /// backend, page size, KV dtype) and refuses some settings on some GPUs; when unset, rules
    /// that depend on it warn for the profiles where start-up would fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    /// Pod-level settings for this role's engine pods.
    #[serde(default)]
    pub template: RoleTemplate,
}

flag_enum!(
    /// An accelerator profile: what SGLang's start-up reads from the GPU (compute capability).
    Accelerator {
        H100 => "H100",
        H200 => "H200",
        B200 => "B200",
    } default H100
);

impl Accelerator {
    pub const ALL: [Accelerator; 3] = [Accelerator::H100, Accelerator::H200, Accelerator::B200];
    /// SM100+ (`is_blackwell` in SGLang's platform).
    pub fn is_blackwell(self) -> bool {
        matches!(self, Accelerator::B200)
    }

    /// A profile by name, any case (`--accelerator h100`); the error lists the profiles.
    pub fn parse(s: &str) -> Result<Accelerator, String> {
        Accelerator::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("{s:?} is not an accelerator profile; one of {}", Accelerator::ALL.map(Accelerator::as_str).join(", ")))
    }
}

pub(crate) fn one_i32() -> i32 {
    1
}
fn one() -> u32 {
    1
}
fn default_gpus_per_node() -> u32 {
    DEFAULT_GPUS_PER_NODE
}

/// The parallel layout of one engine instance, in SGLang's own terms.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
// CEL covers the one-object arithmetic at the apiserver; messages are static because
// `string(int)` in a messageExpression exceeds the apiserver's cost budget. `validate` and the
// webhook report the same rules with the values filled in.
#[x_kube(validation = kube::core::Rule::new("self.tp % (self.attnDp * self.attnCp) == 0").message("tp_size must be divisible by attn_dp_size * attn_cp_size: tp must be a multiple of attnDp × attnCp").field_path(".tp"))]
#[x_kube(validation = kube::core::Rule::new("self.tp % self.dcp == 0").message("tensor_model_parallel_size must be divisible by decode_context_parallel_size: tp must be a multiple of dcp").field_path(".dcp"))]
#[x_kube(validation = kube::core::Rule::new("!(self.dp > 1 && self.attnDp > 1)").message("data-parallel replicas combined with attention data parallelism are not supported: set dp or attnDp to 1").field_path(".dp"))]
#[x_kube(validation = kube::core::Rule::new(format!("self.tp * self.pp * self.dp <= {}", limits::MAX_GPUS_PER_INSTANCE)).message(kube::core::Message::Message(format!("an instance may use at most {} GPUs (tp × pp × dp)", limits::MAX_GPUS_PER_INSTANCE))).field_path(".tp"))]
#[x_kube(validation = kube::core::Rule::new("!(self.dcp > 1 && self.attnCp > 1)").message("--dcp-size > 1 does not support --enable-prefill-cp.").field_path(".dcp"))]
pub struct Parallelism {
    /// `--tp-size`: GPUs per engine instance and pipeline stage.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_PARALLEL_SIZE))]
    pub tp: u32,
    /// `--dp-size`: independent replicas inside one instance.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_PARALLEL_SIZE))]
    pub dp: u32,
    /// `--attn-dp-size`: attention data-parallel groups inside the TP group.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_PARALLEL_SIZE))]
    pub attn_dp: u32,
    /// `--pp-size`: pipeline stages.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_PARALLEL_SIZE))]
    pub pp: u32,
    /// `--attn-cp-size`: attention context parallelism (prefill only, with `cpStrategy`).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_PARALLEL_SIZE))]
    pub attn_cp: u32,
    /// `--dcp-size`: decode context parallelism (MLA and hybrid-MLA models only).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_PARALLEL_SIZE))]
    pub dcp: u32,
    /// `--cp-strategy`, required with `attnCp > 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cp_strategy: Option<CpStrategy>,
}

impl Default for Parallelism {
    fn default() -> Self {
        Self { tp: 1, dp: 1, attn_dp: 1, pp: 1, attn_cp: 1, dcp: 1, cp_strategy: None }
    }
}

impl Parallelism {
    /// Attention-TP width, as SGLang derives it (`tp / attn_dp / attn_cp`); 0 when undefined.
    pub fn attn_tp(&self) -> u32 {
        let groups = self.attn_dp.saturating_mul(self.attn_cp);
        self.tp.checked_div(groups).unwrap_or(0)
    }
    /// GPUs one instance uses; saturates instead of overflowing for widths past the schema's.
    pub fn gpus(&self) -> u64 {
        u64::from(self.tp).saturating_mul(u64::from(self.pp)).saturating_mul(u64::from(self.dp))
    }
}

/// Pod-level knobs for a role's engine pods. The engine's own flags come from the spec above;
/// `extraArgs` may add flags the operator does not manage, never override one it does.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleTemplate {
    /// Extra engine arguments appended after the managed ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Container resources; `nvidia.com/gpu` is set by the operator from the parallel layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::free_form_object")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::free_form_list")]
    pub volumes: Vec<Volume>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Engine container security context (e.g. `capabilities.add: [IPC_LOCK]` for RDMA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::free_form_object")]
    pub security_context: Option<SecurityContext>,
    /// Host networking (often needed for RDMA); not allowed by the `baseline` Pod Security Standard.
    #[serde(default)]
    pub host_network: bool,
    /// Size of the `/dev/shm` memory volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Mounts the ServiceAccount token into the engine container; off unless true, since SGLang
    /// calls no Kubernetes API (the decode sidecar gets its own token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
}

/// Keeps the CRD small enough for client-side `kubectl apply`: large core types are accepted
/// as free-form objects here and checked by the apiserver when the pod is created.
pub(crate) fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

pub(crate) fn free_form_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouterSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = MAX_ROUTER_REPLICAS))]
    pub replicas: i32,
    #[serde(default)]
    pub policy: RouterPolicy,
    /// Router image: SGLang's model gateway (`smg`), run as `python3 -m smg.launch_router`;
    /// defaults to pd-operator's gateway image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default = "default_router_port")]
    pub port: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

fn yes() -> bool {
    true
}
fn default_router_port() -> u16 {
    DEFAULT_ROUTER_PORT
}

impl Default for RouterSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            replicas: 1,
            policy: RouterPolicy::default(),
            image: None,
            port: DEFAULT_ROUTER_PORT,
            extra_args: Vec::new(),
            resources: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Instances per role that may be down at once during a spec change (unless the role's own
    /// `maxUnavailable` says otherwise). 0 needs `maxSurge`: the role then never runs below its
    /// instance count.
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = MAX_INSTANCES))]
    pub max_unavailable: i32,
    /// Extra instances per role that an in-place rollout may bring up at the new revision before
    /// it takes old ones down (unless the role's own `maxSurge` says otherwise). They go once
    /// every instance runs the new revision and has served `minReadySeconds`. 0 (the default):
    /// none. A KV-incompatible change surges a whole KV set instead (see `strategy`).
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_SURGE))]
    pub max_surge: i32,
    /// How far, in percent of its instances, one role's rollout may run ahead of the other's.
    /// 0 (the default): the roles take turns, so the prefill:decode mix of revisions stays even.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub max_skew: i32,
    /// Seconds an instance leaving (scale-down, rollout) stays out of the router's pool before its
    /// pods are deleted, so requests in flight finish. 0: delete at once.
    #[serde(default = "default_drain_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub drain_seconds: i32,
    /// Seconds a new instance must have served (pods Ready, handshake passed) before the rollout
    /// counts it available and takes the next one out. The router's discovery adds a worker some
    /// seconds after its pod turns Ready; without this wait a role of two could briefly have none
    /// in the router's pool.
    #[serde(default = "default_min_ready_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub min_ready_seconds: i32,
    /// How a spec change reaches the pods. `Auto`: in place, instance by instance, when the new
    /// revisions are KV-compatible with the running pods (the handshake core judges new decode
    /// with running prefill and running decode with new prefill), and as a new KV set beside the
    /// running one when they are not. `Surge`: always as a new KV set (twice the GPUs while it
    /// comes up; no instance is ever taken down first, even in a role of one).
    #[serde(default)]
    pub strategy: RolloutStrategy,
    /// How a new operator release's handshake sidecar reaches running decode pods. `InPlace`
    /// (the default): the sidecar container's image is changed on the running pod, one decode
    /// pod at a time; the kubelet restarts that container alone, the engine keeps running and
    /// the pod stays Ready (the restarted sidecar keeps the passed gate while it re-checks).
    /// `OnRollout`: running pods keep their sidecar until their role next rolls. Pods made
    /// before the sidecar lost its startup probe are always left to the next rollout: their
    /// probe would hold them unready for a probe period after the restart.
    #[serde(default)]
    pub sidecar_update: SidecarUpdate,
    #[serde(default, skip_serializing_if = "RoleRollout::is_default")]
    pub prefill: RoleRollout,
    #[serde(default, skip_serializing_if = "RoleRollout::is_default")]
    pub decode: RoleRollout,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_unavailable: 1,
            max_surge: 0,
            max_skew: 0,
            drain_seconds: default_drain_seconds(),
            min_ready_seconds: default_min_ready_seconds(),
            strategy: RolloutStrategy::default(),
            sidecar_update: SidecarUpdate::default(),
            prefill: RoleRollout::default(),
            decode: RoleRollout::default(),
        }
    }
}

fn default_drain_seconds() -> i32 {
    30
}

fn default_min_ready_seconds() -> i32 {
    10
}

/// The most surge instances a role may have (`rollout.maxSurge`).
pub const MAX_SURGE: u32 = 16;

/// `rollout.strategy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum RolloutStrategy {
    #[default]
    Auto,
    Surge,
}

/// `rollout.sidecarUpdate`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum SidecarUpdate {
    #[default]
    InPlace,
    OnRollout,
}

/// One role's rollout settings. Not part of the role's revision: changing them rolls nothing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleRollout {
    /// Overrides `rollout.maxUnavailable` for this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_INSTANCES))]
    pub max_unavailable: Option<i32>,
    /// Overrides `rollout.maxSurge` for this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_SURGE))]
    pub max_surge: Option<i32>,
    /// Instances with an index below this keep the revision they run (a canary: only instances
    /// `partition` and up update). 0, the default: every instance updates. An instance below the
    /// partition that has to be recreated comes back at the new revision.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_INSTANCES))]
    pub partition: i32,
}

impl RoleRollout {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl RolloutSpec {
    pub fn role(&self, role: Role) -> &RoleRollout {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// Instances of `role` that may be down at once during a rollout (at least 1 unless the role
    /// surges).
    pub fn max_unavailable(&self, role: Role) -> u32 {
        let n = u32::try_from(self.role(role).max_unavailable.unwrap_or(self.max_unavailable)).unwrap_or(1);
        if self.max_surge(role) == 0 { n.max(1) } else { n }
    }

    /// Extra instances of `role` an in-place rollout may run beside the old ones.
    pub fn max_surge(&self, role: Role) -> u32 {
        u32::try_from(self.role(role).max_surge.unwrap_or(self.max_surge)).unwrap_or(0).min(MAX_SURGE)
    }

    /// Instances of `role` below this index are not updated.
    pub fn partition(&self, role: Role) -> u32 {
        u32::try_from(self.role(role).partition).unwrap_or(0)
    }
}

/// SGLang's bootstrap server, rank ports and HTTP API take requests from anyone who can reach
/// them (a `PUT /route` registers rank addresses a decode then pulls KV from). With this on, the
/// engine pods accept traffic only from the PDDeployment's own engine pods (every port: bootstrap,
/// ranks, distributed init) and on the HTTP port from its router; the router, or the engines'
/// HTTP port when the router is disabled, from `clientsFrom`. Egress is left open.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Render the policies. Turn off only where the network plugin enforces no NetworkPolicy, or
    /// where another tool owns them: the engines' ports are then open to the whole cluster.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Who may send requests (NetworkPolicy peers: podSelector, namespaceSelector, ipBlock).
    /// Empty: every pod in the PDDeployment's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients_from: Vec<NetworkPolicyPeer>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self { enabled: true, clients_from: Vec::new() }
    }
}

/// How engine pods are scheduled. Applies to pods created from the change on (scheduling
/// constraints cannot move running pods); changing it rolls nothing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.colocate) || self.colocate == 'none' || has(self.topologyKey)").message("colocate needs topologyKey: the node label whose value prefill and decode pods share").field_path(".colocate"))]
pub struct PlacementSpec {
    /// All-or-nothing scheduling of each multi-node instance. `auto` (the default): Kubernetes' own
    /// gang scheduling (a PodGroup per instance, `scheduling.k8s.io/v1beta1`, feature gate
    /// `GenericWorkload`) where the cluster serves it, none elsewhere; `workload`: required (the
    /// PDDeployment reports an error where it is not served); `none`: pods schedule one by one.
    #[serde(default)]
    pub gang: GangMode,
    /// A node label naming a topology domain (a rack, an NVLink domain): each instance's pods land
    /// on nodes with one value of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
    /// Keep every prefill and decode pod in one domain of `topologyKey`, so KV moves within it:
    /// `required`, `preferred`, or `none` (the default).
    #[serde(default)]
    pub colocate: Colocation,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum GangMode {
    #[default]
    Auto,
    Workload,
    None,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Colocation {
    #[default]
    None,
    Preferred,
    Required,
}

/// Observed state, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PDDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Units running at the desired revision and ready in both roles (the `/scale` subresource's
    /// status replicas): the fewer of ready prefill and ready decode instances, each divided by
    /// its per-unit count.
    #[serde(default)]
    pub replicas: i32,
    /// The engine pods, as a label selector string (the `/scale` subresource's selector: HPA
    /// averages its pod metrics over these).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub prefill: RoleStatus,
    #[serde(default)]
    pub decode: RoleStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// Per decode instance: which prefill ranks each decode rank reads KV from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_map: Vec<DecodeRankMap>,
    /// The KV page size both roles run with, as SGLang resolves it (e.g. 64 for DSA, 256 for
    /// DeepSeek-V4): with `kvTransfer.pageSize` unset, the value the operator pins for both.
    /// Set once the spec is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u32>,
    /// Which KV set new pods go to and which the router pairs (see docs/rollouts.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_set: Option<KvSetStatus>,
    /// The engine dry run of the spec's processes (`spec.engine.dryRun`, docs/dry-run.md): its
    /// verdict is kept here, by key, so a scale or a re-apply does not run it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_verification: Option<EngineVerification>,
    /// The planner's last pass (`spec.autoscaling`): each role's recommendation, its reasons and
    /// the metrics it read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,
    /// The fetch of a cached Hugging Face source (`spec.model.source.huggingFace.cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelFetchStatus>,
    /// The instances recreated within `spec.recovery.windowSeconds`: how often, when and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recoveries: Vec<InstanceRecovery>,
}

/// The weights' fetch into the cache, as the fetch Job reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelFetchStatus {
    /// `Pending` (the Job's pod has not reported yet), `Fetching`, `Fetched` or `Failed`.
    pub phase: String,
    /// Bytes of the repository's files in the cache, verified or being written.
    #[serde(default)]
    pub bytes: i64,
    /// The repository's size at the revision, as the Hub lists it; 0 until listed.
    #[serde(default)]
    pub total_bytes: i64,
    /// Files in place and verified.
    #[serde(default)]
    pub files: i32,
    /// Files the repository has at the revision; 0 until listed.
    #[serde(default)]
    pub total_files: i32,
    /// The fetch Job.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job: String,
}

/// One engine dry run and its verdict.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct EngineVerification {
    /// What was verified: a hash of the engine image, every process's argv and environment, the
    /// accelerator each runs on and the model config.
    pub key: String,
    /// `Verified`, `EngineRefused`, `Pending`, `TimedOut` or `NoVerdict` (the reasons of the
    /// `EngineVerified` condition).
    pub result: String,
    /// What it waits for, SGLang's text per refused process, or why there is no verdict.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The dry-run pod, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The image the dry run ran, by digest (the pod's `imageID`), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The SGLang release the image's code reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sglang_version: Option<String>,
}

/// Pods of one KV set may pair; pods of different sets never do.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct KvSetStatus {
    /// The set new pods go to (`pd.inference.dev/kv-set`).
    pub target: u32,
    /// The set the router pairs.
    pub routed: u32,
    pub strategy: KvSetStrategy,
    /// For `Surge`: the first incompatible pair, with SGLang's text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// How the spec's revision reaches the running KV set.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum KvSetStrategy {
    /// The spec's KV contract is compatible with the running set: new revisions roll inside it.
    #[default]
    InPlace,
    /// It is not: the target set comes up beside the routed one, the router moves once it is
    /// whole, and the old set drains and goes.
    Surge,
}

impl std::fmt::Display for KvSetStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvSetStrategy::InPlace => "InPlace",
            KvSetStrategy::Surge => "Surge",
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    pub replicas: i32,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
    /// `ready/desired`, for `kubectl get`.
    pub ready: String,
    /// The revision instances not yet updated run (the update revision once all run it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_revision: String,
    /// The revision the role's spec renders (`pd.inference.dev/revision` of new pods).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub update_revision: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<String>,
    #[serde(default)]
    pub prefill: Vec<InstanceEndpoint>,
    #[serde(default)]
    pub decode: Vec<InstanceEndpoint>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceEndpoint {
    pub instance: u32,
    pub http: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DecodeRankMap {
    pub decode_instance: u32,
    /// One entry per (decode attention-TP rank, PP rank).
    pub ranks: Vec<RankTargets>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RankTargets {
    pub engine_rank: u32,
    pub pp_rank: u32,
    pub tp_ranks: Vec<u32>,
    pub cp_ranks: Vec<u32>,
    pub pp_ranks: Vec<u32>,
    pub required_dst_info_num: u32,
    pub required_prefill_response_num: u32,
}

/// Why the CRD could not be produced. Never a CRD with the formats unfixed, nor an empty one.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("cannot convert the CRD through JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot write the CRD as YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
}

/// The CustomResourceDefinition as the apiserver should get it.
pub fn crd() -> Result<CustomResourceDefinition, CrdError> {
    fixed(<PDDeployment as kube::CustomResourceExt>::crd())
}

/// The `PDRole` CustomResourceDefinition (each role's scale target).
pub fn role_crd() -> Result<CustomResourceDefinition, CrdError> {
    fixed(<PDRole as kube::CustomResourceExt>::crd())
}

// schemars writes `uint32`/`uint16` formats, which the apiserver does not know (and warns
// about); Kubernetes' integer formats are int32/int64, and `minimum: 0` keeps them unsigned.
fn fixed(crd: CustomResourceDefinition) -> Result<CustomResourceDefinition, CrdError> {
    let mut value = serde_json::to_value(crd)?;
    fix_formats(&mut value);
    Ok(serde_json::from_value(value)?)
}

fn fix_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            if let Some(f) = o.get_mut("format").filter(|f| matches!(f.as_str(), Some("uint32" | "uint16" | "uint8"))) {
                *f = "int32".into();
            }
            o.values_mut().for_each(fix_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(fix_formats),
        _ => {}
    }
}

/// Both CRDs as one YAML stream, exactly what `crds/pddeployment.yaml` holds: the PDDeployment,
/// then the PDRole.
pub fn crd_yaml() -> Result<String, CrdError> {
    let body = quote_yaml11_booleans(&serde_norway::to_string(&crd()?)?);
    let role = serde_norway::to_string(&role_crd()?)?;
    Ok(format!("# Generated by `pd-operator crd`; do not edit.\n{body}---\n{role}"))
}

/// Quotes the bare scalars YAML 1.1 (kubectl's reader) takes for booleans: the YAML writer
/// follows YAML 1.2 and leaves `- Off` (`spec.engine.dryRun`'s enum) bare, which kubectl would
/// install as `false`.
fn quote_yaml11_booleans(text: &str) -> String {
    const WORDS: [&str; 16] = ["y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"];
    let quote = |line: &str| -> Option<String> {
        let (head, value) = line.rsplit_once(": ").or_else(|| line.rsplit_once("- "))?;
        let sep = if line.ends_with(&format!(": {value}")) { ": " } else { "- " };
        WORDS.contains(&value).then(|| format!("{head}{sep}'{value}'"))
    };
    let mut out: String = text.lines().map(|l| quote(l).unwrap_or_else(|| l.to_owned())).collect::<Vec<_>>().join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    /// The derive takes its group and version as literals; they must stay the constants'.
    #[test]
    fn every_kind_of_ours_has_the_constants_api_version() {
        assert_eq!(super::PDDeployment::api_version(&()), super::API_VERSION);
        assert_eq!(super::PDRole::api_version(&()), super::API_VERSION);
        assert_eq!(<super::PDRole as k8s_openapi::Resource>::API_VERSION, super::API_VERSION);
    }
}
