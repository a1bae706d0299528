//! Scaling each role on its own: `spec.scaling` of a PDDeployment (the ratio band and each role's
//! bounds) and the `PDRole` kind, one object per role, whose `/scale` subresource `kubectl scale`,
//! HPA and KEDA drive (see docs/scaling.md for who owns a role's count).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Role;

/// The bounds the operator keeps each role's instance count in, whoever asks for the count: the
/// PDDeployment's own `/scale` (`spec.replicas` × each role's per-unit `replicas`) or a role's
/// `PDRole` `/scale`. A count outside them is clamped and reported (condition `ScalingLimited`
/// and an Event), never dropped silently.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingSpec {
    /// Decode instances per prefill instance the deployment may run (e.g. `{min: 0.5, max: 4}`).
    /// Unset: any ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<RatioBand>,
    /// Bounds of the prefill instance count.
    #[serde(default)]
    pub prefill: RoleLimits,
    /// Bounds of the decode instance count.
    #[serde(default)]
    pub decode: RoleLimits,
}

impl ScalingSpec {
    pub fn role(&self, role: Role) -> &RoleLimits {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }
}

/// A band of decode:prefill ratios, `min <= decode/prefill <= max`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.min > 0.0").message("spec.scaling.ratio.min must be positive (decode instances per prefill instance, e.g. 0.5): set it above 0 or drop spec.scaling.ratio").field_path(".min"))]
#[x_kube(validation = kube::core::Rule::new("self.min <= self.max").message("spec.scaling.ratio.min must not exceed spec.scaling.ratio.max: swap them or widen the band").field_path(".min"))]
pub struct RatioBand {
    /// Fewest decode instances per prefill instance.
    pub min: f64,
    /// Most decode instances per prefill instance.
    pub max: f64,
}

/// One role's instance-count bounds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas: lower minReplicas or raise maxReplicas").field_path(".minReplicas"))]
pub struct RoleLimits {
    /// Fewest instances (default 1). `0` lets the role scale to zero: the router stays up and
    /// answers requests with an error while a role has no instance (see docs/scaling.md).
    #[serde(default = "crate::one_i32")]
    #[schemars(range(min = 0, max = crate::limits::MAX_INSTANCES))]
    pub min_replicas: i32,
    /// Most instances. Unset: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::limits::MAX_INSTANCES))]
    pub max_replicas: Option<i32>,
}

impl Default for RoleLimits {
    fn default() -> Self {
        Self { min_replicas: 1, max_replicas: None }
    }
}

/// The scale target of one role of a PDDeployment, `<pddeployment>-<role>`, created and owned by
/// the operator. Its `spec.replicas` is the role's instance count while the operator owns the
/// field (it follows the PDDeployment); once another field manager writes it (`kubectl scale`,
/// an HPA, KEDA), that manager owns the role's count and the PDDeployment no longer moves it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[kube(
    group = "pd.inference.dev",
    version = "v1alpha1",
    kind = "PDRole",
    plural = "pdroles",
    singular = "pdrole",
    shortname = "pdr",
    category = "pd",
    namespaced,
    status = "PDRoleStatus",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.replicas", label_selector_path = ".status.selector"),
    derive = "PartialEq",
    derive = "Default",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Wanted", type_ = "integer", json_path = ".spec.replicas", description = "instances asked for"),
    printcolumn(
        name = "Target",
        type_ = "integer",
        json_path = ".status.targetReplicas",
        description = "instances after the PDDeployment's bounds"
    ),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas", description = "instances with pods"),
    printcolumn(name = "Owner", type_ = "string", json_path = ".status.replicasOwner"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PDRoleSpec {
    /// `prefill` or `decode`; set by the operator.
    pub role: Role,
    /// Instances of the role asked for (the `/scale` subresource's replicas). Removing the field
    /// hands the count back to the PDDeployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::limits::MAX_INSTANCES))]
    pub replicas: Option<i32>,
}

/// Observed state of a role, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PDRoleStatus {
    /// Instances of the role that have pods not being deleted (the `/scale` status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// The leader pod of each instance of the role (node rank 0), as a label selector string: one
    /// pod per instance, so HPA's per-pod averages count instances, not the pods of a multi-node
    /// instance.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// Instances the operator runs: the count asked for, within `spec.scaling` of the PDDeployment.
    #[serde(default)]
    pub target_replicas: i32,
    /// Who owns the count: `PDDeployment`, or the field manager that wrote `spec.replicas`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replicas_owner: String,
    /// Why `targetReplicas` differs from `spec.replicas`, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limited: Option<String>,
}

/// The `PDRole` of `role` of PDDeployment `deployment`.
pub fn role_object_name(deployment: &str, role: Role) -> String {
    format!("{deployment}-{}", role.as_str())
}

/// So `child_kinds!` can name the kind beside Kubernetes' own (its group, plural and kind).
impl k8s_openapi::Resource for PDRole {
    const API_VERSION: &'static str = crate::API_VERSION;
    const GROUP: &'static str = crate::GROUP;
    const KIND: &'static str = "PDRole";
    const VERSION: &'static str = crate::VERSION;
    const URL_PATH_SEGMENT: &'static str = "pdroles";
    type Scope = k8s_openapi::NamespaceResourceScope;
}
