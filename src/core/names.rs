//! The naming scheme of everything pd-operator creates: object names, host names, selectors,
//! common labels, ports and container names. The bottom of pd-core: it imports only pd-api, so
//! every layer above (rules, rendering, Jobs, decisions) names things the same way.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::Resource;
use kube::core::{Expression, Selector};
use pd_api::labels::{LABEL_DEPLOYMENT, LABEL_NODE_RANK, LABEL_ROLE, MANAGED_BY, OPERATOR};
use pd_api::{PDDeployment, PDDeploymentSpec, Role};
use sha2::{Digest, Sha256};

/// What names the objects that cover both roles' engine pods (`{name}-engines`): their headless
/// Service and NetworkPolicy.
pub const ENGINES: &str = "engines";
pub const DIST_INIT_PORT: u16 = 5757;
pub const HANDSHAKE_PORT: u16 = 8099;

/// The handshake sidecar's container name (a restartable init container of each decode pod).
pub const SIDECAR_CONTAINER: &str = "handshake";
/// The engine pods' SGLang (or stand-in) container.
pub const ENGINE_CONTAINER: &str = "engine";

/// Where a mounted model source appears in every engine container.
pub const MODEL_MOUNT: &str = "/models";
/// The engine pod's volume holding the weights.
pub const MODEL_VOLUME: &str = "model";

/// The headless Service of PDDeployment `name`'s engine pods (both roles), and their NetworkPolicy.
pub fn engines_name(name: &str) -> String {
    format!("{name}-{ENGINES}")
}
/// The highest KV set whose pod host names validation keeps within a DNS label: a PDDeployment
/// can take 999 incompatible rollouts (each surges into the next set) before its names grow.
pub const NAMED_KV_SETS: u32 = 999;
/// Set 0 keeps the plain names; a later set's objects end in `-s<set>`.
pub fn set_suffix(set: u32) -> String {
    if set == 0 { String::new() } else { format!("-s{set}") }
}
pub fn pod_name(name: &str, role: Role, instance: u32, node: u32, set: u32) -> String {
    format!("{name}-{}-{instance}-{node}{}", role.as_str(), set_suffix(set))
}
pub fn router_name(name: &str) -> String {
    format!("{name}-router")
}
/// The handshake ConfigMap of one KV set (its decodes' topology and its prefills' addresses).
pub fn handshake_config_name(name: &str, set: u32) -> String {
    format!("{name}-handshake{}", set_suffix(set))
}
/// Name of the handshake Role and RoleBinding.
pub fn handshake_rbac_name(name: &str) -> String {
    format!("{name}-handshake")
}
/// The decode pods' ServiceAccount: the template's, or one the operator creates.
pub fn decode_service_account(spec: &PDDeploymentSpec, name: &str) -> String {
    spec.decode.template.service_account_name.clone().unwrap_or_else(|| format!("{name}-decode"))
}

/// Stable DNS name of an instance's leader pod through the engines' headless Service.
pub fn leader_host(name: &str, ns: &str, role: Role, instance: u32, set: u32) -> String {
    format!("{}.{}.{ns}.svc", pod_name(name, role, instance, 0, set), engines_name(name))
}

/// The address a decode (and the router) uses for a prefill's bootstrap server.
pub fn bootstrap_address(name: &str, ns: &str, instance: u32, port: u16, set: u32) -> String {
    format!("{}:{port}", leader_host(name, ns, Role::Prefill, instance, set))
}

/// The prefill and decode pods of PDDeployment `name`, as the `/scale` subresource's selector
/// string (`to_string`) or a `LabelSelector` (`engine_pods`).
pub fn engine_selector(name: &str) -> Selector {
    let roles = [Role::Prefill, Role::Decode].map(|r| r.as_str().to_owned());
    Selector::from_iter([Expression::Equal(LABEL_DEPLOYMENT.into(), name.into()), Expression::In(LABEL_ROLE.into(), roles.into())])
}

/// The leader pod (node rank 0) of each instance of one role, as a `PDRole`'s `/scale` selector:
/// one pod per instance, the unit the role's count is in.
pub fn role_leader_selector(name: &str, role: Role) -> Selector {
    Selector::from_iter([
        Expression::Equal(LABEL_DEPLOYMENT.into(), name.into()),
        Expression::Equal(LABEL_ROLE.into(), role.as_str().into()),
        Expression::Equal(LABEL_NODE_RANK.into(), "0".into()),
    ])
}

/// `engine_selector` as the `LabelSelector` of NetworkPolicies and topology spread.
pub fn engine_pods(name: &str) -> LabelSelector {
    engine_selector(name).into()
}

pub fn common_labels(name: &str, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_owned(), OPERATOR.to_owned()),
        ("app.kubernetes.io/name".to_owned(), "sglang".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), name.to_owned()),
        (LABEL_DEPLOYMENT.to_owned(), name.to_owned()),
        (LABEL_ROLE.to_owned(), role.to_owned()),
    ])
}

/// Ten hex digits of the SHA-256 of `inputs`: revisions, cache keys and child names.
pub fn short_hash(inputs: &serde_json::Value) -> String {
    let digest = Sha256::digest(inputs.to_string().as_bytes());
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// The controller reference every child object carries.
pub fn owner_refs(pdd: &PDDeployment) -> Option<Vec<OwnerReference>> {
    pdd.controller_owner_ref(&()).map(|o| vec![o])
}

/// `pd.inference.dev/role` of the dry-run pod and its ConfigMap.
pub const DRY_RUN_ROLE: &str = "dry-run";

/// The shim's ConfigMap name.
pub fn shim_config_name(name: &str) -> String {
    format!("{name}-dry-run-shim")
}

/// The NetworkPolicy of PDDeployment `name`'s dry-run pods .
pub fn policy_name(name: &str) -> String {
    format!("{name}-dry-run")
}
