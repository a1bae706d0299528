//! Where engine pods land: one gang per multi-node instance (Kubernetes' own PodGroup,
//! `scheduling.k8s.io/v1beta1`) and topology (every pod of an instance, and optionally every
//! prefill and decode pod, within one domain of a node label).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Node, PodAffinity, PodAffinityTerm, PodSchedulingGroup, PodSpec, WeightedPodAffinityTerm};
use k8s_openapi::api::scheduling::v1beta1::{
    GangSchedulingPolicy, PodGroup, PodGroupSchedulingConstraints, PodGroupSchedulingPolicy, PodGroupSpec, TopologyConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};

use super::{GPU_RESOURCE, LABEL_INSTANCE, LABEL_KV_SET, RenderOptions, common_labels, engine_pods, meta};
use crate::findings::Finding;
use pd_api::{Colocation, GangMode, PDDeploymentSpec, Role};

/// Judges `spec.placement.topologyKey` against the cluster: the GPUs of each of its domains
/// among `nodes` (the nodes carrying that label). An error where an instance can never
/// schedule, a warning where no node carries the label yet. Whether the cluster serves gang
/// scheduling is `validate::gang_api`'s, which the webhook applies too.
pub fn judge(spec: &PDDeploymentSpec, nodes: &[Node]) -> Vec<Finding> {
    let Some(key) = spec.placement.topology_key.as_deref() else { return Vec::new() };
    let mut domains: BTreeMap<&str, u64> = BTreeMap::new();
    for n in nodes {
        if let Some(value) = n.metadata.labels.as_ref().and_then(|l| l.get(key)) {
            *domains.entry(value).or_default() += gpus(n);
        }
    }
    let Some((largest, most)) = domains.iter().max_by_key(|(_, g)| **g) else {
        return vec![Finding::warning(
            "placement-no-domain",
            "spec.placement.topologyKey",
            format!("no node carries the label {key:?}, so no engine pod can be scheduled"),
            "label the nodes, or unset topologyKey",
        )];
    };
    let needed = |role: Role| spec.role(role).parallelism.gpus();
    let colocated = spec.placement.colocate == Colocation::Required;
    let mut out = Vec::new();
    for role in [Role::Prefill, Role::Decode].into_iter().filter(|r| spec.instances(*r) > 0) {
        let want = if colocated { needed(Role::Prefill).saturating_add(needed(Role::Decode)) } else { needed(role) };
        if want > *most {
            let what = if colocated { "a prefill and a decode instance together need" } else { "one instance needs" };
            out.push(Finding::error(
                "placement-domain-too-small",
                format!("spec.{}", role.as_str()),
                format!("{what} {want} GPUs within one {key} domain, but the largest ({key}={largest}) has {most}"),
                "a smaller layout, a larger domain, or another topologyKey",
            ));
        }
    }
    out
}

fn gpus(n: &Node) -> u64 {
    let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
    allocatable.and_then(|a| a.get(GPU_RESOURCE)).and_then(|q| q.0.parse().ok()).unwrap_or(0)
}

/// Whether `role`'s instances are scheduled as gangs: multi-node instances, where the spec and
/// the cluster allow.
fn gang(spec: &PDDeploymentSpec, opts: &RenderOptions, role: Role) -> bool {
    let wanted = match spec.placement.gang {
        GangMode::Auto => opts.workload_api,
        GangMode::Workload => true,
        GangMode::None => false,
    };
    wanted && spec.role(role).nodes_per_instance() > 1
}

/// The PodGroup of instance `i` of `role` in KV set `set`: `{name}-{role}-{i}`, like its pods'
/// prefix, and the set's suffix.
pub fn pod_group_name(name: &str, role: Role, instance: u32, set: u32) -> String {
    format!("{name}-{}-{instance}{}", role.as_str(), super::set_suffix(set))
}

/// One PodGroup per multi-node instance: none of its pods binds until all of them can.
pub(super) fn pod_groups(
    spec: &PDDeploymentSpec,
    name: &str,
    ns: &str,
    set: u32,
    owners: &Option<Vec<OwnerReference>>,
    opts: &RenderOptions,
) -> Vec<PodGroup> {
    let topology = spec.placement.topology_key.clone().map(|key| vec![TopologyConstraint { key }]);
    let mut out = Vec::new();
    for role in [Role::Prefill, Role::Decode].into_iter().filter(|r| gang(spec, opts, *r)) {
        let nodes = spec.role(role).nodes_per_instance();
        // Surge slots included: a rollout's extra instance must find its gang.
        for i in 0..spec.instance_slots(role) {
            out.push(PodGroup {
                metadata: meta(pod_group_name(name, role, i, set), ns, set_labels(name, role, set), owners),
                spec: PodGroupSpec {
                    scheduling_policy: PodGroupSchedulingPolicy {
                        gang: Some(GangSchedulingPolicy { min_count: i32::try_from(nodes).unwrap_or(i32::MAX) }),
                        ..Default::default()
                    },
                    scheduling_constraints: topology.clone().map(|topology| PodGroupSchedulingConstraints { topology: Some(topology) }),
                    ..Default::default()
                },
                status: None,
            });
        }
    }
    out
}

/// Sets an engine pod's gang and topology constraints, on top of the template's own affinity.
/// `at` is the pod's role, instance and KV set.
pub(super) fn place(spec: &PDDeploymentSpec, name: &str, at: (Role, u32, u32), opts: &RenderOptions, pod: &mut PodSpec) {
    let (role, instance, set) = at;
    let gang = gang(spec, opts, role);
    if gang {
        pod.scheduling_group = Some(PodSchedulingGroup { pod_group_name: Some(pod_group_name(name, role, instance, set)) });
    }
    let Some(key) = spec.placement.topology_key.as_deref() else { return };
    let mut terms = Vec::new();
    // A gang's PodGroup carries the instance's topology constraint; without one, pod affinity to
    // the instance's own pods does (the first pod of an instance may go anywhere).
    if !gang {
        terms.push(term(key, instance_pods(name, at)));
    }
    let engines = engine_pods(name);
    let affinity = pod.affinity.get_or_insert_with(Affinity::default).pod_affinity.get_or_insert_with(PodAffinity::default);
    match spec.placement.colocate {
        Colocation::Required => terms.push(term(key, engines)),
        Colocation::Preferred => affinity
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm { weight: 100, pod_affinity_term: term(key, engines) }),
        Colocation::None => {}
    }
    if !terms.is_empty() {
        affinity.required_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).extend(terms);
    }
}

fn term(key: &str, selector: LabelSelector) -> PodAffinityTerm {
    PodAffinityTerm { label_selector: Some(selector), topology_key: key.to_owned(), ..Default::default() }
}

fn instance_pods(name: &str, (role, instance, set): (Role, u32, u32)) -> LabelSelector {
    let mut labels = set_labels(name, role, set);
    labels.insert(LABEL_INSTANCE.into(), instance.to_string());
    LabelSelector { match_labels: Some(labels), ..Default::default() }
}

/// The labels of one role's objects in KV set `set`.
fn set_labels(name: &str, role: Role, set: u32) -> std::collections::BTreeMap<String, String> {
    let mut labels = common_labels(name, role.as_str());
    labels.insert(LABEL_KV_SET.into(), set.to_string());
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::Severity;

    fn spec(placement: serde_json::Value, tp: u32) -> PDDeploymentSpec {
        let role = serde_json::json!({"parallelism": {"tp": tp}});
        serde_json::from_value(serde_json::json!({"model": {"path": "m"}, "prefill": role, "decode": role, "placement": placement}))
            .unwrap()
    }

    fn node(rack: &str, gpus: u32) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"labels": {"rack": rack}},
            "status": {"allocatable": {GPU_RESOURCE: gpus.to_string()}}}))
        .unwrap()
    }

    #[test]
    fn an_instance_larger_than_every_domain_can_never_schedule() {
        let racks = [node("a", 8), node("a", 8), node("b", 8)];
        assert_eq!(judge(&spec(serde_json::json!({"topologyKey": "rack"}), 16), &racks), Vec::new());
        let v = judge(&spec(serde_json::json!({"topologyKey": "rack"}), 32), &racks);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|f| f.severity == Severity::Error && f.rule == "placement-domain-too-small"), "{v:?}");
        assert!(
            v[0].to_string()
                .starts_with("spec.prefill: one instance needs 32 GPUs within one rack domain, but the largest (rack=a) has 16 (fix: ")
        );
        // Required colocation needs a prefill and a decode instance in one domain.
        let v = judge(&spec(serde_json::json!({"topologyKey": "rack", "colocate": "required"}), 16), &racks);
        assert!(v.iter().all(|f| f.message.contains("a prefill and a decode instance together need 32 GPUs")), "{v:?}");
    }

    #[test]
    fn no_node_with_the_label_is_a_warning() {
        let v = judge(&spec(serde_json::json!({"topologyKey": "rack"}), 8), &[]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].severity, v[0].rule), (Severity::Warning, "placement-no-domain"));
        assert!(v[0].message.contains("no node carries the label \"rack\""), "{v:?}");
    }

    #[test]
    fn gangs_only_for_multi_node_instances_and_topology_without_a_gang_is_pod_affinity() {
        let mut s = spec(serde_json::json!({"topologyKey": "rack"}), 16);
        s.prefill.gpus_per_node = 8;
        s.decode.gpus_per_node = 16;
        let opts = RenderOptions { workload_api: true, ..RenderOptions::default() };
        let groups = pod_groups(&s, "m", "ns", 0, &None, &opts);
        assert_eq!(groups.iter().map(|g| g.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["m-prefill-0"]);
        assert_eq!(groups[0].spec.scheduling_policy.gang.as_ref().unwrap().min_count, 2);
        let mut pod = PodSpec::default();
        place(&s, "m", (Role::Prefill, 0, 0), &opts, &mut pod);
        assert_eq!(pod.scheduling_group.unwrap().pod_group_name.as_deref(), Some("m-prefill-0"));
        assert!(pod.affinity.is_none_or(|a| a.pod_affinity.unwrap().required_during_scheduling_ignored_during_execution.is_none()));
        // A single-node instance needs no gang; its topology term is pod affinity to its own pods.
        let mut pod = PodSpec::default();
        place(&s, "m", (Role::Decode, 0, 0), &opts, &mut pod);
        assert!(pod.scheduling_group.is_none());
        let required = pod.affinity.unwrap().pod_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap();
        assert_eq!(required[0].topology_key, "rack");
        // Without the API, `auto` renders no gang at all.
        assert!(pod_groups(&s, "m", "ns", 0, &None, &RenderOptions::default()).is_empty());
    }
}
