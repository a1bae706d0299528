//! Every kind a PDDeployment owns besides its engine pods, declared once (`child_kinds!`).
//!
//! From this one list follow: `render::Rendered`'s fields and the order of `render`'s output, the
//! controller's caches and watches, its readiness and divergence checks, the order it applies in,
//! and the test that the chart's RBAC grants what the controller does with each kind. Engine pods
//! are not in the list: the planner creates and deletes them one instance at a time.
//!
//! Adding a kind is one entry here (and the render code that fills its field).

/// Calls `$then! { before_pods: [...], after_pods: [...] }` with the list. Each entry:
/// `field: Type { stage, per_set, gated, slim }`, where
/// - `field` is `Rendered`'s field (a `Vec<Type>`) and the controller's cache of the kind;
/// - `stage`: the controller applies stage 0 first, all kinds of a stage at once, then stage 1
///   (a RoleBinding after its Role: RBAC's escalation check reads the Role). Engine pods go after
///   all of them, since admission refuses a pod whose ServiceAccount does not exist;
/// - `per_set`: an older KV set's objects of this kind stay while that set has pods;
/// - `gated`: only where the cluster serves Kubernetes' gang scheduling API;
/// - `slim`: what the cache drops of each object (fields reconciles never read).
///
/// `before_pods` and `after_pods` are the order of `render`'s output around the engine pods.
#[macro_export]
macro_rules! child_kinds {
    ($then:ident) => {
        $then! {
            before_pods: [
                /// The engines' headless Service and the router's Service.
                services: ::k8s_openapi::api::core::v1::Service {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
                /// The decode sidecars' handshake inputs, one per KV set.
                config_maps: ::k8s_openapi::api::core::v1::ConfigMap {
                    stage: 0, per_set: true, gated: false, slim: $crate::children::keep_all },
                /// The decode pods' ServiceAccount (unless the decode template names its own) and the router's.
                service_accounts: ::k8s_openapi::api::core::v1::ServiceAccount {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
                /// What the handshake sidecar may do (patch the status of its PDDeployment's decode
                /// pods) and what the router's discovery may do (read the namespace's pods).
                roles: ::k8s_openapi::api::rbac::v1::Role {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
                role_bindings: ::k8s_openapi::api::rbac::v1::RoleBinding {
                    stage: 1, per_set: false, gated: false, slim: $crate::children::keep_all },
                /// The cache a Hugging Face source's weights are fetched into, when the operator
                /// claims it (`spec.model.source.huggingFace.cache.size`).
                persistent_volume_claims: ::k8s_openapi::api::core::v1::PersistentVolumeClaim {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
                /// The fetch of a cached Hugging Face source (`model_fetch`): engine pods wait for it.
                jobs: ::k8s_openapi::api::batch::v1::Job {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
            ],
            after_pods: [
                /// The router.
                deployments: ::k8s_openapi::api::apps::v1::Deployment {
                    stage: 0, per_set: false, gated: false, slim: $crate::sets::slim_deployment },
                /// Who may reach the engines and the router (`spec.networkPolicy`).
                network_policies: ::k8s_openapi::api::networking::v1::NetworkPolicy {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
                /// One gang per multi-node instance (`spec.placement.gang`).
                pod_groups: ::k8s_openapi::api::scheduling::v1beta1::PodGroup {
                    stage: 0, per_set: true, gated: true, slim: $crate::children::keep_all },
                /// Each role's scale target (`PDRole`, `/scale` for `kubectl scale`, HPA, KEDA).
                pd_roles: ::pd_api::PDRole {
                    stage: 0, per_set: false, gated: false, slim: $crate::children::keep_all },
            ],
        }
    };
}

/// The `slim` of a kind whose cached objects are kept whole.
pub fn keep_all<K>(_: &mut K) {}

/// The last stage of the list: the controller applies stages `0..=LAST_STAGE` in order.
pub const LAST_STAGE: u8 = 1;

/// One kind of the list, as data: what tests and checks read without naming the types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildKind {
    /// `Rendered`'s field.
    pub field: &'static str,
    /// The API group ("" for the core group), resource (plural) and kind.
    pub group: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub stage: u8,
    pub per_set: bool,
    pub gated: bool,
}

macro_rules! kinds_table {
    (before_pods: [$($(#[$b:meta])* $bf:ident: $bt:ty { stage: $bs:literal, per_set: $bp:literal, gated: $bg:literal, slim: $bsl:path }),* $(,)?],
     after_pods: [$($(#[$a:meta])* $af:ident: $at:ty { stage: $as_:literal, per_set: $ap:literal, gated: $ag:literal, slim: $asl:path }),* $(,)?] $(,)?) => {
        /// Every kind of the list, in `render`'s output order (the pods' place is between
        /// `role_bindings` and `deployments`).
        pub const KINDS: &[ChildKind] = &[
            $(ChildKind { field: stringify!($bf), group: <$bt as k8s_openapi::Resource>::GROUP, plural: <$bt as k8s_openapi::Resource>::URL_PATH_SEGMENT,
                kind: <$bt as k8s_openapi::Resource>::KIND, stage: $bs, per_set: $bp, gated: $bg },)*
            $(ChildKind { field: stringify!($af), group: <$at as k8s_openapi::Resource>::GROUP, plural: <$at as k8s_openapi::Resource>::URL_PATH_SEGMENT,
                kind: <$at as k8s_openapi::Resource>::KIND, stage: $as_, per_set: $ap, gated: $ag },)*
        ];
    };
}
crate::child_kinds!(kinds_table);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_each_kind_once_with_its_api_resource() {
        let mut plurals: Vec<_> = KINDS.iter().map(|k| k.plural).collect();
        plurals.sort_unstable();
        plurals.dedup();
        assert_eq!(plurals.len(), KINDS.len());
        let binding = KINDS.iter().find(|k| k.kind == "RoleBinding").unwrap();
        assert_eq!((binding.group, binding.plural, binding.field), ("rbac.authorization.k8s.io", "rolebindings", "role_bindings"));
        let role = KINDS.iter().find(|k| k.kind == "Role").unwrap();
        assert!(role.stage < binding.stage, "a RoleBinding is applied after its Role");
        assert!(KINDS.iter().all(|k| k.stage <= LAST_STAGE));
    }
}
